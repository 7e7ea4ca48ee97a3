//! Hostile, truncated and inconsistent checkpoints: loading one is an error that names
//! what is wrong, never a panic, and a checkpoint that still loads runs a decode step
//! without one. Mutations: truncated files, header lengths that overflow or point past
//! the end, random bytes in the header, tensor shapes and offsets that disagree with the
//! bytes, config fields set to zero, huge, negative or mistyped values, and shard indexes
//! that point outside the directory or at missing files.
//! `DECODA_FUZZ_CASES` sets the number of cases per mutation (default 48).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use decoda::head::SlotRequest;
use decoda::model::{generate, Qwen3Moe, Sequence};
use decoda::testing::tiny::TinySpec;
use decoda::CpuEngine;
use proptest::prelude::*;
use serde_json::Value;

fn cases() -> u32 {
    std::env::var("DECODA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

fn spec(quantize: bool) -> TinySpec {
    TinySpec {
        hidden: 64,
        layers: 2,
        heads: 2,
        kv_heads: 1,
        head_dim: 16,
        vocab: 260,
        experts: 4,
        top_k: 2,
        moe_intermediate: 64,
        intermediate: 64,
        dense_layers: vec![1],
        quantize: quantize.then(|| decoda::moe::Affine::new(4, 32).unwrap()),
        ..TinySpec::default()
    }
}

/// A fresh copy of a pristine checkpoint.
fn pristine(tag: &str, quantize: bool) -> PathBuf {
    let d = std::env::temp_dir().join(format!("decoda-fuzz-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    spec(quantize).write(&d).unwrap();
    d
}

/// Loads `dir`; if it loads, runs a short decode. Panics propagate (the test fails);
/// errors must name something.
fn exercise(dir: &Path) -> Result<(), String> {
    let m = match Qwen3Moe::load(dir, 4) {
        Ok(m) => m,
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.len() > 10, "an error that says nothing: {msg:?}");
            return Err(msg);
        }
    };
    let mut e = CpuEngine::new(Arc::new(m), 1).map_err(|e| e.to_string())?;
    let seq = Sequence {
        prompt: vec![1, 2, 3],
        request: SlotRequest::new(decoda::SamplingParams::default())
            .seed(1)
            .max_tokens(3),
    };
    generate(&mut e, &[seq], &mut |_| {})
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn header_len(bytes: &[u8]) -> usize {
    u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn truncated_files(frac in 0.0f64..1.0, quant in any::<bool>()) {
        let d = pristine("trunc", quant);
        let p = d.join("model.safetensors");
        let bytes = std::fs::read(&p).unwrap();
        let cut = ((bytes.len() as f64) * frac) as usize;
        std::fs::write(&p, &bytes[..cut]).unwrap();
        prop_assert!(exercise(&d).is_err(), "a file cut at {cut} of {} loaded", bytes.len());
    }

    #[test]
    fn header_lengths(len in prop_oneof![Just(u64::MAX), Just(u64::MAX / 2), Just(1u64 << 40), 0u64..100_000]) {
        let d = pristine("hlen", false);
        let p = d.join("model.safetensors");
        let mut bytes = std::fs::read(&p).unwrap();
        let real = header_len(&bytes) as u64;
        bytes[..8].copy_from_slice(&len.to_le_bytes());
        std::fs::write(&p, &bytes).unwrap();
        let r = exercise(&d);
        prop_assert!(len == real || r.is_err(), "header length {len} (real {real}) loaded");
    }

    #[test]
    fn header_bytes(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let d = pristine("hbytes", false);
        let p = d.join("model.safetensors");
        let mut bytes = std::fs::read(&p).unwrap();
        let h = header_len(&bytes);
        for (i, b) in flips {
            let at = 8 + i.index(h);
            bytes[at] = b;
        }
        std::fs::write(&p, &bytes).unwrap();
        let _ = exercise(&d);
    }

    #[test]
    fn shapes_and_offsets(which in any::<prop::sample::Index>(), dim in 0usize..3, value in prop_oneof![Just(0usize), Just(1), Just(usize::MAX / 4), 2usize..5000], offsets in any::<bool>()) {
        let d = pristine("shapes", false);
        let p = d.join("model.safetensors");
        let bytes = std::fs::read(&p).unwrap();
        let h = header_len(&bytes);
        let mut header: Value = serde_json::from_slice(&bytes[8..8 + h]).unwrap();
        let names: Vec<String> = header.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect();
        let name = &names[which.index(names.len())];
        let t = &mut header[name];
        if offsets {
            t["data_offsets"][dim % 2] = Value::from(value as u64);
        } else {
            let shape = t["shape"].as_array_mut().unwrap();
            let k = dim % shape.len().max(1);
            if shape.is_empty() { shape.push(Value::from(value as u64)); } else { shape[k] = Value::from(value as u64); }
        }
        let mut text = serde_json::to_vec(&header).unwrap();
        while !text.len().is_multiple_of(8) { text.push(b' '); }
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend(&text);
        out.extend(&bytes[8 + h..]);
        std::fs::write(&p, &out).unwrap();
        let _ = exercise(&d);
    }

    #[test]
    fn config_fields(field in prop::sample::select(vec![
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "rms_norm_eps", "rope_theta", "vocab_size", "tie_word_embeddings", "num_experts",
        "num_experts_per_tok", "moe_intermediate_size", "intermediate_size", "norm_topk_prob",
        "decoder_sparse_step", "mlp_only_layers", "quantization", "rope_parameters", "model_type",
        "rope_scaling", "hidden_act",
    ]), value in prop::sample::select(vec![
        "0", "-1", "1", "3", "1000000000", "1e18", "18446744073709551615", "\"x\"", "null", "true",
        "3.5", "[]", "[0, 99]", "{}", "{\"group_size\": 0, \"bits\": 4}", "{\"group_size\": 64, \"bits\": 3}",
        "{\"rope_type\": \"yarn\", \"factor\": 4}", "NaN",
    ]), quant in any::<bool>()) {
        let d = pristine("config", quant);
        let p = d.join("config.json");
        let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let text = match serde_json::from_str::<Value>(value) {
            Ok(v) => { c[field] = v; serde_json::to_string(&c).unwrap() }
            // not JSON at all (NaN): the file is broken
            Err(_) => serde_json::to_string(&c).unwrap().replacen(&format!("\"{field}\":"), &format!("\"{field}\":{value},\"_was\":"), 1),
        };
        std::fs::write(&p, text).unwrap();
        let _ = exercise(&d);
    }
}

#[test]
fn zero_heads_and_a_billion_experts_are_errors_naming_the_field() {
    for (field, value) in [
        ("num_attention_heads", 0u64),
        ("num_experts", 1_000_000_000),
        ("vocab_size", 1 << 40),
        ("hidden_size", 0),
    ] {
        let d = pristine("named", false);
        let p = d.join("config.json");
        let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        c[field] = Value::from(value);
        std::fs::write(&p, serde_json::to_string(&c).unwrap()).unwrap();
        let e = exercise(&d).unwrap_err();
        assert!(
            e.contains(field) && e.contains(&value.to_string()),
            "{field} = {value}: {e}"
        );
    }
}

#[test]
fn missing_and_misshaped_tensors_name_the_tensor_and_both_shapes() {
    let d = pristine("misshaped", false);
    let p = d.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    c["vocab_size"] = Value::from(300u64);
    std::fs::write(&p, serde_json::to_string(&c).unwrap()).unwrap();
    let e = exercise(&d).unwrap_err();
    assert!(
        e.contains("model.embed_tokens.weight")
            && e.contains("[260, 64]")
            && e.contains("[300, 64]"),
        "{e}"
    );
    let d = pristine("missing", false);
    let p = d.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    c["num_hidden_layers"] = Value::from(3u64);
    std::fs::write(&p, serde_json::to_string(&c).unwrap()).unwrap();
    let e = exercise(&d).unwrap_err();
    assert!(
        e.contains("model.layers.2.") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn shard_indexes_outside_the_directory_or_missing_are_errors() {
    let base = std::env::temp_dir().join(format!("decoda-fuzz-shards-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    TinySpec {
        shards: 2,
        ..spec(false)
    }
    .write(&base)
    .unwrap();
    exercise(&base).expect("the sharded checkpoint loads and runs");
    let idx = base.join("model.safetensors.index.json");
    let good = std::fs::read_to_string(&idx).unwrap();
    for bad in [
        "../../etc/passwd",
        "/etc/passwd",
        "model-00009-of-00009.safetensors",
    ] {
        let mut v: Value = serde_json::from_str(&good).unwrap();
        let first = v["weight_map"]
            .as_object()
            .unwrap()
            .keys()
            .next()
            .unwrap()
            .clone();
        v["weight_map"][&first] = Value::from(bad);
        std::fs::write(&idx, serde_json::to_string(&v).unwrap()).unwrap();
        let e = exercise(&base).unwrap_err();
        assert!(e.contains("index") || e.contains(bad), "{bad}: {e}");
    }
    std::fs::write(&idx, "{\"weight_map\": 7}").unwrap();
    assert!(exercise(&base).unwrap_err().contains("weight_map"));
}
