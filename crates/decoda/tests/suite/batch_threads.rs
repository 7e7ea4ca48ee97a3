//! Batch invariance across thread counts (CPU-specific: the thread pool is a CPU notion).

use decoda::testing::{random_case, Rng};
use decoda::{Backend, CpuSampler, Logits};

#[test]
fn same_tokens_with_one_or_many_threads() {
    let mut rng = Rng::new(8);
    let v = 3000;
    let cases: Vec<_> = (0..64).map(|_| random_case(&mut rng, v)).collect();
    let data: Vec<f32> = cases.iter().flat_map(|c| c.0.iter().copied()).collect();
    let reqs: Vec<_> = cases.iter().map(|c| c.1.clone()).collect();
    let l = Logits::f32(&data, cases.len(), v).unwrap();
    let one = CpuSampler::with_threads(1)
        .unwrap()
        .sample(&l, &reqs)
        .unwrap();
    for threads in [2, 3, 8] {
        let many = CpuSampler::with_threads(threads)
            .unwrap()
            .sample(&l, &reqs)
            .unwrap();
        assert_eq!(one, many, "{threads} threads");
    }
}
