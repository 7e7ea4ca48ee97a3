//! Criterion benchmarks of MoE dispatch: the default `moe-bench` shape (E = 128, k = 8,
//! D = 1024, H = 384, bf16 weights) with the sort forced on and off, at N = 1 (decode) and
//! N = 512 (prefill).
//!
//! `cargo bench -p decoda --bench moe`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use decoda::moe::{Dispatch, MoeShape, WeightDtype};
use decoda::testing::synthetic;

fn bench(c: &mut Criterion) {
    let shape = MoeShape::QWEN3_30B_A3B_HALF;
    let layer = synthetic::layer(shape, WeightDtype::Bf16, true, 1, 11).expect("layer");
    let mut g = c.benchmark_group("moe_e128_k8_d1024_h384_bf16");
    g.sample_size(10);
    for tokens in [1usize, 512] {
        let (x, routing) = synthetic::inputs(shape, tokens, tokens as u64).expect("inputs");
        for (name, d) in [
            ("sorted", Dispatch::Sorted),
            ("unsorted", Dispatch::Unsorted),
        ] {
            g.bench_with_input(BenchmarkId::new(name, tokens), &tokens, |b, _| {
                b.iter(|| layer.forward_with(&x, &routing, d).expect("valid"))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
