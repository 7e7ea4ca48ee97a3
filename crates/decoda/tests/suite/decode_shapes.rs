//! The CPU samplers on real decode shapes through every generic entry point, against
//! the reference (the suite is `decoda::testing::shapes`; the wgpu backend runs it
//! in `wgpu_shapes.rs`).

use decoda::testing::full_tier;
use decoda::testing::shapes::{
    decode_shapes, decode_shapes_part, DECODE_BATCHES, DECODE_VOCABS, ENTRIES,
};
use decoda::{Backend, CpuSampler};

#[test]
fn cpu_decode_shapes() {
    let make = || -> Result<Box<dyn Backend>, String> { Ok(Box::new(CpuSampler::new())) };
    let t = decode_shapes(
        &make,
        DECODE_VOCABS,
        DECODE_BATCHES,
        ENTRIES,
        1,
        full_tier(),
        |_| {},
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("cpu: {t:?}");
    // about 2,600 results in the full tier, 800 in the quick one
    assert!(t.results > if full_tier() { 2000 } else { 600 }, "{t:?}");
}

#[test]
fn cpu_single_thread_decode_shapes() {
    let make = || -> Result<Box<dyn Backend>, String> {
        Ok(Box::new(
            CpuSampler::with_threads(1).map_err(|e| e.to_string())?,
        ))
    };
    let t = decode_shapes(
        &make,
        &[32000, 151936],
        &[1, 3, 64],
        ENTRIES,
        2,
        full_tier(),
        |_| {},
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("cpu (1 thread): {t:?}");
}

/// The suite in parts runs the whole suite's cases, each once: the cases the parts pass
/// (their labels) are the whole's, in both tiers; a part that does not exist is an
/// error.
#[test]
fn decode_shapes_parts_make_the_whole() {
    let make = || -> Result<Box<dyn Backend>, String> { Ok(Box::new(CpuSampler::new())) };
    let (vocabs, batches) = (&[40usize, 300, 1000, 2500][..], &[1usize, 2, 3, 5][..]);
    for full in [false, true] {
        let run = |parts: (usize, usize)| {
            let mut seen = Vec::new();
            decode_shapes_part(&make, vocabs, batches, ENTRIES, 5, full, parts, |c| {
                seen.push(c.to_string())
            })
            .unwrap_or_else(|e| panic!("{e}"));
            seen
        };
        let mut whole = run((0, 1));
        for of in [2, 3] {
            let mut parts: Vec<String> = (0..of).flat_map(|p| run((p, of))).collect();
            parts.sort();
            whole.sort();
            assert_eq!(parts, whole, "{of} parts, full {full}");
            // (each part is work: none empty here)
            assert!((0..of).all(|p| !run((p, of)).is_empty()));
        }
    }
    let err = decode_shapes_part(&make, vocabs, batches, ENTRIES, 5, false, (2, 2), |_| {});
    assert!(err.is_err_and(|e| e.contains("part 2 of 2")));
}

/// The CPU head's verify step (speculative decoding) is plain decoding: each slot's
/// tokens, accepted count and finish are the CPU sampler's coupled verification cut
/// where a step would stop it.
#[test]
fn cpu_head_verify_is_plain_decoding() {
    let mut head = decoda::CpuHead::new(4, 300).unwrap();
    decoda::testing::verify::head_verify_is_plain_decoding(&mut head)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The CPU head: 64 slots, 300 steps of joins, leaves, stops and long penalised
/// histories, each slot's tokens those of `CpuSampler` driven by hand.
#[test]
fn cpu_head_matches_driven_sequences() {
    let mut head = decoda::CpuHead::new(64, 3000).unwrap();
    let t = decoda::testing::head::head_matches_sequences(&mut head, 300, 4000, 99)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("cpu head: {t:?}");
    assert!(t.stops > 0 && t.lengths > 0 && t.leaves > 0, "{t:?}");
}
