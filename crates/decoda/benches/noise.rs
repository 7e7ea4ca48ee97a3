//! Criterion benchmarks of the noise: one row of V = 131072 on one thread — the Philox
//! words of the whole row (the least work a draw that needs every word can do), the same
//! with each word compared against a gate (the threshold that decides without a logarithm
//! which tokens need the exact noise), the exact noise of every token (both logarithms;
//! what a naive draw pays), and the `temp` configuration's whole draw — next to the
//! memory floor.
//!
//! `cargo bench -p decoda --bench noise` (`DECODA_ISA=avx2` or `baseline` for the lower
//! kernel variants).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use decoda::{philox, workload};

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
    g.bench_function("philox_and_gate", |b| {
        // every chunk's words against a gate that keeps about one word in 60,000
        let key = philox::seed_key(1);
        let gate = philox::gumbel_word_gate(11.0).expect("reachable");
        let mut words = [0u32; 128];
        b.iter(|| {
            let mut kept = 0u32;
            for c in 0..(vocab / 128) as u32 {
                kept += decoda::cpu::kernels::philox_x32_gated(c * 32, 0, key, gate, &mut words)
                    .count_ones();
            }
            kept
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
