//! Criterion benchmarks of the noise: one row of V = 131072 on one thread — the Philox
//! words of the whole row (the least work a draw that needs every word can do), the
//! draw's gated pass over the row against a fixed leader (chunk tests, words, the
//! per-token test that decides without a logarithm which tokens need the exact noise),
//! the exact noise of every token (both logarithms; what a naive draw pays), and the
//! `temp` configuration's whole draw — next to the memory floor.
//!
//! `cargo bench -p decoda --bench noise` (`DECODA_ISA=avx2` or `baseline` for the lower
//! kernel variants).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use decoda::philox;
use decoda::testing::workload;

fn bench(c: &mut Criterion) {
    let vocab = 131_072;
    let x = workload::logits(1, vocab, 7);
    let mut g = c.benchmark_group(format!("noise_v131072_{}", decoda::cpu::kernels::isa()));
    g.throughput(Throughput::Elements(vocab as u64));
    g.bench_function("floor_max_pass", |b| {
        b.iter(|| decoda::cpu::kernels::max(std::hint::black_box(&x)))
    });
    g.bench_function("philox_words", |b| {
        b.iter(|| decoda::cpu::philox_row_words(std::hint::black_box(vocab), 1, 0))
    });
    g.bench_function("gated_row_fixed_leader", |b| {
        // the draw's pass over the row (chunk tests, words, per-token tests) against a
        // leader that stays put: at temperature 0.8, 2 above the row's largest `y`
        let key = philox::seed_key(1);
        let t = 0.8f32;
        let leader = decoda::cpu::kernels::max(&x) / t + 2.0;
        let consts = philox::gumbel_reach_consts(t, leader);
        b.iter(|| {
            let mut kept = 0u32;
            let row = decoda::cpu::kernels::gated_chunks(
                std::hint::black_box(&x),
                0,
                key,
                || consts,
                |_, m, _| kept += m.count_ones(),
            );
            (row, kept)
        })
    });
    g.bench_function("exact_noise_every_token", |b| {
        b.iter(|| {
            (0..vocab as u32)
                .map(|i| philox::gumbel(1, 0, i))
                .fold(f32::NEG_INFINITY, f32::max)
        })
    });
    let params = workload::config("temp").expect("known config");
    let req = workload::requests(&params, 1, vocab).remove(0);
    g.bench_function("temp_draw", |b| {
        b.iter(|| decoda::cpu::sample_row_f32(std::hint::black_box(&x), &req))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = bench
}
criterion_main!(benches);
