//! Comparison benchmarks live in `benches/`.
