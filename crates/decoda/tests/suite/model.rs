//! The model suite (`decoda::testing::model`) on the CPU and, on any wgpu adapter
//! (lavapipe in CI), on the device: greedy ids equal mlx-lm's for 64 tokens and raw
//! logits within 1e-4 of the row's scale on f32 checkpoints of three shapes, greedy ids
//! equal on the checkpoints MLX quantized (4-bit groups of 32 and 64, 8-bit), the same
//! ids whether MoE calls sort or not, batch- and thread-count-invariant seeded sampling,
//! stops and lengths.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use decoda::model::{Engine, Qwen3Moe};
use decoda::testing::model::{
    batch_invariant, matches_golden, sort_cutoff_does_not_change_ids, stops_and_lengths,
    tiny_model, Golden,
};
use decoda::testing::tiny::TinySpec;
use decoda::CpuEngine;

const TOLERANCE: f64 = 1e-4;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The `decoda tiny-model` flags of a golden case as a spec.
fn spec_of(flags: &[String]) -> TinySpec {
    let mut s = TinySpec::default();
    let mut i = 0;
    while i < flags.len() {
        let f = flags[i].as_str();
        let val = || flags.get(i + 1).cloned().unwrap_or_default();
        let num = || val().parse::<usize>().expect("a number");
        let mut takes = true;
        match f {
            "--seed" => s.seed = num() as u64,
            "--hidden" => s.hidden = num(),
            "--layers" => s.layers = num(),
            "--heads" => s.heads = num(),
            "--kv-heads" => s.kv_heads = num(),
            "--head-dim" => s.head_dim = num(),
            "--experts" => s.experts = num(),
            "--top-k" => s.top_k = num(),
            "--moe-intermediate" => s.moe_intermediate = num(),
            "--intermediate" => s.intermediate = num(),
            "--vocab" => s.vocab = num(),
            "--shards" => s.shards = num(),
            "--dense-layers" => {
                s.dense_layers = val()
                    .split(',')
                    .filter(|t| !t.is_empty())
                    .map(|t| t.parse().expect("index"))
                    .collect()
            }
            "--tie" => (s.tie, takes) = (true, false),
            "--no-norm-topk" => (s.norm_topk, takes) = (false, false),
            "--mlx-layout" => (s.mlx_layout, takes) = (true, false),
            other => panic!("golden flag {other} unknown to this test"),
        }
        i += if takes { 2 } else { 1 };
    }
    s
}

fn goldens(tmp: &Path) -> Vec<Golden> {
    let text = std::fs::read_to_string(golden_dir().join("qwen3_moe.json")).expect("golden file");
    let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let ids =
        |x: &serde_json::Value| -> Vec<u32> { serde_json::from_value(x.clone()).expect("ids") };
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let name = c["name"].as_str().expect("name").to_string();
            let dir = match c.get("flags") {
                Some(f) => {
                    let flags: Vec<String> = serde_json::from_value(f.clone()).expect("flags");
                    let d = tmp.join(&name);
                    spec_of(&flags).write(&d).expect("write the checkpoint");
                    d
                }
                None => golden_dir().join(c["dir"].as_str().expect("dir")),
            };
            Golden {
                name,
                dir,
                prompt: ids(&c["prompt"]),
                ids: ids(&c["ids"]),
                logit_steps: serde_json::from_value(c["logit_steps"].clone()).expect("steps"),
                logits: serde_json::from_value(c["logits"].clone()).expect("logits"),
            }
        })
        .collect()
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("decoda-model-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn cpu(model: Arc<Qwen3Moe>, slots: usize, _positions: usize) -> Result<Box<dyn Engine>, String> {
    Ok(Box::new(
        CpuEngine::new(model, slots).map_err(|e| e.to_string())?,
    ))
}

fn golden_suite(
    make: &dyn Fn(Arc<Qwen3Moe>, usize, usize) -> Result<Box<dyn Engine>, String>,
    tag: &str,
    max_steps: usize,
) {
    golden_cases(make, tag, max_steps, &[]);
}

/// [`golden_suite`] over the goldens named in `only` (all when empty).
fn golden_cases(
    make: &dyn Fn(Arc<Qwen3Moe>, usize, usize) -> Result<Box<dyn Engine>, String>,
    tag: &str,
    max_steps: usize,
    only: &[&str],
) {
    let t = tmp(tag);
    let cases = goldens(&t);
    assert!(
        cases.len() >= 6,
        "three f32 shapes and three quantized checkpoints"
    );
    for (i, g) in cases.iter().enumerate() {
        if !only.is_empty() && !only.contains(&g.name.as_str()) {
            continue;
        }
        // every MoE call sorted, or none: both for every checkpoint in the full tier,
        // alternating over the checkpoints in the quick one
        let both = [1, usize::MAX];
        let cutoffs = if decoda::testing::full_tier() {
            &both[..]
        } else {
            &both[i % 2..i % 2 + 1]
        };
        for &cutoff in cutoffs {
            let worst = matches_golden(make, g, cutoff, TOLERANCE, max_steps)
                .unwrap_or_else(|e| panic!("{e}"));
            eprintln!(
                "{tag} {} (sort cutoff {cutoff}): ids equal; logits within {worst:.2e}",
                g.name
            );
        }
    }
    let _ = std::fs::remove_dir_all(t);
}

#[test]
fn cpu_matches_mlx() {
    golden_suite(&cpu, "cpu", usize::MAX);
}

#[test]
fn cpu_sort_cutoff_does_not_change_ids() {
    let t = tmp("cpu-cutoff");
    sort_cutoff_does_not_change_ids(&cpu, &tiny_model(&t, 5).unwrap())
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn cpu_batch_and_thread_invariant() {
    let t = tmp("cpu-batch");
    let dir = tiny_model(&t, 6).unwrap();
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| batch_invariant(&cpu, &dir))
            .unwrap_or_else(|e| panic!("{threads} threads: {e}"));
    }
    // and the same ids whatever the pool: one run per thread count, compared
    let model = Arc::new(Qwen3Moe::load(&dir, 16).unwrap());
    let seq = decoda::model::Sequence {
        prompt: vec![256, 50, 60],
        request: decoda::head::SlotRequest::new(decoda::SamplingParams {
            temperature: 1.0,
            ..Default::default()
        })
        .seed(99)
        .max_tokens(16),
    };
    let per: Vec<Vec<u32>> = [1, 2, 4]
        .iter()
        .map(|&n| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap();
            pool.install(|| {
                let mut e = CpuEngine::new(model.clone(), 1).unwrap();
                decoda::model::generate(&mut e, std::slice::from_ref(&seq), &mut |_| {})
                    .unwrap()
                    .outputs[0]
                    .tokens
                    .clone()
            })
        })
        .collect();
    assert!(per.iter().all(|p| p == &per[0]), "{per:?}");
}

#[test]
fn cpu_stops_and_lengths() {
    let t = tmp("cpu-stops");
    stops_and_lengths(&cpu, &tiny_model(&t, 7).unwrap()).unwrap_or_else(|e| panic!("{e}"));
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use super::*;
    use decoda::wgpu::{WgpuEngine, WgpuSampler};

    /// Whether a wgpu adapter is there (lavapipe in CI); without one the tests say so
    /// and pass, unless `DECODA_REQUIRE_GPU=1`.
    fn available() -> bool {
        decoda::testing::gpu::device().is_some()
    }

    /// A fresh sampler on the calling thread's shared test device
    /// (`decoda::testing::gpu`): its engines share the device's compiled pipelines.
    fn sampler() -> WgpuSampler {
        decoda::testing::gpu::sampler().expect("checked by available()")
    }

    /// An engine on `s` (its head on the device, or `host`).
    fn engine_on(
        s: &WgpuSampler,
        model: Arc<Qwen3Moe>,
        slots: usize,
        positions: usize,
        host: Option<Box<dyn decoda::head::Head + Send>>,
    ) -> Result<Box<dyn Engine>, String> {
        WgpuEngine::new(s, model, slots, positions, host)
            .map(|e| Box::new(e) as Box<dyn Engine>)
            .map_err(|e| e.to_string())
    }

    /// An engine on the shared test device.
    fn dev(
        model: Arc<Qwen3Moe>,
        slots: usize,
        positions: usize,
    ) -> Result<Box<dyn Engine>, String> {
        thread_local!(static S: WgpuSampler = sampler());
        S.with(|s| engine_on(s, model, slots, positions, None))
    }

    /// An engine on the shared test device that samples on the host.
    fn dev_host_sampling(
        model: Arc<Qwen3Moe>,
        slots: usize,
        positions: usize,
    ) -> Result<Box<dyn Engine>, String> {
        thread_local!(static S: WgpuSampler = sampler());
        let v = model.config.vocab_size;
        let host = decoda::CpuHead::new(slots, v).map_err(|e| e.to_string())?;
        S.with(|s| engine_on(s, model, slots, positions, Some(Box::new(host))))
    }

    /// The device model as speculative decoding's forward (128 positions a slot), on
    /// `s`.
    fn forward_on(
        s: &WgpuSampler,
        model: Arc<Qwen3Moe>,
        slots: usize,
    ) -> Result<Box<dyn decoda::model::Forward>, String> {
        decoda::wgpu::WgpuModel::new(s, model, slots, 128)
            .map(|m| Box::new(m) as Box<dyn decoda::model::Forward>)
            .map_err(|e| e.to_string())
    }

    /// [`forward_on`] the shared test device.
    fn dev_forward(
        model: Arc<Qwen3Moe>,
        slots: usize,
    ) -> Result<Box<dyn decoda::model::Forward>, String> {
        thread_local!(static S: WgpuSampler = sampler());
        S.with(|s| forward_on(s, model, slots))
    }

    /// The suite's position invariance (`testing::speculate`) on the device: five and
    /// three positions of two slots in one call give the one-position calls' bits (f32;
    /// bf16 and q4g64 in the full tier: the device's products are one order per output
    /// whatever the format, which `wgpu_matches_mlx` checks at B = 1, 9 and 33).
    #[test]
    fn wgpu_verification_forward_is_position_invariant() {
        if !available() {
            return;
        }
        let t = tmp("wgpu-invariant");
        let every = decoda::testing::full_tier();
        decoda::testing::speculate::forward_is_position_invariant(&dev_forward, &t, every)
            .unwrap_or_else(|e| panic!("{e}"));
        let _ = std::fs::remove_dir_all(t);
    }

    /// Speculative decoding on the device model (host sampling of its logits) gives the
    /// tokens of plain decoding on the device engine (its head sampling on the device).
    #[test]
    fn wgpu_speculative_is_plain_decoding() {
        if !available() {
            return;
        }
        let t = tmp("wgpu-speculative");
        let head = |slots: usize, vocab: usize| -> Result<Box<dyn decoda::head::Head>, String> {
            Ok(Box::new(
                decoda::CpuHead::new(slots, vocab).map_err(|e| e.to_string())?,
            ))
        };
        decoda::testing::speculate::speculative_is_plain(
            &dev_forward,
            &head,
            &dev,
            &decoda::CpuSampler::new(),
            // the quick tier one K and the close draft (lavapipe's calls cost
            // milliseconds each); the CPU's test runs K = 1, 3 and 5 and both drafts
            if decoda::testing::full_tier() {
                &[1, 3, 5]
            } else {
                &[3]
            },
            decoda::testing::full_tier(),
            &t,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let _ = std::fs::remove_dir_all(t);
    }

    /// A greedy request of `max` tokens.
    fn greedy(max: u64, seed: u64) -> decoda::head::SlotRequest {
        decoda::head::SlotRequest::new(decoda::SamplingParams {
            temperature: 0.0,
            ..Default::default()
        })
        .max_tokens(max)
        .seed(seed)
    }

    /// The tiny model (seed 7) generating `steps` greedy tokens after `prompt` on a
    /// profiling engine: the model, the engine and its profile.
    /// The bytes a profile's model dispatches plan to read (not the sampler's).
    fn model_bytes_read(p: &decoda::profile::StepProfile) -> u64 {
        p.dispatches
            .iter()
            .filter(|d| !d.launch.kernel.starts_with("sample."))
            .map(|d| d.launch.bytes_read)
            .sum()
    }

    /// The tiny checkpoint with a 9,000-token vocabulary (its LM head runs `mv_wide`).
    fn wide_vocab(t: &Path) -> PathBuf {
        let dir = t.join("wide-vocab");
        TinySpec {
            vocab: 9000,
            seed: 8,
            ..TinySpec::default()
        }
        .write(&dir)
        .unwrap();
        dir
    }

    fn profiled(
        tag: &str,
        prompt: &[u32],
        steps: usize,
    ) -> (Arc<Qwen3Moe>, Box<dyn Engine>, decoda::profile::StepProfile) {
        let t = tmp(tag);
        let model = Arc::new(Qwen3Moe::load(&tiny_model(&t, 7).unwrap(), 16).unwrap());
        let mut e = dev(Arc::clone(&model), 1, prompt.len() + steps).unwrap();
        assert!(e.set_profile(true));
        let seq = decoda::model::Sequence {
            prompt: prompt.to_vec(),
            request: greedy(steps as u64, 3),
        };
        let r = decoda::model::generate(e.as_mut(), &[seq], &mut |_| {}).unwrap();
        assert_eq!(r.outputs[0].tokens.len(), steps);
        let p = e.profile();
        assert_eq!(p.steps, steps);
        (model, e, p)
    }

    #[test]
    fn wgpu_matches_mlx() {
        if !available() {
            return;
        }
        // the device: all 64 tokens in the full tier, the first 33 (and the logits of
        // steps 0-32) in the quick one
        let steps = if decoda::testing::full_tier() {
            usize::MAX
        } else {
            33
        };
        golden_suite(&dev, "wgpu", steps);
    }

    /// Weights in parts as small as the model allows (the smallest power of two that
    /// holds one expert), as a real checkpoint's are on adapters that bind less than its
    /// matrices (lavapipe binds 128 MiB; Qwen3-30B-A3B's LM head is 194 MB at 4 bits):
    /// the embedding and LM head by rows of the vocabulary, the dense MLPs by rows, the
    /// MoE layers by whole experts, each part a dispatch of its own. The ids stay the
    /// committed mlx-lm ones.
    #[test]
    fn wgpu_weights_in_parts_match_mlx() {
        if !available() {
            return;
        }
        fn parts(
            model: Arc<Qwen3Moe>,
            slots: usize,
            positions: usize,
        ) -> Result<Box<dyn Engine>, String> {
            // the shared test device, through a handle with its own part size
            let d = decoda::testing::gpu::device().ok_or("no adapter")?;
            let mut bytes = 4096u64;
            loop {
                let parts = d.with_weight_part_bytes(bytes);
                match WgpuEngine::new(&parts, model.clone(), slots, positions, None) {
                    Ok(e) => return Ok(Box::new(e) as Box<dyn Engine>),
                    Err(e) if e.to_string().contains("binds at most") && bytes < 1 << 30 => {
                        bytes *= 2
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
        // the quick tier: f32 (default: an MoE layer in parts of experts, a dense layer
        // in row parts), 4-bit affine rows and experts (mlx_q4g64), the embedding and
        // LM head of a 1,000-token vocabulary in row parts (mqa_sharded); the full tier:
        // every golden
        if decoda::testing::full_tier() {
            golden_suite(&parts, "wgpu-parts", 33);
        } else {
            golden_cases(
                &parts,
                "wgpu-parts",
                6,
                &["default", "mlx_q4g64", "mqa_sharded"],
            );
        }
    }

    #[test]
    fn wgpu_sort_cutoff_does_not_change_ids() {
        if !available() {
            return;
        }
        let t = tmp("wgpu-cutoff");
        sort_cutoff_does_not_change_ids(&dev, &tiny_model(&t, 5).unwrap())
            .unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn wgpu_batch_invariant() {
        if !available() {
            return;
        }
        let t = tmp("wgpu-batch");
        batch_invariant(&dev, &tiny_model(&t, 6).unwrap()).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn wgpu_stops_and_lengths() {
        if !available() {
            return;
        }
        let t = tmp("wgpu-stops");
        stops_and_lengths(&dev, &tiny_model(&t, 7).unwrap()).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Sampling on the host from logits copied back draws what the device's head draws.
    #[test]
    fn wgpu_sampling_on_the_host_agrees() {
        if !available() {
            return;
        }
        let t = tmp("wgpu-host");
        let dir = tiny_model(&t, 8).unwrap();
        // batches through the host head (the full tier; the device head's batches are
        // wgpu_batch_invariant's)
        if decoda::testing::full_tier() {
            batch_invariant(&dev_host_sampling, &dir).unwrap_or_else(|e| panic!("{e}"));
        }
        let model = Arc::new(Qwen3Moe::load(&dir, 16).unwrap());
        let seq = decoda::model::Sequence {
            prompt: vec![256, 50, 60, 70],
            request: decoda::head::SlotRequest::new(decoda::SamplingParams {
                temperature: 0.8,
                top_k: 40,
                ..Default::default()
            })
            .seed(5)
            .max_tokens(24),
        };
        let mut a = dev(Arc::clone(&model), 1, 40).unwrap();
        let mut b = dev_host_sampling(model, 1, 40).unwrap();
        let ra =
            decoda::model::generate(a.as_mut(), std::slice::from_ref(&seq), &mut |_| {}).unwrap();
        let rb =
            decoda::model::generate(b.as_mut(), std::slice::from_ref(&seq), &mut |_| {}).unwrap();
        assert_eq!(ra.outputs[0].tokens, rb.outputs[0].tokens);
    }

    /// CPU and device draw the same greedy ids on every golden checkpoint, and their
    /// logits agree to 1e-5 of the row's scale.
    #[test]
    fn wgpu_matches_cpu() {
        if !available() {
            return;
        }
        let t = tmp("wgpu-cpu");
        for g in goldens(&t) {
            let model = Arc::new(Qwen3Moe::load(&g.dir, 16).unwrap());
            let mut c = cpu(Arc::clone(&model), 1, 0).unwrap();
            let mut d = dev(model, 1, g.prompt.len() + 1).unwrap();
            let req = decoda::head::SlotRequest::new(decoda::SamplingParams {
                temperature: 0.0,
                ..Default::default()
            })
            .max_tokens(1)
            .seed(0);
            c.start(0, req.clone(), &g.prompt, 0).unwrap();
            d.start(0, req, &g.prompt, 0).unwrap();
            let (lc, ld) = (c.read_logits(1).unwrap(), d.read_logits(1).unwrap());
            let gap = decoda::testing::model::relative_gap(&ld, &lc);
            assert!(gap < 1e-5, "{}: device vs CPU logits {gap:.2e}", g.name);
        }
    }

    /// `generate --profile`'s engine side: every dispatch of every decode step, each
    /// timed (lavapipe has timestamps) beside its plan, and the plan of the linear
    /// layers at B = 1 exact: each weight once, with its input (and, where it adds to
    /// its output, that output) once.
    #[test]
    fn profile_times_every_dispatch_beside_its_plan() {
        if !available() {
            return;
        }
        let steps = 4;
        let (model, _, p) = profiled("wgpu-profile", &[256, 72, 101], steps);
        let timed = decoda::testing::gpu::device().unwrap().has_timestamps();
        for d in &p.dispatches {
            assert!(d.launch.workgroups > 0, "{d:?}");
            assert_eq!(d.device_ns.is_some(), timed, "{d:?}");
        }
        // the kernels every step runs: the sampler's, the model's and the MoE layers'
        let lines = p.by_kernel();
        for k in [
            "sample.scan",
            "model.embed",
            "model.linear",
            // (a decode step norms and rotates q and k in attend_part: no norm_rope)
            "model.attend_part",
            "model.attend_merge",
            "moe.route",
            "moe.act",
            "moe.down_combine",
        ] {
            assert!(
                lines.iter().any(|l| l.kernel == k),
                "{k} missing: {lines:?}"
            );
        }
        // the last step samples only: the forward ran steps - 1 times
        let linear: u64 = p
            .dispatches
            .iter()
            .filter(|d| d.launch.kernel.starts_with("model.linear"))
            .map(|d| d.launch.bytes_read)
            .sum();
        let per_forward = linear / (steps as u64 - 1);
        let (mut weights, mut inputs, mut outputs) = (0u64, 0u64, 0u64);
        for id in model.weight_ids() {
            let w = model.weight(id).unwrap();
            let (o, i) = (w.out_features() as u64, w.in_features() as u64);
            weights += 4 * o * i;
            // gate and up are one dispatch reading its input once, and q, k and v
            use decoda::model::ops::WeightId;
            if !matches!(id, WeightId::Up(_) | WeightId::K(_) | WeightId::V(_)) {
                inputs += 4 * i;
            }
            outputs += 4 * o;
        }
        assert!(
            per_forward >= weights + inputs && per_forward <= weights + inputs + outputs,
            "linear reads {per_forward} bytes a step; weights {weights}, inputs {inputs}"
        );
    }

    /// attend_part launches the chunks of 64 positions the call's rows reach, not the
    /// cache's: an engine that holds 1,066 positions (17 chunks) decoding at positions
    /// 66-68 launches 2 chunks a query head, and draws the ids of an engine that holds
    /// only the positions it needs.
    #[test]
    fn attend_part_launches_the_chunks_its_rows_reach() {
        if !available() {
            return;
        }
        let t = tmp("wgpu-reach");
        let model = Arc::new(Qwen3Moe::load(&tiny_model(&t, 7).unwrap(), 16).unwrap());
        let heads = model.config.num_attention_heads as u64;
        let steps = 4;
        let prompt: Vec<u32> = (1..=66).collect();
        let seq = decoda::model::Sequence {
            prompt: prompt.clone(),
            request: greedy(steps as u64, 3),
        };
        let mut ids = Vec::new();
        for positions in [prompt.len() + steps, 1000 + prompt.len()] {
            let mut e = dev(Arc::clone(&model), 1, positions).unwrap();
            assert!(e.set_profile(true));
            let r = decoda::model::generate(e.as_mut(), std::slice::from_ref(&seq), &mut |_| {})
                .unwrap();
            let p = e.profile();
            let attend: Vec<u64> = p
                .dispatches
                .iter()
                .filter(|d| d.launch.kernel == "model.attend_part")
                .map(|d| d.launch.workgroups)
                .collect();
            assert!(!attend.is_empty());
            assert!(
                attend.iter().all(|&w| w == 2 * heads),
                "{positions}: {attend:?}"
            );
            ids.push(r.outputs[0].tokens.clone());
        }
        assert_eq!(ids[0], ids[1]);
        // a cache of more chunks than a grid dimension holds is refused by name
        let e = dev(model, 1, 65_536 * 64)
            .err()
            .expect("too many positions");
        assert!(e.contains("4194304 positions"), "{e}");
    }

    /// The matrix products of every unquantized format (the goldens are f32 and MLX's
    /// affine ones) at widths that are not whole vec4 loads (rows padded on upload):
    /// CPU and device logits agree to 1e-5 after the prompt, and greedy ids agree.
    #[test]
    fn wgpu_matches_cpu_in_every_dtype_at_odd_widths() {
        if !available() {
            return;
        }
        let t = tmp("wgpu-dtypes");
        for dtype in ["f32", "bf16", "f16"] {
            let d = t.join(dtype);
            TinySpec {
                seed: 5,
                hidden: 34,
                heads: 2,
                kv_heads: 1,
                head_dim: 18,
                experts: 4,
                top_k: 2,
                moe_intermediate: 22,
                intermediate: 26,
                dense_layers: vec![1],
                layers: 2,
                dtype: dtype.into(),
                ..TinySpec::default()
            }
            .write(&d)
            .unwrap();
            let model = Arc::new(Qwen3Moe::load(&d, 16).unwrap());
            let prompt = [256u32, 1, 2, 3, 200];
            let mut c = cpu(Arc::clone(&model), 1, 0).unwrap();
            let mut g = dev(Arc::clone(&model), 1, prompt.len() + 1).unwrap();
            let req = greedy(1, 0);
            c.start(0, req.clone(), &prompt, 0).unwrap();
            g.start(0, req, &prompt, 0).unwrap();
            let (lc, lg) = (c.read_logits(1).unwrap(), g.read_logits(1).unwrap());
            let gap = decoda::testing::model::relative_gap(&lg, &lc);
            assert!(gap < 1e-5, "{dtype}: device vs CPU logits {gap:.2e}");
            let seq = decoda::model::Sequence {
                prompt: prompt.to_vec(),
                request: greedy(8, 0),
            };
            let mut c = cpu(Arc::clone(&model), 1, 0).unwrap();
            let mut g = dev(Arc::clone(&model), 1, prompt.len() + 8).unwrap();
            let rc = decoda::model::generate(c.as_mut(), std::slice::from_ref(&seq), &mut |_| {})
                .unwrap();
            let rg = decoda::model::generate(g.as_mut(), &[seq], &mut |_| {}).unwrap();
            assert_eq!(rc.outputs[0].tokens, rg.outputs[0].tokens, "{dtype}");
        }
    }

    /// The forward is invariant to how many positions run in a call: the logits of a
    /// position computed in a one-position decode step are the bits of the same
    /// position computed as the last of a prompt run in one forward (speculative
    /// decoding's verification relies on it), on every golden checkpoint's format. The
    /// prompt (the golden's, repeated to 36 positions) runs the tiled products (`mm`,
    /// and the MoE layers' sorted, tiled calls), the steps the row-by-row ones. The
    /// quick tier leaves out the q4g64 and q8g64 checkpoints (their formats' tiled
    /// modules cost lavapipe seconds to build; the tiles' order is the same code in
    /// every format, and `wgpu_branches_agree_bitwise` covers them in the full tier).
    #[test]
    fn wgpu_positions_per_call_do_not_change_the_logits() {
        if !available() {
            return;
        }
        let t = tmp("wgpu-positions");
        for g in goldens(&t) {
            if !decoda::testing::full_tier()
                && ["mlx_q4g64", "mlx_q8g64"].contains(&g.name.as_str())
            {
                continue;
            }
            let model = Arc::new(Qwen3Moe::load(&g.dir, 16).unwrap());
            let steps = 5;
            let prompt: Vec<u32> = g.prompt.iter().copied().cycle().take(36).collect();
            // decode: the last sampled token's logits came from a one-position step
            let mut e = dev(Arc::clone(&model), 1, prompt.len() + steps).unwrap();
            let seq = decoda::model::Sequence {
                prompt: prompt.clone(),
                request: greedy(steps as u64, 0),
            };
            let r = decoda::model::generate(e.as_mut(), &[seq], &mut |_| {}).unwrap();
            let stepped = e.read_logits(1).unwrap();
            // the same positions as one prompt: one forward of all of them
            let mut all = prompt.clone();
            all.extend(&r.outputs[0].tokens[..steps - 1]);
            let mut f = dev(Arc::clone(&model), 1, all.len() + 1).unwrap();
            f.start(0, greedy(1, 0), &all, 0).unwrap();
            let at_once = f.read_logits(1).unwrap();
            let same = stepped
                .iter()
                .zip(&at_once)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{}: the logits of position {} differ between a decode step and a prompt (gap {:.2e})",
                g.name,
                all.len() - 1,
                decoda::testing::model::relative_gap(&stepped, &at_once)
            );
        }
    }

    /// The matrix products' team sums with subgroup operations (a butterfly below the
    /// subgroup size) give the workgroup tree's bits: a model on a device opened with
    /// subgroups draws the same ids and the same logits, prompt and decode steps, on
    /// every golden checkpoint (the quick tier: the f32 one, since the sums are the same
    /// code in every format's module and each format's subgroup modules cost lavapipe
    /// seconds to build), and a 9,000-token vocabulary (`mv_wide`); 36-position prompts,
    /// so the tiled products' levels run with subgroups too.
    #[test]
    fn wgpu_subgroup_sums_give_the_tree_bits() {
        if !available() {
            return;
        }
        let Some(d) = decoda::testing::gpu::own_device(decoda::wgpu::WgpuOptions {
            subgroups: Some(true),
            ..Default::default()
        }) else {
            return;
        };
        let sg = WgpuSampler::on(&d).unwrap();
        if !sg.uses_subgroups() {
            eprintln!("{}: no subgroup operations", sg.adapter());
            return;
        }
        let t = tmp("wgpu-subgroups");
        let quick = !decoda::testing::full_tier();
        let mut cases: Vec<(String, PathBuf, Vec<u32>)> = goldens(&t)
            .into_iter()
            .filter(|g| !quick || g.name == "default")
            .map(|g| (g.name, g.dir, g.prompt))
            .collect();
        // a 9,000-token vocabulary: the LM head runs `mv_wide`
        cases.push(("wide".into(), wide_vocab(&t), vec![300, 72, 8500]));
        for (name, dir, prompt) in cases {
            let model = Arc::new(Qwen3Moe::load(&dir, 16).unwrap());
            let steps = 4;
            // 36 prompt positions: the prompt runs the tiled products (and their
            // subgroup levels), whose keys and values the steps read
            let prompt: Vec<u32> = prompt.iter().copied().cycle().take(36).collect();
            let run = |e: &mut Box<dyn Engine>| {
                let seq = decoda::model::Sequence {
                    prompt: prompt.clone(),
                    request: greedy(steps as u64, 0),
                };
                let r = decoda::model::generate(e.as_mut(), &[seq], &mut |_| {}).unwrap();
                (r.outputs[0].tokens.clone(), e.read_logits(1).unwrap())
            };
            let mut a = dev(Arc::clone(&model), 1, prompt.len() + steps).unwrap();
            let mut b: Box<dyn Engine> =
                Box::new(WgpuEngine::new(&sg, model, 1, prompt.len() + steps, None).unwrap());
            let (ta, la) = run(&mut a);
            let (tb, lb) = run(&mut b);
            assert_eq!(ta, tb, "{name}: ids");
            assert!(
                la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name}: logits differ with subgroup sums (gap {:.2e})",
                decoda::testing::model::relative_gap(&la, &lb)
            );
        }
    }

    /// Attention over a cache of two 64-position chunks (`attend_part`, then the merge):
    /// decode steps that cross the chunk boundary give the bits of the same positions run
    /// as one prompt, and those logits agree with the CPU's to 1e-5.
    #[test]
    fn wgpu_attention_across_chunks() {
        if !available() {
            return;
        }
        let t = tmp("wgpu-chunks");
        let model = Arc::new(Qwen3Moe::load(&tiny_model(&t, 9).unwrap(), 16).unwrap());
        let v = model.config.vocab_size as u32;
        // 62 prompt positions, then steps at 62 .. 66 (chunk 0 into chunk 1)
        let prompt: Vec<u32> = (0..62u32).map(|i| (i * 37 + 11) % v).collect();
        let steps = 5;
        let mut e = dev(Arc::clone(&model), 1, prompt.len() + steps).unwrap();
        let seq = decoda::model::Sequence {
            prompt: prompt.clone(),
            request: greedy(steps as u64, 0),
        };
        let r = decoda::model::generate(e.as_mut(), &[seq], &mut |_| {}).unwrap();
        let stepped = e.read_logits(1).unwrap();
        let mut all = prompt;
        all.extend(&r.outputs[0].tokens[..steps - 1]);
        assert_eq!(all.len(), 66);
        let mut f = dev(Arc::clone(&model), 1, all.len() + 1).unwrap();
        f.start(0, greedy(1, 0), &all, 0).unwrap();
        let at_once = f.read_logits(1).unwrap();
        assert!(
            stepped
                .iter()
                .zip(&at_once)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "position 65: decode step and prompt differ (gap {:.2e})",
            decoda::testing::model::relative_gap(&stepped, &at_once)
        );
        let mut c = cpu(model, 1, 0).unwrap();
        c.start(0, greedy(1, 0), &all, 0).unwrap();
        let gap = decoda::testing::model::relative_gap(&at_once, &c.read_logits(1).unwrap());
        assert!(gap < 1e-5, "device vs CPU logits at position 65: {gap:.2e}");
    }

    /// The dispatches of a decode step at B = 1, counted from its profile: 8 for an MoE
    /// layer (q/k/v with the norm before it, attention's two passes, o, the router with
    /// the norm before it, routing, the experts' two products) and 6 for a dense one, 4
    /// around them (embedding, final norm, LM head, positions), and the head's.
    #[test]
    fn wgpu_dispatches_per_layer() {
        if !available() {
            return;
        }
        let (model, e, p) = profiled("wgpu-count", &[256, 72], 2);
        let cfg = model.config.clone();
        // the first step samples and runs the forward; the second only samples
        let forward = p
            .dispatches
            .iter()
            .filter(|d| !d.launch.kernel.starts_with("sample."))
            .count();
        let moe_layers = (0..cfg.num_hidden_layers)
            .filter(|&l| decoda::model::ModelWeights::moe(model.as_ref(), l).is_some())
            .count();
        let dense = cfg.num_hidden_layers - moe_layers;
        assert!(moe_layers > 0 && dense > 0, "the tiny model has both kinds");
        assert_eq!(
            forward,
            8 * moe_layers + 6 * dense + 4,
            "{:?}",
            p.by_kernel()
        );
        let sampled = p.dispatches.len() - forward;
        assert_eq!(sampled, 2 * e.step_dispatches().unwrap(), "two head steps");
    }

    /// At B = 1 a decode step's planned bytes are within 1.2x of what it must read: every
    /// dense matrix and the LM head once, the k chosen experts of each MoE layer once
    /// (f32 here: 4 bytes a weight), the KV cache up to the position, the activations.
    #[test]
    fn wgpu_planned_bytes_at_b1_are_the_bytes_it_must_read() {
        if !available() {
            return;
        }
        use decoda::model::ModelWeights;
        let prompt = [256, 72, 101];
        let (model, _, p) = profiled("wgpu-bytes", &prompt, 2);
        let cfg = model.config.clone();
        // one forward ran (the second step only samples), at position prompt.len()
        let planned = model_bytes_read(&p);
        let mut must = 0u64;
        for id in model.weight_ids() {
            let w = model.weight(id).unwrap();
            must += 4 * (w.out_features() * w.in_features()) as u64;
        }
        for l in 0..cfg.num_hidden_layers {
            if let Some(block) = model.moe(l) {
                let x = block.experts;
                let per_expert = 4 * (3 * x.hidden() * x.intermediate()) as u64;
                must += block.top_k as u64 * per_expert;
            }
        }
        // the cache up to the position (keys and values), and the embedding row
        let keys = prompt.len() as u64 + 1;
        must += cfg.num_hidden_layers as u64 * keys * 2 * 4 * cfg.kv_width() as u64;
        must += 4 * cfg.hidden_size as u64;
        assert!(
            planned >= must && (planned as f64) <= 1.2 * must as f64,
            "planned {planned} bytes, must read {must} ({:.3}x): {:?}",
            planned as f64 / must as f64,
            p.by_kernel()
        );
    }

    /// At B = 32 a decode step's planned bytes are within 1.2x of what it must read:
    /// every dense matrix and the LM head once (the products run tiled: 32 rows a
    /// tile), each MoE layer's chosen experts once (its calls sort, and the tiled
    /// products read an expert once per 32 of its rows; 64 choices over 8 experts
    /// choose them all), the KV cache up to each position, and each product's and the
    /// attention's inputs once. Reading a weight once per 8 tokens (the row-by-row
    /// products), or an expert once per token it serves (an unsorted call: 5.2x), fails
    /// it.
    #[test]
    fn wgpu_planned_bytes_at_b32_are_the_bytes_it_must_read() {
        if !available() {
            return;
        }
        use decoda::model::ops::WeightId;
        use decoda::model::ModelWeights;
        let t = tmp("wgpu-bytes-32");
        let dir = t.join("wide");
        TinySpec {
            hidden: 256,
            intermediate: 256,
            moe_intermediate: 128,
            vocab: 1024,
            heads: 8,
            kv_heads: 2,
            head_dim: 32,
            seed: 5,
            ..TinySpec::default()
        }
        .write(&dir)
        .unwrap();
        let model = Arc::new(Qwen3Moe::load(&dir, 16).unwrap());
        let cfg = model.config.clone();
        let b = 32usize;
        let prompt_len = 3usize;
        let mut e = dev(Arc::clone(&model), b, prompt_len + 2).unwrap();
        assert!(e.set_profile(true));
        let seqs: Vec<_> = (0..b as u32)
            .map(|i| decoda::model::Sequence {
                prompt: vec![256 + i, 72, 101],
                request: greedy(2, i as u64),
            })
            .collect();
        decoda::model::generate(e.as_mut(), &seqs, &mut |_| {}).unwrap();
        let p = e.profile();
        // one forward of the 32 rows ran (the second step only samples)
        let planned = model_bytes_read(&p);
        let rows = b as u64;
        let mut must = 0u64;
        for id in model.weight_ids() {
            let w = model.weight(id).unwrap();
            // the matrix once, its input rows once (q, k and v share theirs, as gate and
            // up do)
            must += 4 * (w.out_features() * w.in_features()) as u64;
            if !matches!(id, WeightId::K(_) | WeightId::V(_) | WeightId::Up(_)) {
                must += 4 * rows * w.in_features() as u64;
            }
        }
        for l in 0..cfg.num_hidden_layers {
            if let Some(block) = model.moe(l) {
                let x = block.experts;
                let per_expert = 4 * (3 * x.hidden() * x.intermediate()) as u64;
                let chosen = (b * block.top_k).min(x.experts()) as u64;
                must += chosen * per_expert;
                // the experts' inputs (x per token) and the down products' (act per pair)
                must += 4 * rows * x.hidden() as u64;
                must += 4 * rows * (block.top_k * x.intermediate()) as u64;
            }
            // attention: q of each row, the cache up to the position (keys and values)
            must += 4 * rows * (cfg.num_attention_heads * cfg.head_dim) as u64;
            must += rows * (prompt_len as u64 + 1) * 2 * 4 * cfg.kv_width() as u64;
        }
        // the embedding rows
        must += 4 * rows * cfg.hidden_size as u64;
        let ratio = planned as f64 / must as f64;
        assert!(
            planned >= must && ratio <= 1.2,
            "planned {planned} bytes, must read {must} ({ratio:.3}x): {:?}",
            p.by_kernel()
        );
        eprintln!("B = 32: planned {planned} bytes, must read {must} ({ratio:.3}x)");
    }

    /// An LM head of many rows runs `mv_wide` (32 output rows a workgroup) and gives the
    /// bits of `mv` (4 rows a workgroup): a 9,000-token vocabulary in one part (wide)
    /// and in parts of at most 2,048 rows (row by row) draw the same ids and leave the
    /// same logits, at B = 1 and with 9 sequences (two chunks of 8 call rows).
    #[test]
    fn wgpu_wide_lm_head_gives_the_rows_bits() {
        if !available() {
            return;
        }
        let t = tmp("wgpu-wide");
        let model = Arc::new(Qwen3Moe::load(&wide_vocab(&t), 16).unwrap());
        let d = decoda::testing::gpu::device().unwrap();
        // f32 rows of 64 inputs: 2,048 rows in 512 KiB
        let parted = d.with_weight_part_bytes(512 << 10);
        for b in [1usize, 9] {
            let seqs: Vec<_> = (0..b as u32)
                .map(|i| decoda::model::Sequence {
                    prompt: vec![300 + i, 72, 8500 - i],
                    request: greedy(3, i as u64),
                })
                .collect();
            let mut logits = Vec::new();
            let mut ids = Vec::new();
            for whole in [true, false] {
                let mut e: Box<dyn Engine> = if whole {
                    dev(Arc::clone(&model), b, 8).unwrap()
                } else {
                    Box::new(WgpuEngine::new(&parted, model.clone(), b, 8, None).unwrap())
                };
                let r = decoda::model::generate(e.as_mut(), &seqs, &mut |_| {}).unwrap();
                ids.push(
                    r.outputs
                        .iter()
                        .map(|o| o.tokens.clone())
                        .collect::<Vec<_>>(),
                );
                logits.push(e.read_logits(b).unwrap());
            }
            assert_eq!(ids[0], ids[1], "B = {b}");
            let same = logits[0]
                .iter()
                .zip(&logits[1])
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "B = {b}: the wide LM head's logits differ from the rows'"
            );
        }
    }
}

fn cpu_forward(
    model: Arc<Qwen3Moe>,
    slots: usize,
) -> Result<Box<dyn decoda::model::Forward>, String> {
    Ok(Box::new(
        decoda::cpu::CpuModel::new(model, slots).map_err(|e| e.to_string())?,
    ))
}

#[test]
fn cpu_verification_forward_is_position_invariant() {
    let t = tmp("cpu-invariant");
    decoda::testing::speculate::forward_is_position_invariant(&cpu_forward, &t, true)
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_dir_all(t);
}

#[test]
fn cpu_speculative_is_plain_decoding() {
    let t = tmp("cpu-speculative");
    let head = |slots: usize, vocab: usize| -> Result<Box<dyn decoda::head::Head>, String> {
        Ok(Box::new(
            decoda::CpuHead::new(slots, vocab).map_err(|e| e.to_string())?,
        ))
    };
    decoda::testing::speculate::speculative_is_plain(
        &cpu_forward,
        &head,
        &cpu,
        &decoda::CpuSampler::new(),
        &[1, 3, 5],
        true,
        &t,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_dir_all(t);
}
