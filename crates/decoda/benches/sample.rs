//! Criterion benchmarks of the fast CPU path, one row of V = 131072 per configuration,
//! next to the memory floor (one streaming max pass over the same row).
//!
//! `cargo bench -p decoda --bench sample`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use decoda::{workload, Backend, CpuSampler, Logits};

fn bench(c: &mut Criterion) {
    let vocab = 131_072;
    let x = workload::logits(1, vocab, 7);
    let mut g = c.benchmark_group("one_row_v131072");
    g.throughput(Throughput::Bytes((vocab * 4) as u64));
    g.bench_function("floor_max_pass", |b| {
        b.iter(|| decoda::cpu::kernels::max(std::hint::black_box(&x)))
    });
    for name in workload::CONFIGS {
        let params = workload::config(name).expect("known config");
        let req = workload::requests(&params, 1, vocab).remove(0);
        g.bench_with_input(BenchmarkId::new("row", name), &req, |b, req| {
            b.iter(|| decoda::cpu::sample_row_f32(std::hint::black_box(&x), req))
        });
    }
    g.finish();

    let rows = 64;
    let data = workload::logits(rows, vocab, 8);
    let logits = Logits::f32(&data, rows, vocab).expect("shape");
    let sampler = CpuSampler::new();
    let mut g = c.benchmark_group("batch64_v131072_all_threads");
    g.throughput(Throughput::Bytes((rows * vocab * 4) as u64));
    for name in ["topk50_topp09", "full"] {
        let params = workload::config(name).expect("known config");
        let reqs = workload::requests(&params, rows, vocab);
        g.bench_function(name, |b| {
            b.iter(|| sampler.sample(&logits, &reqs).expect("valid"))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = bench
}
criterion_main!(benches);
