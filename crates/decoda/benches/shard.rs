//! Criterion benchmarks of vocabulary-sharded sampling on the host: what one rank of two
//! computes for a call (its rounds over its half of V = 151,936, Qwen's vocabulary, and
//! the merges, the other rank's summaries given) next to what one process computes after
//! gathering the rows whole (`CpuSampler::sample` over V); B = 1 and 64, the `greedy`,
//! `temp`, `topk50` and `minp01` configurations of `decoda bench`, and `temp` with five
//! log-probabilities. The exchanges themselves are not timed (see `scripts/
//! bench_distributed.py` for calls over MPI).
//!
//! `cargo bench -p decoda --bench shard`

use criterion::{criterion_group, criterion_main, Criterion};
use decoda::shard::{decide, finish, plan, round1, round2, round3, ShardRows};
use decoda::testing::workload;
use decoda::{Backend, CpuSampler, Logits, Request};

const VOCAB: usize = 151_936;
const HALF: usize = VOCAB / 2;

fn bench(c: &mut Criterion) {
    let s = CpuSampler::new();
    for config in ["greedy", "temp", "topk50", "minp01", "temp_lp5"] {
        let mut params = workload::config(config.trim_end_matches("_lp5")).expect("known config");
        if config.ends_with("_lp5") {
            params.logprobs = Some(5);
        }
        for b in [1usize, 64] {
            let x = workload::logits(b, VOCAB, 11);
            let reqs: Vec<Request> = workload::requests(&params, b, VOCAB);
            let cols = |o: usize| -> Vec<f32> {
                (0..b)
                    .flat_map(|r| x[r * VOCAB + o..][..HALF].iter().copied())
                    .collect()
            };
            let (mine, theirs) = (cols(0), cols(HALF));
            let me = ShardRows {
                logits: &mine,
                width: HALF,
                offset: 0,
            };
            let other = ShardRows {
                logits: &theirs,
                width: HALF,
                offset: HALF,
            };
            // the other rank's summaries, as an all-gather would bring them
            let o1 = round1(&other, VOCAB, &reqs).unwrap();
            let plans = plan(
                &[round1(&me, VOCAB, &reqs).unwrap(), o1.clone()],
                VOCAB,
                &reqs,
            )
            .unwrap();
            let o2 = round2(&other, VOCAB, &reqs, &plans).unwrap();
            let dec = decide(
                &[round2(&me, VOCAB, &reqs, &plans).unwrap(), o2.clone()],
                &plans,
                &reqs,
            );
            let o3 = round3(&other, VOCAB, &reqs, &plans, &dec).unwrap();
            let lp = reqs.iter().any(|q| q.params.logprobs.is_some());
            let all = Logits::f32(&x, b, VOCAB).unwrap();
            let mut g = c.benchmark_group(format!("shard_{config}_b{b}_v{VOCAB}"));
            g.sample_size(10);
            g.bench_function("one_rank_of_2", |bn| {
                bn.iter(|| {
                    let r1 = vec![round1(&me, VOCAB, &reqs).unwrap(), o1.clone()];
                    let plans = plan(&r1, VOCAB, &reqs).unwrap();
                    let r2 = vec![round2(&me, VOCAB, &reqs, &plans).unwrap(), o2.clone()];
                    let dec = decide(&r2, &plans, &reqs);
                    let r3 = if lp {
                        vec![round3(&me, VOCAB, &reqs, &plans, &dec).unwrap(), o3.clone()]
                    } else {
                        vec![vec![0; b]]
                    };
                    finish(&r1, &r3, &plans, &dec, &reqs)
                })
            });
            g.bench_function("unsharded", |bn| bn.iter(|| s.sample(&all, &reqs).unwrap()));
            g.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
