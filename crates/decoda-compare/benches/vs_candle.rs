//! decoda's fast CPU path against candle-transformers' `LogitsProcessor` on the same
//! logits, one row of V = 131072 (Zipf-like, as in `decoda bench`), top-p 0.9 at T = 0.8.
//!
//! Not built by `cargo test`; run it with:
//! `cargo bench -p decoda-compare --bench vs_candle`

use candle_core::{Device, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling};
use criterion::{criterion_group, criterion_main, Criterion};
use decoda::testing::workload;

fn bench(c: &mut Criterion) {
    let vocab = 131_072;
    let x = workload::logits(1, vocab, 7);
    let tensor = Tensor::from_vec(x.clone(), vocab, &Device::Cpu).expect("tensor");
    let mut g = c.benchmark_group("topp09_v131072");
    g.bench_function("candle_logits_processor", |b| {
        let mut lp = LogitsProcessor::from_sampling(
            42,
            Sampling::TopP {
                p: 0.9,
                temperature: 0.8,
            },
        );
        b.iter(|| lp.sample(&tensor).expect("candle sample"))
    });
    let params = workload::config("topp09").expect("config");
    let req = workload::requests(&params, 1, vocab).remove(0);
    g.bench_function("decoda_cpu", |b| {
        b.iter(|| decoda::cpu::sample_row_f32(&x, &req).expect("row"))
    });
    g.finish();

    let mut g = c.benchmark_group("topk50_topp09_v131072");
    g.bench_function("candle_logits_processor", |b| {
        let mut lp = LogitsProcessor::from_sampling(
            42,
            Sampling::TopKThenTopP {
                k: 50,
                p: 0.9,
                temperature: 0.8,
            },
        );
        b.iter(|| lp.sample(&tensor).expect("candle sample"))
    });
    let params = workload::config("topk50_topp09").expect("config");
    let req = workload::requests(&params, 1, vocab).remove(0);
    g.bench_function("decoda_cpu", |b| {
        b.iter(|| decoda::cpu::sample_row_f32(&x, &req).expect("row"))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
