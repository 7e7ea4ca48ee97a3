//! Criterion benchmarks of the fast CPU path, one row of V = 131072 per configuration,
//! next to the memory floor (one streaming max pass over the same row); pieces of it
//! alone (the top-p normaliser pass, with precise and with coarse terms; the greedy
//! max-and-index pass; the top-k gathering pass; the logprobs' rank; the penalties'
//! touched tokens); and batches of 64 rows on all threads.
//!
//! `cargo bench -p decoda --bench sample` (`DECODA_ISA=avx2` or `baseline` for the lower
//! kernel variants).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use decoda::cpu::kernels::{exp2_sum, exp2_sum_collect, Terms};
use decoda::testing::workload;
use decoda::{Backend, CpuSampler, Logits};

fn bench(c: &mut Criterion) {
    let vocab = 131_072;
    let x = workload::logits(1, vocab, 7);
    let mut g = c.benchmark_group("one_row_v131072");
    g.throughput(Throughput::Bytes((vocab * 4) as u64));
    g.bench_function("floor_max_pass", |b| {
        b.iter(|| decoda::cpu::kernels::max(std::hint::black_box(&x)))
    });
    for name in workload::CONFIGS {
        let req = workload::named_requests(name, 1, vocab)
            .expect("known config")
            .remove(0);
        g.bench_with_input(BenchmarkId::new("row", name), &req, |b, req| {
            b.iter(|| decoda::cpu::sample_row_f32(std::hint::black_box(&x), req))
        });
    }
    g.finish();

    let mut g = c.benchmark_group(format!("pieces_v131072_{}", decoda::cpu::kernels::isa()));
    g.throughput(Throughput::Bytes((vocab * 4) as u64));
    // topp09's pass: every token's exp((z - m) / T) summed while the tokens at or above
    // the 512th largest value are gathered (about as many as the sampler's estimate asks)
    let mut sorted = x.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let (m, thr) = (sorted[0], sorted[511]);
    let c1 = (std::f64::consts::LOG2_E / 0.8) as f32;
    let mut out = Vec::new();
    // `_coarse`: with the coarse terms that the pass makes with AVX2 and the baseline
    // kernels (the AVX-512 ones make their precise terms)
    for (name, terms) in [
        ("topp_normaliser", Terms::Precise),
        ("topp_normaliser_coarse", Terms::Coarse),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                exp2_sum_collect(
                    std::hint::black_box(&x),
                    (c1, -m * c1),
                    terms,
                    0,
                    thr,
                    &mut out,
                )
            })
        });
    }
    // the same terms summed with nothing gathered: what top-p without top-k cannot go
    // below while it takes one `exp` per token
    g.bench_function("topp_normaliser_sum_only", |b| {
        b.iter(|| exp2_sum(std::hint::black_box(&x), (c1, -m * c1), Terms::Precise))
    });
    // greedy's pass: the max and its first index
    g.bench_function("greedy_argmax", |b| {
        b.iter(|| decoda::cpu::kernels::argmax_nonfinite(std::hint::black_box(&x)))
    });
    // topk50's pass: the max and every value at or above the 512th largest
    g.bench_function("topk_gathering", |b| {
        b.iter(|| {
            out.clear();
            decoda::cpu::kernels::collect_ge_max(std::hint::black_box(&x), 0, thr, &mut out)
        })
    });
    // a logprobs request's rank of the drawn token: one counting pass over the row
    g.bench_function("logprobs_rank", |b| {
        b.iter(|| decoda::cpu::kernels::count_rank(std::hint::black_box(&x), x[777], 777))
    });
    // full's stages 1-3 bookkeeping: 128 prompt and 128 output tokens
    let params = workload::config("full").expect("known config");
    let req = workload::requests(&params, 1, vocab).remove(0);
    let mut touched = Vec::new();
    g.bench_function("penalty_touches", |b| {
        b.iter(|| {
            touched.clear();
            decoda::pipeline::touches_into(std::hint::black_box(&req), &mut touched);
            touched.len()
        })
    });
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
