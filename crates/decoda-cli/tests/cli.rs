//! The CLI's interface: output shapes, exit status and messages on bad input.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_decoda"))
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("decoda-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Writes a C-order .npy (version 1.0) with the given descr and shape.
fn write_npy(path: &Path, descr: &str, shape: &[usize], data: &[u8]) {
    let shape_s = match shape {
        [v] => format!("({v},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_s}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

fn f32_npy(name: &str, shape: &[usize], vals: &[f32]) -> PathBuf {
    let p = tmp(name);
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_npy(&p, "<f4", shape, &bytes);
    p
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = bin().args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn sample_json_shape_and_reproducibility() {
    let p = f32_npy(
        "a.npy",
        &[2, 5],
        &[0.1, 2.0, 0.3, 1.9, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    );
    let args = [
        "sample",
        "--logits",
        p.to_str().unwrap(),
        "--device",
        "cpu",
        "--seed",
        "7",
        "--draws",
        "4",
        "--top-p",
        "0.9",
        "--logprobs",
        "2",
        "--json",
    ];
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["device"], "cpu");
    assert_eq!(v["vocab"], 5);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["row"], 1);
    assert_eq!(rows[1]["seed"], 7);
    assert_eq!(rows[0]["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(rows[0]["logprobs"].as_array().unwrap().len(), 4);
    assert_eq!(rows[0]["logprobs"][0]["top"].as_array().unwrap().len(), 2);
    let (_, again, _) = run(&args);
    assert_eq!(out, again, "same seed, same tokens");
}

#[test]
fn per_row_params_and_row_errors() {
    let p = f32_npy(
        "b.npy",
        &[3, 4],
        &[
            1.0,
            2.0,
            3.0,
            4.0,
            f32::NAN,
            0.0,
            0.0,
            0.0,
            4.0,
            3.0,
            2.0,
            1.0,
        ],
    );
    let params = tmp("b.json");
    std::fs::write(&params, r#"[{"temperature": 0}, {"seed": 3}, {"temperature": 0, "logit_bias": {"0": "-inf"}, "seed": 5}]"#).unwrap();
    let (code, out, _) = run(&[
        "sample",
        "--logits",
        p.to_str().unwrap(),
        "--params",
        params.to_str().unwrap(),
        "--device",
        "cpu",
        "--json",
    ]);
    assert_eq!(code, 1, "a failed row is reported with status 1");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["rows"][0]["tokens"][0], 3);
    assert_eq!(v["rows"][1]["error"]["kind"], "NonFiniteLogits");
    assert_eq!(v["rows"][2]["tokens"][0], 1);
    assert_eq!(v["rows"][2]["seed"], 5);
}

#[test]
fn whole_call_errors_exit_2_with_a_message() {
    let p = f32_npy("c.npy", &[4], &[1.0, 2.0, 3.0, 4.0]);
    let ps = p.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "sample", "--logits", ps, "--top-p", "1.5", "--device", "cpu",
            ],
            "top_p",
        ),
        (
            vec![
                "sample",
                "--logits",
                ps,
                "--temperature",
                "-1",
                "--device",
                "cpu",
            ],
            "temperature",
        ),
        (
            vec![
                "sample", "--logits", ps, "--output", "1,9", "--device", "cpu",
            ],
            "output",
        ),
        (
            vec![
                "sample",
                "--logits",
                ps,
                "--logit-bias",
                "2:x",
                "--device",
                "cpu",
            ],
            "logit-bias",
        ),
        (
            vec![
                "sample",
                "--logits",
                "/nonexistent/x.npy",
                "--device",
                "cpu",
            ],
            "cannot open",
        ),
        (
            vec!["explain", "--logits", ps, "--row", "3"],
            "out of range",
        ),
    ];
    for (args, needle) in cases {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
    }
    let bad = tmp("bad.npy");
    std::fs::write(&bad, b"not numpy").unwrap();
    let (code, _, err) = run(&[
        "sample",
        "--logits",
        bad.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("not a valid .npy"), "{err}");
    let cube = tmp("cube.npy");
    write_npy(&cube, "<f4", &[1, 2, 2], &[0u8; 16]);
    let (code, _, err) = run(&[
        "sample",
        "--logits",
        cube.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("shape"), "{err}");
    let ints = tmp("ints.npy");
    write_npy(&ints, "<i4", &[4], &[0u8; 16]);
    let (code, _, err) = run(&[
        "sample",
        "--logits",
        ints.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("float32 or float16"), "{err}");
    let params = tmp("rows.json");
    std::fs::write(&params, r#"[{"temprature": 1}]"#).unwrap();
    let (code, _, err) = run(&[
        "sample",
        "--logits",
        ps,
        "--params",
        params.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown key"), "{err}");
}

#[test]
fn f16_input_and_explain() {
    let p = tmp("h.npy");
    let vals: Vec<u8> = [0.5f32, 2.0, 1.0, -1.0]
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
        .collect();
    write_npy(&p, "<f2", &[4], &vals);
    let (code, out, err) = run(&[
        "sample",
        "--logits",
        p.to_str().unwrap(),
        "--temperature",
        "0",
        "--device",
        "cpu",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"tokens\":[1]"), "{out}");
    let (code, out, _) = run(&[
        "explain",
        "--logits",
        p.to_str().unwrap(),
        "--top-k",
        "2",
        "--seed",
        "1",
    ]);
    assert_eq!(code, 0);
    for needle in [
        "== input ==",
        "== temperature ==",
        "== top-k ==",
        "entropy",
        "removed 2",
        "drawn: token",
    ] {
        assert!(out.contains(needle), "{needle:?} missing in {out}");
    }
}

#[test]
fn demo_and_bench_run() {
    let (code, out, _) = run(&["demo", "--device", "cpu"]);
    assert_eq!(code, 0);
    assert!(out.contains("identical") && !out.contains("DIFFERENT"));
    let (code, out, err) = run(&[
        "bench",
        "--config",
        "topk50,greedy",
        "--vocab",
        "1000",
        "--rows",
        "2",
        "--threads",
        "1",
        "--time-ms",
        "5",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for key in [
        "impl",
        "device",
        "config",
        "vocab",
        "rows",
        "threads",
        "median_us",
        "p10_us",
        "p90_us",
        "floor_us",
    ] {
        assert!(lines[0].get(key).is_some(), "{key}");
    }
    let (code, _, err) = run(&["bench", "--config", "nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown configuration"));
}

/// The device grid as the GPU comparison reads it: both timing notions, the bytes and
/// the fractions of the measured bandwidth, per element type and law; the CPU grid
/// refuses 16-bit element types by name.
#[test]
fn bench_device_json_fields() {
    let (code, _, err) = run(&["bench", "--device", "cpu", "--dtype", "bf16"]);
    assert_eq!(code, 2);
    assert!(err.contains("--dtype") && err.contains("f32"), "{err}");
    let (code, _, err) = run(&["bench", "--device", "cpu", "--law", "nope"]);
    assert_eq!(code, 2, "{err}");
    // the wide law: rows spanning about 2.5 ln V (30 units at V = 151,936; 17 at 1,000)
    let (code, out, err) = run(&[
        "bench",
        "--device",
        "cpu",
        "--law",
        "wide",
        "--config",
        "greedy",
        "--vocab",
        "1000",
        "--rows",
        "1",
        "--threads",
        "1",
        "--time-ms",
        "1",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let cell: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(cell["law"], "wide", "{out}");
    let (code, out, err) = run(&[
        "bench",
        "--device",
        "wgpu",
        "--config",
        "minp01",
        "--vocab",
        "4099",
        "--rows",
        "3",
        "--dtype",
        "f32,bf16",
        "--law",
        "affine",
        "--rotate-mib",
        "1",
        "--time-ms",
        "5",
        "--json",
    ]);
    if code == 2 && err.contains("no device") {
        assert!(
            std::env::var("DECODA_REQUIRE_GPU").map_or(true, |v| v != "1"),
            "DECODA_REQUIRE_GPU=1 but: {err}"
        );
        eprintln!("no wgpu adapter, the device grid is not run: {err}");
        return;
    }
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    for (l, (dtype, bytes)) in lines
        .iter()
        .zip([("f32", 4 * 3 * 4099), ("bf16", 2 * 3 * 4099)])
    {
        assert_eq!(l["dtype"], dtype);
        assert_eq!(l["law"], "affine");
        assert_eq!(l["bytes_read"], bytes);
        // 1 MiB of rotation in buffers of one call's rows
        assert_eq!(l["nbuf"].as_u64(), Some((1u64 << 20).div_ceil(bytes)));
        for key in [
            "median_us",
            "gpu_us",
            "floor_us",
            "frac_of_measured_bw",
            "gpu_frac_of_measured_bw",
        ] {
            let v = l[key].as_f64().unwrap_or(-1.0);
            assert!(v > 0.0, "{key} = {v} in {l}");
        }
        // the structure: min-p without log-probabilities is probe, scan, settle_finish
        // (settle_first, settle_rest, draw_finish unfused), lp and finish (for rows on
        // the full-row path),
        // reading the row once and its sample at most twice
        let mut want = vec!["probe", "sample", "pick", "sample", "pick", "scan"];
        want.extend(settle_finish());
        want.extend(["lp", "finish"]);
        assert_eq!(l["dispatches"], want.len(), "{l}");
        assert_eq!(l["kernels"], serde_json::json!(want), "{l}");
        assert_eq!(l["row_reads"], 1.125, "{l}");
        // each dispatch's workgroups: a probe and a settle per row, the scan's pieces
        // of each row (V = 4,099: the smallest piece is 4,096 logits, so two a row, on
        // any adapter that aims at 4 or more workgroups, unless DECODA_WGPU_WORKGROUPS
        // asks for fewer)
        let wg: Vec<u64> = l["workgroups"]
            .as_array()
            .expect("workgroups")
            .iter()
            .map(|w| w.as_u64().unwrap())
            .collect();
        // (the sample passes: a row in one piece on a software adapter, two of 4,096
        // logits on a hardware one)
        assert!(wg[1] == 3 || wg[1] == 6, "{l}");
        let mut want_wg = vec![3, wg[1], 3, wg[1], 3, 6];
        want_wg.extend(settle_finish().iter().map(|_| 3));
        want_wg.extend([6, 3]);
        assert_eq!(wg, want_wg, "{l}");
        // the start-up: each kernel the call ran has its pipeline's build time
        let built = l["pipelines_s"].as_object().expect("pipelines_s");
        for k in &want {
            let t = built.get(*k).and_then(|t| t.as_f64());
            assert!(t.is_some_and(|t| t >= 0.0), "{k}: {l}");
        }
        // the profile: every stage of the step, in order, when there are timestamps
        if l["timer"] == "gpu" {
            let stages = l["stages_us"].as_object().expect("stages_us");
            let names: Vec<&str> = stages.keys().map(String::as_str).collect();
            // (a stage recorded twice, the probe's sample and pick, is one entry: its sum)
            want.sort_unstable();
            want.dedup();
            assert_eq!(names, want, "{l}");
            assert!(stages
                .values()
                .all(|t| t.as_f64().is_some_and(|t| t >= 0.0)));
            // the slowest profiled call's stages: the same names, a total at least the
            // median call's
            let slowest = l["stages_slowest_us"]
                .as_object()
                .expect("stages_slowest_us");
            let names: Vec<&str> = slowest.keys().map(String::as_str).collect();
            assert_eq!(names, want, "{l}");
            let total = |m: &serde_json::Map<String, serde_json::Value>| {
                m.values().map(|t| t.as_f64().unwrap()).sum::<f64>()
            };
            assert!(total(slowest) >= total(stages), "{l}");
            // the cell's first call, stage by stage: the same stages
            let first = l["first_stages_us"].as_object().expect("first_stages_us");
            let names: Vec<&str> = first.keys().map(String::as_str).collect();
            assert_eq!(names, want, "{l}");
            assert!(first.values().all(|t| t.as_f64().is_some_and(|t| t >= 0.0)));
        }
    }
}

#[test]
fn moe_bench_json_lines_and_crossover() {
    let (code, out, err) = run(&[
        "moe-bench",
        "--experts",
        "8",
        "--top-k",
        "2",
        "--hidden",
        "24",
        "--intermediate",
        "16",
        "--tokens",
        "1,4,32",
        "--time-ms",
        "1",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 4, "{out}");
    for (l, n) in lines.iter().zip([1, 4, 32]) {
        for key in [
            "experts",
            "top_k",
            "hidden",
            "intermediate",
            "dtype",
            "tokens",
            "sorted_us",
            "unsorted_us",
        ] {
            assert!(l.get(key).is_some(), "{key} missing in {l}");
        }
        assert_eq!(l["tokens"], n);
        assert_eq!(l["experts"], 8);
        assert_eq!(l["dtype"], "bf16");
        assert!(l["sorted_us"].as_f64().unwrap() > 0.0);
        assert!(l["max_rel_diff"].as_f64().unwrap() <= 1e-5, "{l}");
    }
    let last = &lines[3];
    assert!(last.get("crossover").is_some(), "{last}");
    assert!(
        last["recommended_sort_cutoff"].as_u64().unwrap() >= 1,
        "{last}"
    );

    let (code, out, err) = run(&[
        "moe-bench",
        "--experts",
        "4",
        "--top-k",
        "1",
        "--hidden",
        "8",
        "--intermediate",
        "4",
        "--tokens",
        "1,2",
        "--time-ms",
        "1",
        "--dtype",
        "f32",
        "--separate",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("crossover"), "{out}");
    assert!(out.contains("recommended sort_cutoff"), "{out}");
}

#[test]
fn moe_bench_bad_arguments_exit_2() {
    for args in [
        &["moe-bench", "--experts", "4", "--top-k", "5"][..],
        &["moe-bench", "--experts", "0"][..],
        &["moe-bench", "--tokens", "0,4"][..],
        &[
            "moe-bench",
            "--hidden",
            "0",
            "--experts",
            "4",
            "--top-k",
            "1",
        ][..],
    ] {
        let (code, _, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("error"), "{args:?}: {err}");
    }
}

/// Whether the wgpu device is usable here (an adapter exists), as the CLI sees it: one
/// `decoda sample --device wgpu` of a 4-token row, asked once per test process.
/// Whether the wgpu device the CLI opens settles and finishes a call in one dispatch
/// (`settle_finish`; hardware adapters) or two (`settle`, `draw_finish`; software ones
/// such as lavapipe): the same rule and environment as the child processes.
fn fused() -> bool {
    static FUSED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FUSED.get_or_init(|| {
        decoda::wgpu::WgpuDevice::new()
            .map(|d| d.fuses_settle())
            .unwrap_or(true)
    })
}

/// `settle_finish` of a call that is not light, or the three stages it is on a device
/// that does not fuse them (settle itself in two there: `settle_first`, `settle_rest`).
fn settle_finish() -> Vec<&'static str> {
    if fused() {
        vec!["settle_finish"]
    } else {
        vec!["settle_first", "settle_rest", "draw_finish"]
    }
}

fn have_wgpu() -> bool {
    static HAVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAVE.get_or_init(|| {
        let p = f32_npy("probe.npy", &[4], &[0.1, 2.0, 0.3, 1.0]);
        let (code, _, err) = run(&[
            "sample",
            "--logits",
            p.to_str().unwrap(),
            "--device",
            "wgpu",
        ]);
        if code == 2 && err.contains("no device") {
            assert!(
                std::env::var("DECODA_REQUIRE_GPU").map_or(true, |v| v != "1"),
                "DECODA_REQUIRE_GPU=1 but: {err}"
            );
            eprintln!("wgpu CLI tests skipped: {err}");
            return false;
        }
        assert_eq!(code, 0, "decoda sample --device wgpu: {err}");
        true
    })
}

#[test]
fn wgpu_device_draws_the_cpu_tokens_streamed() {
    if !have_wgpu() {
        return;
    }
    let vals: Vec<f32> = (0..64).map(|i| ((i * 37 % 64) as f32) * 0.1).collect();
    let p = f32_npy("v64.npy", &[64], &vals);
    let tokens = |device: &str| {
        let (code, out, err) = run(&[
            "sample",
            "--logits",
            p.to_str().unwrap(),
            "--device",
            device,
            "--draws",
            "200000",
            "--seed",
            "11",
            "--top-p",
            "0.9",
            "--temperature",
            "0.8",
            "--json",
        ]);
        assert_eq!(code, 0, "{device}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(
            v["device"].as_str().unwrap().starts_with(device),
            "{}",
            v["device"]
        );
        v["rows"][0]["tokens"].clone()
    };
    let g = tokens("wgpu");
    assert_eq!(g.as_array().unwrap().len(), 200_000);
    assert_eq!(g, tokens("cpu"), "wgpu and cpu draws differ");
}

#[test]
fn wgpu_selftest_runs_the_rows_asked() {
    if !have_wgpu() {
        return;
    }
    // the quick selftest (the full one is the device suites again, which the library's
    // tests run on every backend; DECODA_TESTS=full runs it here too)
    let quick = !decoda::testing::full_tier();
    // (a few hundred parity rows show the command's check: the library's device tests
    // run thousands)
    let mut args = vec!["selftest", "--device", "wgpu", "--parity-rows", "177"];
    if quick {
        // (the head over 8 steps: `wgpu_head` checks the device head over 60; four
        // checks of the conformance suite, whose every check the library's suite runs
        // on the same sampler: its `wgpu_sampler` module)
        args.extend_from_slice(&[
            "--quick",
            "--head-steps",
            "8",
            "--only",
            "greedy_ties_to_smallest_id,top_p_keeps_ties,stage_typical_p,kept_distribution",
        ]);
    }
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("parity: 177 rows"), "{out}");
    let checks = out.lines().filter(|l| l.starts_with("  ok    ")).count();
    if quick {
        // the four checks, the head, 9 parity vocabularies, 3 shapes and their tally
        assert!(out.contains("  ok    kept_distribution"), "{out}");
        assert!(!out.contains("stage_bias"), "{out}");
        assert_eq!(checks, 18, "{out}");
    }
    assert!(
        out.lines().any(|l| l.ends_with(" passed, 0 failed")),
        "{out}"
    );
    // a check the suite does not have is named, with the ones it has
    let (code, _, err) = run(&["selftest", "--device", "cpu", "--only", "stage_nope"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("stage_nope") && err.contains("stage_xtc"),
        "{err}"
    );
}

/// `selftest --stress N` on the CPU: N calls of random shapes and stages against the
/// reference, the counts on its last line, exit 0 when nothing differs; the seed flag
/// needs `--stress`. (The device's stress run is `wgpu::stress_run_matches_the_reference`.)
#[test]
fn selftest_stress_counts_on_the_cpu() {
    let (code, out, err) = run(&[
        "selftest",
        "--device",
        "cpu",
        "--stress",
        "25",
        "--stress-seed",
        "9",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("stress: 25 calls (0 failed)")
            && last.contains(" 0 mismatches, 0 out-of-range ids"),
        "{out}"
    );
    let (code, _, err) = run(&["selftest", "--device", "cpu", "--stress-seed", "9"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--stress"), "{err}");
}

#[test]
fn hostile_inputs_get_clear_errors() {
    // a header whose shape product wraps around to 0 (2^32 * 2^32 f32 values)
    let p = tmp("wrap.npy");
    write_npy(&p, "<f4", &[1 << 32, 1 << 32], &[0u8; 16]);
    let (code, _, err) = run(&["sample", "--logits", p.to_str().unwrap(), "--device", "cpu"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("shape") && err.contains("bytes"), "{err}");
    // a shape larger than the file
    let p = tmp("short.npy");
    write_npy(&p, "<f4", &[3, 1000], &[0u8; 40]);
    let (code, _, err) = run(&["sample", "--logits", p.to_str().unwrap(), "--device", "cpu"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("needs more data"), "{err}");
    // absurd thread counts and MoE sizes
    let ok = f32_npy("ok.npy", &[4], &[0.0, 1.0, 2.0, 3.0]);
    let (code, _, err) = run(&[
        "sample",
        "--logits",
        ok.to_str().unwrap(),
        "--device",
        "cpu",
        "--threads",
        "100000",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--threads 100000"), "{err}");
    let (code, _, err) = run(&["moe-bench", "--hidden", "100000000", "--tokens", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("GiB") && err.contains("hidden 100000000"),
        "{err}"
    );
    let (code, _, err) = run(&[
        "moe-bench",
        "--experts",
        "18446744073709551615",
        "--tokens",
        "1",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("GiB"), "{err}");
}

#[test]
fn bench_table_columns_line_up() {
    let (code, out, err) = run(&[
        "bench",
        "--device",
        "cpu",
        "--config",
        "greedy,topk50_topp09",
        "--vocab",
        "1000",
        "--rows",
        "1,16",
        "--time-ms",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().skip(1).collect();
    assert!(lines.len() >= 5, "{out}");
    let width = lines[0].chars().count();
    for l in &lines {
        assert_eq!(l.chars().count(), width, "ragged table:\n{out}");
    }
}

/// `decoda sample` from a file at vocabulary sizes of real models (every one in the full
/// tier), batches of 1 to 64 rows, f32 and f16 files, one and three draws, every logit
/// style and parameter mix (`--params` per row), on the CPU and on the device: every
/// token is the reference's.
#[test]
fn sample_from_file_at_decode_shapes() {
    use decoda::testing::shapes::{decode_batch, Batch, Entry, DECODE_BATCHES, DECODE_VOCABS};
    use decoda::testing::Rng;
    let devices: &[&str] = if have_wgpu() {
        &["cpu", "wgpu"]
    } else {
        &["cpu"]
    };
    let mut rng = Rng::new(2025);
    // quick tier: four vocabularies from 32,000 to 262,144 that between them cover B = 1,
    // 3 and 64, f32 and f16 files, one and three draws; the full tier takes every one
    let quick = !decoda::testing::full_tier();
    for (vi, &v) in DECODE_VOCABS.iter().enumerate() {
        let b = DECODE_BATCHES[vi % DECODE_BATCHES.len()];
        if quick && ![0, 2, 5, 9].contains(&vi) {
            continue;
        }
        let batch_rows = decode_batch(&mut rng, v, b, vi);
        let half = vi % 2 == 1;
        let dtype = if half {
            decoda::DType::F16
        } else {
            decoda::DType::F32
        };
        let batch = Batch::new(batch_rows, dtype);
        let draws = if vi % 3 == 2 { 3 } else { 1 };
        let want = batch.expected(Entry::Draws(draws));
        let npy = tmp(&format!("shape{vi}.npy"));
        let bytes: Vec<u8> = if half {
            batch
                .rows
                .iter()
                .flatten()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect()
        } else {
            batch
                .rows
                .iter()
                .flatten()
                .flat_map(|x| x.to_le_bytes())
                .collect()
        };
        write_npy(&npy, if half { "<f2" } else { "<f4" }, &[b, v], &bytes);
        let params = tmp(&format!("shape{vi}.json"));
        std::fs::write(&params, serde_json::to_string(&batch.requests).unwrap()).unwrap();
        for &device in devices {
            let draws_s = draws.to_string();
            let (code, out, err) = run(&[
                "sample",
                "--logits",
                npy.to_str().unwrap(),
                "--params",
                params.to_str().unwrap(),
                "--device",
                device,
                "--draws",
                &draws_s,
                "--json",
            ]);
            let label = format!("{device} V={v} B={b} {dtype} draws {draws}");
            let failed_rows = want.iter().any(|w| w[0].0.is_err());
            assert_eq!(code, if failed_rows { 1 } else { 0 }, "{label}: {err}");
            let json: serde_json::Value = serde_json::from_str(&out).unwrap();
            for (r, w) in want.iter().enumerate() {
                let row = &json["rows"][r];
                match &w[0].0 {
                    Err(e) => assert_eq!(row["error"]["kind"], e.kind(), "{label} row {r}"),
                    Ok(_) => {
                        let toks: Vec<u32> = row["tokens"]
                            .as_array()
                            .unwrap_or_else(|| panic!("{label} row {r}: {row}"))
                            .iter()
                            .map(|t| t.as_u64().unwrap() as u32)
                            .collect();
                        for (d, ((res, tie), &t)) in w.iter().zip(&toks).enumerate() {
                            let s = res.as_ref().unwrap();
                            assert!(
                                t == s.token || tie.is_tie(),
                                "{label} row {r} draw {d}: {t} vs reference {} ({:?})",
                                s.token,
                                batch.requests[r].params
                            );
                            assert!((t as usize) < v);
                        }
                        assert_eq!(toks.len(), draws, "{label} row {r}");
                        if batch.requests[r].params.logprobs.is_some() {
                            assert_eq!(
                                row["logprobs"].as_array().map(|a| a.len()),
                                Some(draws),
                                "{label} row {r}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// On a machine without a desktop session every command that probes wgpu keeps stderr
/// clean (Mesa's device-selection layer would print an XDG_RUNTIME_DIR error twice).
#[test]
fn no_display_noise_on_stderr() {
    let p = f32_npy("quiet.npy", &[4], &[0.1, 2.0, 0.3, 1.0]);
    for device in ["auto", "wgpu", "cpu"] {
        let out = bin()
            .args(["sample", "--logits", p.to_str().unwrap(), "--seed", "1"])
            .args(["--device", device])
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("WAYLAND_DISPLAY")
            .env_remove("DISPLAY")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("XDG_RUNTIME_DIR"), "--device {device}: {err}");
        if device == "auto" && out.status.success() && err.contains("using the CPU") {
            assert!(err.lines().count() == 1, "--device auto: {err}");
        }
    }
}

/// `decoda replay` runs the head over logged logits `[T, S, V]`: joins at their steps,
/// stop ids and max_tokens end slots, the seed of a slot without one is reported, and
/// every slot's tokens are those of `CpuSampler` driven step by step — on the CPU and
/// on the device alike.
#[test]
fn replay_reproduces_a_decode() {
    use decoda::testing::Rng;
    use decoda::{Backend, CpuSampler, Logits, Request};
    let (t, s, v) = (25usize, 4usize, 300usize);
    let mut rng = Rng::new(8);
    let mut logits = Vec::with_capacity(t * s * v);
    for _ in 0..t * s {
        let start = logits.len();
        logits.extend((0..v).map(|_| 2.0 * rng.normal()));
        logits[start + 11] += 3.0;
    }
    let npy = tmp("replay.npy");
    let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
    write_npy(&npy, "<f4", &[t, s, v], &bytes);
    let params = serde_json::json!([
        {"temperature": 0.0, "seed": 1, "stop": [11]},
        {"temperature": 0.8, "top_p": 0.9, "repetition_penalty": 1.2, "prompt": [1, 2, 3],
         "seed": 2, "join": 3},
        {"top_k": 20, "max_tokens": 6, "seed": 3, "join": 5, "output": [7, 7, 9],
         "frequency_penalty": 0.5},
        {"temperature": 1.2, "min_p": 0.05, "join": 2},
    ]);
    let pj = tmp("replay.json");
    std::fs::write(&pj, params.to_string()).unwrap();
    let devices: &[&str] = if have_wgpu() {
        &["cpu", "wgpu"]
    } else {
        &["cpu"]
    };
    let mut outs = Vec::new();
    for &device in devices {
        let (code, out, err) = run(&[
            "replay",
            "--logits",
            npy.to_str().unwrap(),
            "--params",
            pj.to_str().unwrap(),
            "--device",
            device,
            "--json",
        ]);
        assert_eq!(code, 0, "{device}: {err}");
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        let slots = j["slots"].as_array().unwrap().clone();
        // expected: CpuSampler driven by hand
        for (k, slot) in slots.iter().enumerate() {
            let p = &params[k];
            let mut obj = p.as_object().unwrap().clone();
            let join = obj.remove("join").and_then(|v| v.as_u64()).unwrap_or(0) as usize;
            let max = obj.remove("max_tokens").and_then(|v| v.as_u64());
            let stop: Vec<u32> = obj
                .remove("stop")
                .map(|v| serde_json::from_value(v).unwrap())
                .unwrap_or_default();
            obj.insert("seed".into(), slot["seed"].clone());
            let mut req: Request = serde_json::from_value(serde_json::Value::Object(obj)).unwrap();
            let mut want = Vec::new();
            let mut finished = serde_json::Value::Null;
            for step in join..t {
                let row = &logits[(step * s + k) * v..(step * s + k + 1) * v];
                let tok = CpuSampler::new()
                    .sample(&Logits::f32(row, 1, v).unwrap(), std::slice::from_ref(&req))
                    .unwrap()[0]
                    .as_ref()
                    .unwrap()
                    .token;
                want.push(tok);
                req.state.push(tok);
                if stop.contains(&tok) {
                    finished = "stop".into();
                    break;
                }
                if max.is_some_and(|m| want.len() as u64 >= m) {
                    finished = "length".into();
                    break;
                }
            }
            let got: Vec<u32> = slot["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(got, want, "{device}: slot {k}");
            assert_eq!(slot["finished"], finished, "{device}: slot {k}");
        }
        assert_eq!(slots[0]["finished"], "stop");
        assert_eq!(slots[2]["finished"], "length");
        outs.push(slots);
    }
    // the seeds drawn from the OS differ between runs; everything seeded is the same
    if outs.len() == 2 {
        for (k, (a, b)) in outs[0].iter().zip(&outs[1]).take(3).enumerate() {
            assert_eq!(a, b, "slot {k}: cpu vs wgpu");
        }
    }
    // a bad params file names the slot
    std::fs::write(&pj, r#"[{"top_p": 2.0}, {}, {}, {}]"#).unwrap();
    let (code, _, err) = run(&[
        "replay",
        "--logits",
        npy.to_str().unwrap(),
        "--params",
        pj.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("top_p") && err.contains("row 0"), "{err}");
}

fn tiny(name: &str, extra: &[&str]) -> PathBuf {
    let d = tmp(name);
    let mut args = vec!["tiny-model", d.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("wrote"), "{out}");
    d
}

/// `generate --json` on a tiny model: the documented keys, reproducible with a seed,
/// `--prompt` through the tokenizer, text and ids agreeing.
#[test]
fn generate_json_shape_and_reproducibility() {
    let d = tiny("gen-model", &["--seed", "3"]);
    let m = d.to_str().unwrap();
    let args = [
        "generate",
        "--model",
        m,
        "--prompt",
        "Hello",
        "--max-tokens",
        "12",
        "--seed",
        "5",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--logprobs",
        "3",
        "--device",
        "cpu",
        "--json",
    ];
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    for key in [
        "device",
        "tokens",
        "logprobs",
        "prefill_ms",
        "decode_tok_s",
        "moe",
        "seed",
        "text",
        "finish",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(v["tokens"].as_array().unwrap().len(), 12);
    assert_eq!(v["logprobs"].as_array().unwrap().len(), 12);
    assert_eq!(v["logprobs"][0]["top"].as_array().unwrap().len(), 3);
    assert_eq!(v["prompt_tokens"], 5, "byte-level: one token per byte");
    assert_eq!(v["moe"]["decode"], "unsorted");
    assert_eq!(v["finish"], "length");
    // the same ids again, and with the prompt as ids
    let (_, out2, _) = run(&args);
    let v2: serde_json::Value = serde_json::from_str(out2.trim()).unwrap();
    assert_eq!(v["tokens"], v2["tokens"]);
    let mut by_ids = args.to_vec();
    by_ids[3] = "--prompt-ids";
    by_ids[4] = "72,101,108,108,111";
    let (_, out3, _) = run(&by_ids);
    let v3: serde_json::Value = serde_json::from_str(out3.trim()).unwrap();
    assert_eq!(v["tokens"], v3["tokens"]);
    // --sort-cutoff 1 sorts the prefill, a huge one never sorts: the same greedy ids
    let greedy = |cut: &str| {
        let (code, out, err) = run(&[
            "generate",
            "--model",
            m,
            "--prompt",
            "Hello",
            "--max-tokens",
            "16",
            "--temperature",
            "0",
            "--sort-cutoff",
            cut,
            "--device",
            "cpu",
            "--json",
        ]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()
    };
    let (a, b) = (greedy("1"), greedy("1000000"));
    assert_eq!(a["moe"]["prefill"], "sorted");
    assert_eq!(b["moe"]["prefill"], "unsorted");
    assert_eq!(a["tokens"], b["tokens"]);
}

/// `generate --draft DIR --speculate K`: the tokens of `generate` without a draft for
/// the same seeds and parameters, at B = 1 (penalties, top-p, logprobs) and B = 32 (`--n`
/// with the sort cutoff at the batch, so plain steps keep each row alone as verification
/// does), with a draft made by perturbing the model's weights (acceptance above 0.3, and
/// the run saying its tokens equal plain decoding's) and an unrelated smaller one (lower
/// acceptance); on the device too (B = 1 and 32, the close draft), where a wgpu adapter
/// is; a draft of another vocabulary and `--speculate 0` exit 2.
#[test]
fn generate_draft_gives_plain_decodings_tokens() {
    let target = tiny("spec-target", &["--seed", "3"]);
    let close = tiny("spec-close", &["--seed", "3", "--perturb", "0.05"]);
    let far = tiny(
        "spec-far",
        &[
            "--seed",
            "8",
            "--layers",
            "1",
            "--hidden",
            "32",
            "--dense-layers",
            "",
        ],
    );
    let m = target.to_str().unwrap();
    let gen = |device: &str, extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "generate",
            "--model",
            m,
            "--prompt-ids",
            "72,101,108,108,111",
            "--seed",
            "5",
            "--temperature",
            "0.8",
            "--top-p",
            "0.9",
            "--repetition-penalty",
            "1.1",
            "--device",
            device,
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        serde_json::from_str(out.trim()).unwrap()
    };
    let tokens = |v: &serde_json::Value| -> Vec<serde_json::Value> {
        match v.get("sequences") {
            Some(s) => s
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x["tokens"].clone())
                .collect(),
            None => vec![v["tokens"].clone()],
        }
    };
    let mut acceptance = Vec::new();
    let runs = [("cpu", &close, "3"), ("cpu", &far, "2")];
    for batch in [
        &["--max-tokens", "40", "--logprobs", "2"][..],
        &["--max-tokens", "8", "--n", "32", "--sort-cutoff", "32"][..],
    ] {
        let mut plain = std::collections::HashMap::new();
        for &(device, draft, k) in &runs {
            let plain = plain.entry(device).or_insert_with(|| gen(device, batch));
            let mut args = batch.to_vec();
            args.extend_from_slice(&["--draft", draft.to_str().unwrap(), "--speculate", k]);
            let s = gen(device, &args);
            assert_eq!(tokens(&s), tokens(plain), "{device} {args:?}");
            if batch.contains(&"--logprobs") {
                assert_eq!(s["logprobs"], plain["logprobs"], "{args:?}");
            }
            assert_eq!(s["equal_to_plain"], true, "{s}");
            assert_eq!(s["speculate"], k.parse::<u64>().unwrap());
            for key in [
                "drafted",
                "accepted",
                "rounds",
                "plain_decode_tok_s",
                "speedup",
            ] {
                assert!(s.get(key).is_some(), "missing {key}: {s}");
            }
            acceptance.push(s["acceptance"].as_f64().unwrap());
        }
    }
    // the device (lavapipe in CI) with the close draft: its models' logits verified on
    // the host, against the run's own plain decoding sampled by the device's head (short
    // runs: lavapipe takes tens of milliseconds a call)
    if have_wgpu() {
        // (each run here is a process that builds the device's pipelines anew, seconds
        // on lavapipe: short runs)
        for batch in [
            &["--max-tokens", "8"][..],
            &["--max-tokens", "4", "--n", "32", "--sort-cutoff", "32"][..],
        ] {
            let mut args = batch.to_vec();
            args.extend_from_slice(&["--draft", close.to_str().unwrap(), "--speculate", "3"]);
            let s = gen("wgpu", &args);
            assert!(s["device"].as_str().unwrap().starts_with("wgpu"), "{s}");
            assert_eq!(s["equal_to_plain"], true, "{s}");
            assert!(s["drafted"].as_u64().unwrap() > 0, "{s}");
        }
    }
    // per batch: the perturbed draft's acceptance above 0.3 and above the unrelated one's
    for pair in acceptance.chunks(2) {
        assert!(pair[0] > 0.3 && pair[1] < pair[0], "{acceptance:?}");
    }
    let v400 = tiny("spec-v400", &["--vocab", "400"]);
    for (extra, want) in [
        (
            ["--draft", v400.to_str().unwrap(), "--speculate", "2"],
            "vocab_size 400",
        ),
        (
            ["--draft", close.to_str().unwrap(), "--speculate", "0"],
            "--speculate 0",
        ),
    ] {
        let mut args = vec![
            "generate",
            "--model",
            m,
            "--prompt-ids",
            "1,2",
            "--device",
            "cpu",
        ];
        args.extend_from_slice(&extra);
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(want), "{err}");
    }
}

/// `--prompts FILE`: one object per line with its own parameters; every sequence gets
/// its own output, and a sequence alone draws what it draws in the batch.
#[test]
fn generate_prompts_file_batches_sequences() {
    let d = tiny("gen-batch", &["--seed", "4", "--quantize", "q4g32"]);
    let m = d.to_str().unwrap();
    let f = tmp("prompts.jsonl");
    std::fs::write(
        &f,
        "{\"prompt\": \"abc\", \"seed\": 1, \"max_tokens\": 6}\n\
         {\"prompt_ids\": [256, 1, 2], \"seed\": 2, \"temperature\": 0, \"max_tokens\": 9}\n\n\
         {\"prompt\": \"xyz!\", \"seed\": 3, \"top_k\": 5, \"max_tokens\": 4, \"stop\": [300]}\n",
    )
    .unwrap();
    let (code, out, err) = run(&[
        "generate",
        "--model",
        m,
        "--prompts",
        f.to_str().unwrap(),
        "--device",
        "cpu",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let seqs = v["sequences"].as_array().unwrap();
    assert_eq!(seqs.len(), 3);
    assert_eq!(seqs[0]["tokens"].as_array().unwrap().len(), 6);
    assert_eq!(seqs[1]["tokens"].as_array().unwrap().len(), 9);
    assert!(seqs[2]["tokens"].as_array().unwrap().len() <= 4);
    let (_, alone, _) = run(&[
        "generate",
        "--model",
        m,
        "--prompt-ids",
        "256,1,2",
        "--seed",
        "2",
        "--temperature",
        "0",
        "--max-tokens",
        "9",
        "--device",
        "cpu",
        "--json",
    ]);
    let alone: serde_json::Value = serde_json::from_str(alone.trim()).unwrap();
    assert_eq!(alone["tokens"], seqs[1]["tokens"]);
}

#[test]
fn generate_bad_input_exits_2_naming_the_problem() {
    let d = tiny("gen-bad", &[]);
    let m = d.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--prompt-ids", "1,999999"], "999999"),
        (vec!["--prompt-ids", "1,x"], "\"x\""),
        (vec!["--prompt-ids", "1", "--top-p", "2"], "top_p"),
        (
            vec!["--prompt-ids", "1", "--sort-cutoff", "0"],
            "--sort-cutoff",
        ),
        (vec![], "--prompt"),
        // the tiny checkpoint holds 4,096 positions
        (
            vec!["--prompt-ids", "1,2", "--max-tokens", "5000"],
            "max_position_embeddings",
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec!["generate", "--model", m, "--device", "cpu"];
        args.extend(extra.iter());
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let (code, _, err) = run(&[
        "generate",
        "--model",
        "/nonexistent",
        "--prompt-ids",
        "1",
        "--device",
        "cpu",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent"), "{err}");
    // a missing directory is named as missing, whatever the prompt needs from it
    let (code, _, err) = run(&[
        "generate",
        "--model",
        "/nonexistent",
        "--prompt",
        "hi",
        "--device",
        "cpu",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("/nonexistent") && err.contains("no such directory"),
        "{err}"
    );
    let (code, _, err) = run(&[
        "tiny-model",
        tmp("q").to_str().unwrap(),
        "--quantize",
        "q5g7",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("q5g7"), "{err}");
    // a real shape by name; its dimensions are not flags beside it
    let (code, _, err) = run(&["tiny-model", tmp("p").to_str().unwrap(), "--preset", "gpt5"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("gpt5") && err.contains("qwen3-30b-a3b"),
        "{err}"
    );
    let (code, _, err) = run(&[
        "tiny-model",
        tmp("p2").to_str().unwrap(),
        "--preset",
        "qwen3-30b-a3b",
        "--hidden",
        "64",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("--hidden"), "{err}");
}

/// The device runs the same greedy decode as the CPU (lavapipe in CI); and with DRY,
/// in the device head (no note that it samples on the host; the head's step is 3
/// dispatches with the probe's pass that computes DRY); top-n-σ too.
#[test]
fn generate_on_wgpu_matches_the_cpu() {
    if !have_wgpu() {
        return;
    }
    let d = tiny("gen-wgpu", &["--seed", "9"]);
    let m = d.to_str().unwrap();
    let ids_with = |dev: &str, extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            m,
            "--prompt",
            "Hello, world",
            "--max-tokens",
            "24",
            "--temperature",
            "0",
            "--device",
            dev,
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        assert!(!err.contains("host"), "{dev}: {err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        // the loop's structure: steps, host time per step, the device's dispatches
        assert!(v["decode_steps"].as_u64().is_some_and(|n| n >= 24), "{v}");
        assert!(
            v["host_us_per_step"].as_f64().is_some_and(|t| t > 0.0),
            "{v}"
        );
        (
            v["tokens"].clone(),
            v["device"].as_str().unwrap().to_string(),
            v["dispatches_per_step"].clone(),
        )
    };
    let ids = |dev: &str| ids_with(dev, &[]);
    let (c, cn, cd) = ids("cpu");
    let (g, gn, gd) = ids("wgpu");
    assert_eq!(cn, "cpu");
    assert!(gn.starts_with("wgpu"), "{gn}");
    assert_eq!(c, g);
    // the CPU records no dispatches; the tiny model's decode step on the device is the
    // head's 2 (greedy: scan, settle_finish; 3 unfused) and the forward's 26: 8 for
    // each of its two MoE layers (q/k/v with the norm before it, attention's two passes
    // (the first norms and rotates q and k), o, the router with the norm before it,
    // routing, act, down_combine), 6 for its dense one, and the embedding, final norm,
    // LM head and positions
    let unfused = usize::from(!fused());
    assert_eq!(cd, serde_json::Value::Null);
    assert_eq!(gd, 28 + unfused);
    // sampled on the host, the device still runs the forward's 26
    let (h, _, hd) = ids_with("wgpu", &["--host-sampling"]);
    assert_eq!(h, c);
    assert_eq!(hd, 26);
    let dry = [
        "--dry-multiplier",
        "3",
        "--dry-allowed-length",
        "1",
        "--dry-breaker",
        " ",
    ];
    let (c, _, _) = ids_with("cpu", &dry);
    let (g, _, gd) = ids_with("wgpu", &dry);
    assert_eq!(c, g);
    // (probe, sample, pick, scan, settle_finish, lp, finish: the probe's one sample
    // and pick, as the list holds a row of the tiny model's 320 tokens whole; lp and
    // finish for a row on the full-row path; unfused, settle_finish is three:
    // settle_first, settle_rest, draw_finish)
    assert_eq!(gd, 33 + 2 * unfused);
    // top-n-σ, XTC and typical-p in the device head: no note, the same run twice, and
    // the head's dispatches: its sampling passes, and the phases (the probe builds their
    // candidate list: XTC's when its coin fires). Sampled tokens are not compared with
    // the CPU's: the two forwards' logits differ in rounding.
    let sampled = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            m,
            "--prompt",
            "Hello, world",
            "--max-tokens",
            "12",
            "--temperature",
            "0.9",
            "--seed",
            "4",
            "--device",
            "wgpu",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        assert!(!err.contains("host"), "{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        (v["tokens"].clone(), v["dispatches_per_step"].clone())
    };
    // (each run is a process that builds every pipeline anew, seconds on lavapipe: the
    // quick tier runs the three stages together, twice; the full tier each alone too)
    let together: &[&str] = &[
        "--top-n-sigma",
        "1.5",
        "--xtc-probability",
        "0.8",
        "--xtc-threshold",
        "0.02",
        "--typical-p",
        "0.7",
    ];
    // (33, and two for each phase of the full-row path the row's stages have:
    // top-n-σ's one, XTC's two, typical-p's four)
    let mut runs = vec![(together, 47)];
    if decoda::testing::full_tier() {
        runs.extend([
            (&together[..2], 35),
            (&together[2..6], 37),
            (&together[6..], 41),
        ]);
    }
    for (i, (extra, dispatches)) in runs.into_iter().enumerate() {
        let (first, sd) = sampled(extra);
        if i == 0 || decoda::testing::full_tier() {
            assert_eq!(sampled(extra).0, first, "{extra:?}");
        }
        assert_eq!(sd, dispatches + 2 * unfused, "{extra:?}");
    }
}

/// `sample --mask`: int32 masks [B, W] (or one [W] for every row), the same masks as a
/// `--params` key, and the errors: a wrong width names the row and `allowed`, a wrong
/// element type or row count names the file.
#[test]
fn sample_with_token_masks() {
    let v: usize = 100;
    let w = v.div_ceil(32);
    let vals: Vec<f32> = (0..2 * v).map(|i| (i % v) as f32 * 0.1).collect();
    let logits = f32_npy("mask-logits.npy", &[2, v], &vals);
    // row 0 may draw 3 or 40 only; row 1 only 97 (the smallest logit is 0: token 0 would
    // never win greedy, 97 is below the unmasked winner 99)
    let mut words = vec![0i32; 2 * w];
    words[0] |= 1 << 3;
    words[1] |= 1 << (40 - 32);
    words[w + 3] |= 1 << (97 - 96);
    let bytes: Vec<u8> = words.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mask = tmp("mask.npy");
    write_npy(&mask, "<i4", &[2, w], &bytes);
    let base = [
        "sample",
        "--logits",
        logits.to_str().unwrap(),
        "--device",
        "cpu",
    ];
    let tokens = |extra: &[&str]| -> Vec<u64> {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        args.push("--json");
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["tokens"][0].as_u64().unwrap())
            .collect()
    };
    let m = mask.to_str().unwrap();
    assert_eq!(tokens(&["--temperature", "0", "--mask", m]), [40, 97]);
    for seed in 0..20 {
        let s = seed.to_string();
        let t = tokens(&["--mask", m, "--seed", &s]);
        assert!((t[0] == 3 || t[0] == 40) && t[1] == 97, "{t:?}");
    }
    // the same masks through --params
    let row = |ws: &[i32]| -> String {
        let u: Vec<String> = ws.iter().map(|&x| (x as u32).to_string()).collect();
        format!(
            "{{\"temperature\": 0, \"seed\": 1, \"allowed\": [{}]}}",
            u.join(", ")
        )
    };
    let params = tmp("mask-params.json");
    std::fs::write(
        &params,
        format!("[{}, {}]", row(&words[..w]), row(&words[w..])),
    )
    .unwrap();
    assert_eq!(tokens(&["--params", params.to_str().unwrap()]), [40, 97]);
    // errors
    let bad = tmp("mask-wide.npy");
    write_npy(&bad, "<i4", &[2, w + 1], &vec![0u8; 8 * (w + 1)]);
    let mut args = base.to_vec();
    args.extend_from_slice(&["--mask", bad.to_str().unwrap()]);
    let (code, _, err) = run(&args);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("row 0") && err.contains("allowed"), "{err}");
    let three = tmp("mask-three.npy");
    write_npy(&three, "<i4", &[3, w], &vec![0u8; 12 * w]);
    args[6] = three.to_str().unwrap();
    let (code, _, err) = run(&args);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("3 rows"), "{err}");
    let float = tmp("mask-f4.npy");
    write_npy(&float, "<f4", &[w], &vec![0u8; 4 * w]);
    args[6] = float.to_str().unwrap();
    let (code, _, err) = run(&args);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("int32"), "{err}");
}

/// A grammar mask (lowercase letters only) as an int32 .npy over `v` tokens.
fn lowercase_mask(name: &str, v: usize) -> PathBuf {
    let w = v.div_ceil(32);
    let mut words = vec![0u32; w];
    for t in 97..=122usize {
        words[t / 32] |= 1 << (t % 32);
    }
    let p = tmp(name);
    let bytes: Vec<u8> = words.iter().flat_map(|x| x.to_le_bytes()).collect();
    write_npy(&p, "<i4", &[w], &bytes);
    p
}

fn gen_json(args: &[&str]) -> serde_json::Value {
    let (code, out, err) = run(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(out.trim()).unwrap()
}

/// `generate --n`: N sequences of one prompt with seeds seed.., the prompt prefilled
/// once, each the tokens it draws alone; `--grammar-mask` keeps every token in the mask;
/// `--stop-str` ends a sequence at the string and cuts its text before it; the later
/// stages as flags and `--dry-breaker` text; on the CPU and (when present) the device.
#[test]
fn generate_n_stop_strings_and_grammar_mask() {
    let d = tiny("gen-n", &["--seed", "6"]);
    let m = d.to_str().unwrap();
    let mask = lowercase_mask("gen-mask.npy", 320);
    let mk = mask.to_str().unwrap();
    let devices: &[&str] = if have_wgpu() {
        &["cpu", "wgpu"]
    } else {
        &["cpu"]
    };
    for &device in devices {
        let base = [
            "generate",
            "--model",
            m,
            "--prompt",
            "once upon",
            "--max-tokens",
            "14",
            "--temperature",
            "0.9",
            "--grammar-mask",
            mk,
            "--dry-multiplier",
            "0.7",
            "--dry-breaker",
            " ",
            "--typical-p",
            "0.95",
            "--device",
            device,
            "--json",
        ];
        let mut n3 = base.to_vec();
        n3.extend_from_slice(&["--n", "3", "--seed", "40"]);
        let v = gen_json(&n3);
        assert_eq!(
            v["prefill_tokens"], 9,
            "{device}: the prompt prefilled once: {v}"
        );
        assert_eq!(v["prefills_shared"], 2, "{device}: {v}");
        let seqs = v["sequences"].as_array().unwrap();
        assert_eq!(seqs.len(), 3);
        // each sequence's tokens are those it draws alone (on the device the first and
        // the last in the quick tier: each run is a process building its pipelines)
        let mut first = None;
        for (k, s) in seqs.iter().enumerate() {
            assert_eq!(s["seed"], 40 + k as u64);
            for t in s["tokens"].as_array().unwrap() {
                let t = t.as_u64().unwrap();
                assert!(
                    (97..=122).contains(&t),
                    "{device}: token {t} outside the mask"
                );
            }
            if k == 1 && device != "cpu" && !decoda::testing::full_tier() {
                continue;
            }
            let seed = (40 + k).to_string();
            let mut one = base.to_vec();
            one.extend_from_slice(&["--seed", &seed]);
            let alone = gen_json(&one);
            assert_eq!(s["tokens"], alone["tokens"], "{device}: sequence {k} alone");
            if k == 0 {
                first = Some(alone);
            }
        }
        // a stop string taken from the text: the sequence ends there, cut before it
        let mut one = base.to_vec();
        one.extend_from_slice(&["--seed", "40"]);
        let full = first.expect("sequence 0 alone");
        let text = full["text"].as_str().unwrap().to_string();
        assert_eq!(text.len(), 14, "one ASCII byte per token: {text:?}");
        let stop = &text[6..8];
        let at = text.find(stop).unwrap();
        one.extend_from_slice(&["--stop-str", stop]);
        let cut = gen_json(&one);
        assert_eq!(cut["text"], text[..at], "{device}: cut before {stop:?}");
        assert_eq!(cut["finish"], "stop");
        assert_eq!(
            cut["tokens"].as_array().unwrap()[..],
            full["tokens"].as_array().unwrap()[..at],
            "{device}"
        );
    }
    // --n with --prompts, and --n 0, are refused
    let (code, _, err) = run(&["generate", "--model", m, "--prompt", "a", "--n", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--n"), "{err}");
}

/// `sample --kept`: the kept distribution per draw in JSON (`kept_size`, `kept` with
/// ids and probabilities, most likely first), the later stages as flags and `--params`
/// keys, and `explain` naming them.
#[test]
fn sample_kept_and_later_stages() {
    let vals: Vec<f32> = (0..64).map(|i| ((i * 37 % 64) as f32) / 9.0).collect();
    let logits = f32_npy("kept-logits.npy", &[64], &vals);
    let l = logits.to_str().unwrap();
    let (code, out, err) = run(&[
        "sample",
        "--logits",
        l,
        "--seed",
        "3",
        "--top-k",
        "10",
        "--kept",
        "4",
        "--draws",
        "2",
        "--xtc-probability",
        "1",
        "--xtc-threshold",
        "0.1",
        "--top-n-sigma",
        "2",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let row = &v["rows"][0];
    assert_eq!(row["kept_size"].as_array().unwrap().len(), 2, "{row}");
    let kept = row["kept"][0].as_array().unwrap();
    assert!(kept.len() <= 4 && !kept.is_empty(), "{row}");
    let ps: Vec<f64> = kept.iter().map(|k| k["p"].as_f64().unwrap()).collect();
    assert!(
        ps.windows(2).all(|w| w[0] >= w[1]),
        "most likely first: {row}"
    );
    // the same through --params, with DRY over a repeating history
    let pj = tmp("kept-params.json");
    std::fs::write(
        &pj,
        r#"[{"seed": 3, "top_k": 10, "kept": 4, "xtc_probability": 1, "xtc_threshold": 0.1,
             "top_n_sigma": 2, "dry_multiplier": 0.5, "dry_sequence_breakers": [[7]],
             "output": [1, 2, 3, 1, 2]}]"#,
    )
    .unwrap();
    let (code, out, err) = run(&[
        "sample",
        "--logits",
        l,
        "--params",
        pj.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["rows"][0]["kept"][0].as_array().is_some(), "{v}");
    // out of range: an error naming field and row
    let (code, _, err) = run(&["sample", "--logits", l, "--typical-p", "0"]);
    assert_eq!(code, 2);
    assert!(err.contains("typical_p") && err.contains("row 0"), "{err}");
    let (code, _, err) = run(&["sample", "--logits", l, "--dry-sequence-breakers", "1;x"]);
    assert_eq!(code, 2);
    assert!(err.contains("--dry-sequence-breakers"), "{err}");
    // explain shows the later stages
    let (code, out, err) = run(&[
        "explain",
        "--logits",
        l,
        "--seed",
        "3",
        "--top-n-sigma",
        "1.5",
        "--typical-p",
        "0.8",
        "--xtc-probability",
        "1",
        "--xtc-threshold",
        "0.05",
    ]);
    assert_eq!(code, 0, "{err}");
    for stage in ["top-n-sigma", "typical-p", "xtc"] {
        assert!(out.contains(&format!("== {stage} ==")), "{stage}: {out}");
    }
}

/// `replay --mask [T, S, W]`: each slot's mask at its step; a masked step draws inside
/// the mask, the others as without masks.
#[test]
fn replay_with_masks() {
    use decoda::testing::Rng;
    let (t, s, v) = (6usize, 2usize, 100usize);
    let mut rng = Rng::new(2);
    let logits: Vec<f32> = (0..t * s * v).map(|_| rng.normal()).collect();
    let npy = tmp("replay-mask-logits.npy");
    let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
    write_npy(&npy, "<f4", &[t, s, v], &bytes);
    let w = v.div_ceil(32);
    // slot 0 at even steps may draw only 5 or 6; every other (step, slot) anything
    let mut words = vec![u32::MAX; t * s * w];
    for step in (0..t).step_by(2) {
        let m = &mut words[(step * s) * w..(step * s + 1) * w];
        m.fill(0);
        m[0] = (1 << 5) | (1 << 6);
    }
    let mask = tmp("replay-mask.npy");
    let mb: Vec<u8> = words.iter().flat_map(|x| x.to_le_bytes()).collect();
    write_npy(&mask, "<u4", &[t, s, w], &mb);
    let pj = tmp("replay-mask.json");
    std::fs::write(&pj, r#"[{"seed": 1}, {"seed": 2, "temperature": 0}]"#).unwrap();
    let args = [
        "replay",
        "--logits",
        npy.to_str().unwrap(),
        "--params",
        pj.to_str().unwrap(),
        "--json",
    ];
    let (code, plain, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    let mut masked_args = args.to_vec();
    masked_args.extend_from_slice(&["--mask", mask.to_str().unwrap()]);
    let (code, masked, err) = run(&masked_args);
    assert_eq!(code, 0, "{err}");
    let plain: serde_json::Value = serde_json::from_str(plain.trim()).unwrap();
    let masked: serde_json::Value = serde_json::from_str(masked.trim()).unwrap();
    let toks = |v: &serde_json::Value, slot: usize| -> Vec<u64> {
        v["slots"][slot]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    };
    for (step, &tok) in toks(&masked, 0).iter().enumerate() {
        if step % 2 == 0 {
            assert!(tok == 5 || tok == 6, "step {step}: {tok} outside the mask");
        }
    }
    assert_eq!(toks(&masked, 1), toks(&plain, 1), "slot 1 has no mask");
    // a mask of the wrong shape is refused
    let bad = tmp("replay-mask-bad.npy");
    write_npy(&bad, "<u4", &[t, s, w + 1], &vec![0u8; t * s * (w + 1) * 4]);
    let mut bad_args = args.to_vec();
    bad_args.extend_from_slice(&["--mask", bad.to_str().unwrap()]);
    let (code, _, err) = run(&bad_args);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("masks of shape"), "{err}");
}

/// `generate --profile` and `moe-bench --profile` on the device: per kernel, the device
/// time per step beside the plan and the bytes' time at the given bandwidth, as JSON;
/// refused on the CPU and without --profile.
#[test]
fn profile_generate_and_moe_bench() {
    let d = tiny("profile-model", &["--seed", "3"]);
    let m = d.to_str().unwrap();
    let (code, _, err) = run(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "Hi",
        "--device",
        "cpu",
        "--profile",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--profile"), "{err}");
    let (code, _, err) = run(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "Hi",
        "--bandwidth-gbs",
        "10",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--bandwidth-gbs"), "{err}");
    if !have_wgpu() {
        return;
    }
    let (code, out, err) = run(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "Hi",
        "--max-tokens",
        "3",
        "--seed",
        "1",
        "--device",
        "wgpu",
        "--profile",
        "--bandwidth-gbs",
        "100",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let p = &v["profile"];
    assert_eq!(p["steps"], 3, "{p}");
    assert_eq!(p["bandwidth_gbs"], 100.0);
    assert_eq!(p["bandwidth"], "given");
    let kernels = p["kernels"].as_array().unwrap();
    for k in [
        "sample.scan",
        "model.linear",
        "model.attend_part",
        "model.attend_merge",
        "moe.act",
        "moe.down_combine",
    ] {
        let line = kernels
            .iter()
            .find(|l| l["kernel"] == k)
            .unwrap_or_else(|| panic!("{k}: {p}"));
        assert!(line["workgroups"].as_f64().unwrap() >= 1.0, "{line}");
        assert!(line["device_us"].as_f64().is_some(), "{line}");
        // the bytes' time is the bytes at 100 GB/s
        let bytes = line["bytes_read"].as_f64().unwrap() + line["bytes_written"].as_f64().unwrap();
        let us = line["bytes_us"].as_f64().unwrap();
        assert!((us - bytes / 1e5).abs() <= 0.01, "{line}");
    }
    assert!(p["total"]["dispatches"].as_f64().unwrap() > 10.0, "{p}");
    let (code, out, err) = run(&[
        "moe-bench",
        "--experts",
        "8",
        "--top-k",
        "2",
        "--hidden",
        "64",
        "--intermediate",
        "64",
        "--tokens",
        "1",
        "--time-ms",
        "1",
        "--device",
        "wgpu",
        "--dtype",
        "q8g64",
        "--profile",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    for (key, kernels) in [
        (
            "profile_sorted",
            &[
                "moe.count",
                "moe.place",
                "moe.act_tiled",
                "moe.down_tiled",
                "moe.combine",
            ][..],
        ),
        ("profile_unsorted", &["moe.act", "moe.down_combine"][..]),
    ] {
        let got: Vec<&str> = first[key]["kernels"]
            .as_array()
            .unwrap_or_else(|| panic!("{key}: {first}"))
            .iter()
            .map(|l| l["kernel"].as_str().unwrap())
            .collect();
        assert_eq!(got, kernels, "{first}");
        assert_eq!(first[key]["bandwidth"], "measured copy rate");
    }
}

/// A reader that is gone before the output comes (`decoda generate ... | false`) ends
/// the process quietly: no panic on the closed pipe.
#[cfg(unix)]
#[test]
fn closed_stdout_is_no_panic() {
    use std::io::Read;
    let d = tiny("pipe-model", &["--seed", "4"]);
    let mut child = bin()
        .args(["generate", "--model", d.to_str().unwrap(), "--prompt", "Hi"])
        .args(["--max-tokens", "4", "--device", "cpu"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // the reader closes its end before the model has run
    drop(child.stdout.take());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    child.wait().unwrap();
    assert!(!err.contains("panicked"), "{err}");
}

/// `decoda verify`: drafted tokens against the target's K + 1 positions give the tokens
/// plain decoding (`decoda sample` position by position, the history extended by each
/// token) gives, up to the first disagreement: a draft of plain decoding's own tokens is
/// accepted whole, one with its second token changed stops there with the target's draw;
/// the device agrees; bad drafts exit 2 naming the problem.
#[test]
fn verify_gives_plain_decodings_tokens() {
    let (b, k, v) = (2usize, 3usize, 50usize);
    let vals: Vec<f32> = (0..b * (k + 1) * v)
        .map(|i| ((i * 7919 % 211) as f32) / 37.0 - 2.5)
        .collect();
    let logits = f32_npy("verify-logits.npy", &[b, k + 1, v], &vals);
    let flags = [
        "--temperature",
        "0.8",
        "--repetition-penalty",
        "1.4",
        "--seed",
        "11",
        "--prompt",
        "5,6",
    ];
    // plain decoding of each row, one position at a time
    let mut plain = vec![Vec::new(); b];
    for (r, toks) in plain.iter_mut().enumerate() {
        for i in 0..=k {
            let at = (r * (k + 1) + i) * v;
            let p = f32_npy(&format!("verify-pos-{r}-{i}.npy"), &[v], &vals[at..at + v]);
            let step = i.to_string();
            let output: Vec<String> = toks.iter().map(|t: &u32| t.to_string()).collect();
            let output = output.join(",");
            let mut args = vec!["sample", "--logits", p.to_str().unwrap(), "--device", "cpu"];
            args.extend_from_slice(&flags);
            args.extend_from_slice(&["--step", &step, "--json"]);
            if !output.is_empty() {
                args.extend_from_slice(&["--output", &output]);
            }
            let (code, out, err) = run(&args);
            assert_eq!(code, 0, "{err}");
            let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
            toks.push(j["rows"][0]["tokens"][0].as_u64().unwrap() as u32);
        }
    }
    // row 0 drafts plain decoding's tokens; row 1 the same with its second one changed
    let mut draft: Vec<u32> = plain[0][..k].to_vec();
    let mut other = plain[1][..k].to_vec();
    other[1] = (other[1] + 1) % v as u32;
    draft.extend_from_slice(&other);
    let dp = tmp("verify-draft.npy");
    let bytes: Vec<u8> = draft.iter().flat_map(|t| t.to_le_bytes()).collect();
    write_npy(&dp, "<u4", &[b, k], &bytes);
    let verify = |device: &str| {
        let mut args = vec![
            "verify",
            "--logits",
            logits.to_str().unwrap(),
            "--draft",
            dp.to_str().unwrap(),
            "--device",
            device,
            "--json",
        ];
        args.extend_from_slice(&flags);
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()
    };
    let j = verify("cpu");
    assert_eq!(j["rows"][0]["accepted"], 3, "{j}");
    assert_eq!(j["rows"][0]["tokens"], serde_json::json!(plain[0]), "{j}");
    assert_eq!(j["rows"][1]["accepted"], 1, "{j}");
    assert_eq!(
        j["rows"][1]["tokens"],
        serde_json::json!(plain[1][..2]),
        "{j}"
    );
    assert_eq!(j["acceptance"], 4.0 / 6.0, "{j}");
    if have_wgpu() {
        let g = verify("wgpu");
        assert_eq!(g["rows"], j["rows"], "{g}");
    }
    // the rejection rule with the target's own rows as the draft's (p = q): every
    // drafted token stands, and row 0's last token is plain decoding's
    let first_k: Vec<f32> = (0..b)
        .flat_map(|r| vals[r * (k + 1) * v..][..k * v].iter().copied())
        .collect();
    let dl = f32_npy("verify-draft-logits.npy", &[b, k, v], &first_k);
    let mut args = vec![
        "verify",
        "--logits",
        logits.to_str().unwrap(),
        "--draft",
        dp.to_str().unwrap(),
        "--rule",
        "rejection",
        "--draft-logits",
        dl.to_str().unwrap(),
        "--device",
        "cpu",
        "--json",
    ];
    args.extend_from_slice(&flags);
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(r["rows"][0]["accepted"], 3, "{r}");
    assert_eq!(r["rows"][1]["accepted"], 3, "{r}");
    assert_eq!(r["rows"][0]["tokens"], serde_json::json!(plain[0]), "{r}");
    // draft logits belong to the rejection rule
    let (code, _, err) = run(&[
        "verify",
        "--logits",
        logits.to_str().unwrap(),
        "--draft",
        dp.to_str().unwrap(),
        "--draft-logits",
        dl.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--rule rejection"), "{err}");
    // drafts for another K, and a drafted id past V
    let short = tmp("verify-short.npy");
    write_npy(&short, "<u4", &[b, 2], &bytes[..16]);
    let (code, _, err) = run(&[
        "verify",
        "--logits",
        logits.to_str().unwrap(),
        "--draft",
        short.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("[B, K + 1, V]"), "{err}");
    let far = tmp("verify-far.npy");
    let mut bad = draft.clone();
    bad[4] = v as u32;
    let bytes: Vec<u8> = bad.iter().flat_map(|t| t.to_le_bytes()).collect();
    write_npy(&far, "<u4", &[b, k], &bytes);
    let (code, _, err) = run(&[
        "verify",
        "--logits",
        logits.to_str().unwrap(),
        "--draft",
        far.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("row 1") && err.contains("draft") && err.contains("50"),
        "{err}"
    );
}
