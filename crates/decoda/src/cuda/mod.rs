//! CUDA backend.
