//! The CPU sampler's tuning constants (results never depend on them).

/// Size of the samples that estimate gathering thresholds.
pub(super) const SAMPLE: usize = 1024;

/// Block size of the streaming passes (fits in L1 with room to spare).
pub(super) const BLOCK: usize = 4096;
