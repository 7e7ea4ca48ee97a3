//! The CPU samplers on real decode shapes through every generic entry point, against
//! the reference (the suite is `decoda::conformance::shapes`; the wgpu backend runs it
//! in `wgpu_shapes.rs`).

use decoda::conformance::shapes::{decode_shapes, DECODE_BATCHES, DECODE_VOCABS, ENTRIES};
use decoda::{Backend, CpuSampler};

#[test]
fn cpu_decode_shapes() {
    let make = || -> Result<Box<dyn Backend>, String> { Ok(Box::new(CpuSampler::new())) };
    let t = decode_shapes(&make, DECODE_VOCABS, DECODE_BATCHES, ENTRIES, 1, |_| {})
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("cpu: {t:?}");
    assert!(t.results > 1000);
}

#[test]
fn cpu_single_thread_decode_shapes() {
    let make = || -> Result<Box<dyn Backend>, String> {
        Ok(Box::new(
            CpuSampler::with_threads(1).map_err(|e| e.to_string())?,
        ))
    };
    let t = decode_shapes(&make, &[32000, 151936], &[1, 3, 64], ENTRIES, 2, |_| {})
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("cpu (1 thread): {t:?}");
}
