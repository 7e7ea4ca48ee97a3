//! Criterion benchmarks of speculative decoding's coupled verification on the CPU
//! sampler: one `verify_coupled` call over B rows of K = 4 drafted tokens (B (K + 1)
//! positions of V = 151,936, Qwen's vocabulary) next to the K + 1 plain calls of B rows
//! that decoding the same tokens one step at a time makes; B = 1 and 64, the `temp` and
//! `topk50_topp09` configurations of `decoda bench`.
//!
//! `cargo bench -p decoda --bench verify`

use criterion::{criterion_group, criterion_main, Criterion};
use decoda::testing::workload;
use decoda::{Backend, CpuSampler, DraftRow, Logits, Request};

const VOCAB: usize = 151_936;
const K: usize = 4;

/// The rows' requests at position `i`: `i` steps on, each history extended by `hist`.
fn at_position(reqs: &[Request], hist: &[Vec<u32>], i: usize) -> Vec<Request> {
    reqs.iter()
        .zip(hist)
        .map(|(q, h)| {
            let mut q = q.clone();
            q.state.step += i as u64;
            q.state.output.extend_from_slice(h);
            q
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let s = CpuSampler::new();
    for config in ["temp", "topk50_topp09"] {
        let params = workload::config(config).expect("known config");
        for b in [1usize, 64] {
            let x = workload::logits(b * (K + 1), VOCAB, 11);
            let reqs: Vec<Request> = workload::requests(&params, b, VOCAB);
            // plain decoding's tokens as the drafts: every one accepted, so verification
            // does all its work and gives what the K + 1 plain calls give
            let mut plain: Vec<Vec<u32>> = vec![Vec::new(); b];
            let mut steps: Vec<Vec<f32>> = Vec::new();
            for i in 0..=K {
                let rows: Vec<f32> = (0..b)
                    .flat_map(|r| x[(r * (K + 1) + i) * VOCAB..][..VOCAB].iter().copied())
                    .collect();
                let at = at_position(&reqs, &plain, i);
                let l = Logits::f32(&rows, b, VOCAB).unwrap();
                for (r, res) in s.sample(&l, &at).unwrap().into_iter().enumerate() {
                    plain[r].push(res.unwrap().token);
                }
                steps.push(rows);
            }
            let drafts: Vec<DraftRow> = reqs
                .iter()
                .zip(&plain)
                .map(|(q, p)| DraftRow::new(q.clone(), p[..K].to_vec()))
                .collect();
            let all = Logits::f32(&x, b * (K + 1), VOCAB).unwrap();
            let mut g = c.benchmark_group(format!("verify_{config}_b{b}_k{K}_v{VOCAB}"));
            g.sample_size(10);
            g.bench_function("verify_coupled", |bn| {
                bn.iter(|| decoda::verify_coupled(&s, &all, &drafts).unwrap())
            });
            g.bench_function("plain_k_plus_1_calls", |bn| {
                bn.iter(|| {
                    let mut hist: Vec<Vec<u32>> = vec![Vec::new(); b];
                    for (i, rows) in steps.iter().enumerate() {
                        let at = at_position(&reqs, &hist, i);
                        let l = Logits::f32(rows, b, VOCAB).unwrap();
                        for (r, res) in s.sample(&l, &at).unwrap().into_iter().enumerate() {
                            hist[r].push(res.unwrap().token);
                        }
                    }
                    hist
                })
            });
            g.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
