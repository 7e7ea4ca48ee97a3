"""decoda's Python sampler: the tokens of the library and the CLI, reproducible and
batch-invariant, every parameter by its CLI name, bad input as clear exceptions or
per-row errors."""

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import decoda

REPO = Path(__file__).resolve().parents[3]


def rows(b, v, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, v)) * 3).astype(np.float32)


def cli():
    path = os.environ.get("DECODA_BIN") or shutil.which("decoda")
    if path is None:
        built = REPO / "target" / "release" / "decoda"
        path = str(built) if built.exists() else None
    return path


def test_greedy_and_seeded_draws_repeat():
    s = decoda.Sampler(device="cpu")
    x = rows(4, 1000)
    g = s.sample(x, {"temperature": 0})
    assert g.tokens.dtype == np.int64
    assert g.tokens.tolist() == x.argmax(axis=1).tolist()
    a = s.sample(x, {"top_p": 0.9, "temperature": 0.8}, seeds=[1, 2, 3, 4], steps=5)
    b = s.sample(x, {"top_p": 0.9, "temperature": 0.8}, seeds=[1, 2, 3, 4], steps=5)
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.seeds == [1, 2, 3, 4]
    # unseeded rows get a seed from the OS, reported, which reproduces them
    c = s.sample(x, {"temperature": 1.0})
    d = s.sample(x, {"temperature": 1.0}, seeds=c.seeds)
    assert c.tokens.tolist() == d.tokens.tolist()


def test_a_row_does_not_depend_on_its_batch():
    s = decoda.Sampler(device="cpu")
    x = rows(8, 5000, seed=3)
    params = [{"top_k": 40, "temperature": 0.7, "repetition_penalty": 1.2} for _ in range(8)]
    prompts = [[1, 2, 3]] * 8
    full = s.sample(x, params, seeds=list(range(8)), prompts=prompts)
    for r in (0, 5, 7):
        alone = s.sample(x[r], params[r], seeds=r, prompts=[prompts[r]])
        assert alone.tokens[0] == full.tokens[r]


def test_same_tokens_as_the_cli(tmp_path):
    exe = cli()
    if exe is None:
        pytest.skip("the decoda CLI is not built (cargo build --release)")
    x = rows(3, 2000, seed=9)
    params = [
        {"temperature": 0.8, "top_p": 0.9, "seed": 11},
        {"temperature": 1.2, "min_p": 0.05, "dry_multiplier": 0.8, "seed": 12, "output": [5, 6, 5, 6]},
        {"top_k": 20, "typical_p": 0.9, "seed": 13, "step": 4},
    ]
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "p.json").write_text(json.dumps(params))
    out = subprocess.run(
        [exe, "sample", "--logits", str(tmp_path / "x.npy"), "--params", str(tmp_path / "p.json"),
         "--device", "cpu", "--json"],
        check=True, capture_output=True, text=True,
    )
    want = [r["tokens"][0] for r in json.loads(out.stdout)["rows"]]
    s = decoda.Sampler(device="cpu")
    plain = [{k: v for k, v in p.items() if k not in ("seed", "step", "output")} for p in params]
    got = s.sample(x, plain, seeds=[11, 12, 13], steps=[0, 0, 4],
                   outputs=[None, [5, 6, 5, 6], None])
    assert got.tokens.tolist() == want


def test_input_types():
    s = decoda.Sampler(device="cpu")
    x = rows(2, 300)
    want = s.sample(x, {"temperature": 0}).tokens.tolist()
    assert s.sample(x.astype(np.float16), {"temperature": 0}).tokens.tolist() == \
        x.astype(np.float16).astype(np.float32).argmax(axis=1).tolist()
    assert s.sample(x.astype(np.float64), {"temperature": 0}).tokens.tolist() == want
    # a non-contiguous view is copied, a 1-D row is one row
    assert s.sample(np.asfortranarray(x), {"temperature": 0}).tokens.tolist() == want
    assert s.sample(x[1], {"temperature": 0}).tokens.tolist() == want[1:]


def test_bad_input_raises_clear_errors():
    s = decoda.Sampler(device="cpu")
    x = rows(3, 100)
    with pytest.raises(ValueError, match="shape"):
        s.sample(np.zeros((2, 3, 4), dtype=np.float32))
    with pytest.raises(TypeError, match="floating"):
        s.sample(np.zeros((2, 3), dtype=np.int32))
    with pytest.raises(ValueError, match=r"top_p.*row 1|row 1.*top_p"):
        s.sample(x, [{}, {"top_p": 1.5}, {}])
    with pytest.raises(ValueError, match="unknown keys"):
        s.sample(x, {"temprature": 1.0})
    with pytest.raises(ValueError, match="rows"):
        s.sample(x, [{}, {}])
    with pytest.raises(ValueError, match="device"):
        decoda.Sampler(device="tpu")


def test_row_errors_stay_in_their_row():
    s = decoda.Sampler(device="cpu")
    x = rows(3, 100)
    x[1, 7] = np.nan
    x[2, :] = -np.inf
    out = s.sample(x, {"temperature": 0.5}, seeds=1)
    assert out.tokens[0] >= 0 and out.errors[0] is None
    assert out.tokens[1] == -1 and out.errors[1]["kind"] == "NonFiniteLogits"
    assert out.tokens[2] == -1 and out.errors[2]["kind"] == "NoCandidate"


def test_logprobs_kept_and_masks():
    s = decoda.Sampler(device="cpu")
    v = 1000
    x = rows(2, v, seed=4)
    out = s.sample(x, {"top_k": 10, "logprobs": 3, "logprobs_mode": "processed", "kept": 5}, seeds=2)
    for r in range(2):
        lp, kept = out.logprobs[r], out.kept[r]
        assert len(lp["top"]) == 3 and lp["rank"] >= 1
        assert kept["size"] == 10 and len(kept["top"]) == 5
        assert kept["top"][0]["p"] >= kept["top"][-1]["p"]
    # a mask allowing only tokens 3 and 900
    w = (v + 31) // 32
    m = np.zeros(w, dtype=np.uint32)
    for t in (3, 900):
        m[t // 32] |= np.uint32(1 << (t % 32))
    for seed in range(20):
        t = s.sample(x, {}, seeds=seed, masks=m).tokens
        assert set(t.tolist()) <= {3, 900}


def test_sampling_from_threads():
    # the interpreter's lock is released while sampling: threads run side by side
    s = decoda.Sampler(device="cpu", threads=1)
    x = rows(4, 50_000)
    want = s.sample(x, {"top_p": 0.9}, seeds=5).tokens.tolist()
    results = []

    def work():
        results.append(s.sample(x, {"top_p": 0.9}, seeds=5).tokens.tolist())

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert results == [want] * 4


def test_wgpu_matches_the_cpu():
    try:
        gpu = decoda.Sampler(device="wgpu")
    except RuntimeError as e:
        pytest.skip(f"no wgpu adapter: {e}")
    cpu = decoda.Sampler(device="cpu")
    x = rows(4, 32_000, seed=8)
    params = {"top_k": 50, "top_p": 0.9, "temperature": 0.8}
    assert gpu.sample(x, params, seeds=3).tokens.tolist() == cpu.sample(x, params, seeds=3).tokens.tolist()
    assert gpu.device.startswith("wgpu:")


def test_verify_gives_plain_decodings_tokens():
    """Sampler.verify: a draft of plain decoding's own tokens stands whole, one with its
    first token changed stops at once with the target's draw; the same on the device;
    bad drafts raise ValueError naming the problem."""
    rng = np.random.default_rng(12)
    b, k, v = 3, 4, 1000
    x = rng.normal(0.0, 2.0, size=(b, k + 1, v)).astype(np.float32)
    params = {"temperature": 0.9, "top_k": 40, "repetition_penalty": 1.3, "logprobs": 2}
    s = decoda.Sampler(device="cpu")
    plain = [[] for _ in range(b)]
    for i in range(k + 1):
        out = s.sample(x[:, i, :], params, seeds=[5, 6, 7], steps=i, outputs=plain)
        for r in range(b):
            plain[r].append(int(out.tokens[r]))
    drafts = np.array([p[:k] for p in plain], dtype=np.int64)
    drafts[1, 0] = (drafts[1, 0] + 1) % v
    got = s.verify(x, drafts, params, seeds=[5, 6, 7])
    assert got.accepted.tolist() == [k, 0, k]
    assert got.tokens == [plain[0], plain[1][:1], plain[2]]
    assert got.acceptance == 8 / 12
    assert len(got.logprobs[0]) == k + 1 and got.errors == [None] * b
    try:
        gpu = decoda.Sampler(device="wgpu")
    except RuntimeError:
        gpu = None
    if gpu is not None:
        g = gpu.verify(x, drafts, params, seeds=[5, 6, 7])
        assert g.tokens == got.tokens and g.accepted.tolist() == got.accepted.tolist()
    # the rejection rule with the target's own rows as the draft's (p = q): every drafted
    # token stands, and row 0's tokens are plain decoding's
    own = np.array([p[:k] for p in plain])
    rej = s.verify(x, own, params, seeds=[5, 6, 7], rule="rejection",
                   draft_logits=x[:, :k, :])
    assert rej.accepted.tolist() == [k, k, k]
    assert rej.tokens == plain
    # (row 1's changed token lies outside the draft's top-k: p = 0 is refused)
    with pytest.raises(ValueError, match="draft_logits"):
        s.verify(x, drafts, params, seeds=[5, 6, 7], rule="rejection", draft_logits=x[:, :k, :])
    # one-hot drafts against a greedy target stand exactly where they are its argmax
    greedy = s.verify(x[:1], drafts[:1], {"temperature": 0}, seeds=1, rule="rejection")
    first = int(np.argmax(x[0, 0]))
    assert greedy.accepted[0] >= int(drafts[0, 0] == first)
    assert greedy.tokens[0][0] == first
    with pytest.raises(ValueError, match="rule"):
        s.verify(x, drafts, params, rule="both")
    with pytest.raises(ValueError, match=r"\[B, K \+ 1, V\]"):
        s.verify(x, drafts[:, :2], params, seeds=1)
    far = drafts.copy()
    far[2, 1] = v
    with pytest.raises(ValueError, match="row 2.*draft"):
        s.verify(x, far, params, seeds=1)


def test_probing_for_an_adapter_keeps_stderr_clean():
    """On a headless machine Mesa's device-selection layer would print an XDG_RUNTIME_DIR
    error at every adapter probe; the package switches it off as the CLI does."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_RUNTIME_DIR", "NODEVICE_SELECT", "MESA_VK_DEVICE_SELECT")}
    code = ("import decoda\n"
            "for d in ('auto', 'wgpu'):\n"
            "    try:\n"
            "        decoda.Sampler(device=d)\n"
            "    except RuntimeError:\n"
            "        pass\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "XDG_RUNTIME_DIR" not in out.stderr, out.stderr


def test_head_steps_like_the_sampler_driven_by_hand():
    v = 3000
    head = decoda.Head(4, v, device="cpu")
    assert (head.slots, head.vocab) == (4, v)
    s = decoda.Sampler(device="cpu")
    params = [{"top_p": 0.9}, {"temperature": 0}, {"repetition_penalty": 1.3, "top_k": 20},
              {"dry_multiplier": 0.8, "kept": 3}]
    hist = {}
    for slot, p in enumerate(params):
        seed = head.join(slot, p, seed=10 + slot, prompt=[1, 2, 3], max_tokens=12 if slot == 1 else None)
        assert seed == 10 + slot
        hist[slot] = []
    rng = np.random.default_rng(1)
    for step in range(15):
        x = (rng.standard_normal((4, v)) * 2).astype(np.float32)
        out = head.step(x)
        for slot in range(4):
            if slot == 1 and step >= 12:
                assert out.tokens[slot] == -1 and out.errors[slot]["kind"] == "Finished"
                continue
            want = s.sample(x[slot], params[slot], seeds=10 + slot, steps=step,
                            prompts=[[1, 2, 3]], outputs=[hist[slot]])
            assert out.tokens[slot] == want.tokens[0], (step, slot)
            hist[slot].append(int(out.tokens[slot]))
        if step == 11:
            assert out.finished[1] == "length"
    assert out.kept[3]["size"] >= 1
    head.leave(1)
    with pytest.raises(ValueError, match="slot 1"):
        head.step(np.zeros((1, v), dtype=np.float32), [1])


def test_head_verify_advances_like_steps():
    """Head.verify: a slot advances by the tokens plain steps give it up to the first
    that differs from its draft (a stop id ends it there), on the CPU and the device."""
    v, k = 500, 3
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, k + 1, v)) * 2).astype(np.float32)
    params = {"temperature": 0.8, "top_k": 30, "repetition_penalty": 1.2}
    plain_head = decoda.Head(3, v, device="cpu")
    for slot in range(3):
        plain_head.join(slot, params, seed=20 + slot, prompt=[7, 8])
    plain = [[] for _ in range(3)]
    for i in range(k + 1):
        out = plain_head.step(x[:, i, :])
        for slot in range(3):
            plain[slot].append(int(out.tokens[slot]))
    drafts = np.array([p[:k] for p in plain])
    drafts[1, 1] = (drafts[1, 1] + 1) % v
    devices = ["cpu"]
    try:
        decoda.Sampler(device="wgpu")
        devices.append("wgpu")
    except RuntimeError:
        pass
    for device in devices:
        head = decoda.Head(3, v, device=device)
        for slot in range(3):
            # slot 2 stops at its second token
            stop = [plain[2][1]] if slot == 2 else None
            head.join(slot, params, seed=20 + slot, prompt=[7, 8], stop=stop)
        got = head.verify(x, drafts)
        assert got.tokens[0] == plain[0] and got.accepted[0] == k, device
        assert got.tokens[1] == plain[1][:2] and got.accepted[1] == 1, device
        assert got.tokens[2] == plain[2][:2] and got.finished[2] == "stop", device
        assert got.finished[:2] == [None, None]
        # the slots' state moved by those tokens: the next step is plain decoding's
        nxt = (rng.standard_normal((2, v)) * 2).astype(np.float32)
        s = decoda.Sampler(device="cpu")
        step = head.step(nxt, [0, 1])
        for r, slot in enumerate((0, 1)):
            want = s.sample(nxt[r], params, seeds=20 + slot, steps=len(got.tokens[slot]),
                            prompts=[[7, 8]], outputs=[got.tokens[slot]])
            assert step.tokens[r] == want.tokens[0], (device, slot)
        with pytest.raises(ValueError, match="draft"):
            head.verify(x[:1], np.array([[0, v, 1]]), slots=[0])


def test_head_masks_and_bad_input():
    v = 500
    head = decoda.Head(2, v, device="cpu")
    w = (v + 31) // 32
    fixed = np.zeros(w, dtype=np.uint32)
    fixed[0] = 0b1110  # tokens 1, 2, 3
    head.join(0, {}, seed=1, mask=fixed)
    head.join(1, {}, seed=2)
    step_mask = np.zeros(w, dtype=np.uint32)
    step_mask[1] = 1  # token 32
    for _ in range(10):
        out = head.step(np.zeros((2, v), dtype=np.float32), masks=[None, step_mask])
        assert out.tokens[0] in (1, 2, 3)
        assert out.tokens[1] == 32
    with pytest.raises(ValueError, match="taken"):
        head.join(0, {})
    with pytest.raises(ValueError, match="top_p"):
        head.set_params(1, {"top_p": 0})
    with pytest.raises(ValueError, match="device"):
        decoda.Head(2, v, device="npu")


def test_device_head_matches_the_cpu_head():
    try:
        gpu = decoda.Head(2, 4000, device="wgpu")
    except RuntimeError as e:
        pytest.skip(f"no wgpu adapter: {e}")
    cpu = decoda.Head(2, 4000, device="cpu")
    for h in (gpu, cpu):
        h.join(0, {"top_k": 30}, seed=5)
        h.join(1, {"temperature": 0.7, "repetition_penalty": 1.2}, seed=6, prompt=[4, 5])
    rng = np.random.default_rng(2)
    for _ in range(10):
        x = rng.standard_normal((2, 4000)).astype(np.float32)
        assert gpu.step(x).tokens.tolist() == cpu.step(x).tokens.tolist()
    # DRY in the device head (its window bounded by max_tokens), over peaked rows that
    # repeat, against the CPU head
    for h in (gpu, cpu):
        h.leave(0)
        h.join(0, {"temperature": 0, "dry_multiplier": 2.0, "dry_allowed_length": 1},
               seed=5, prompt=[1, 2, 1, 2, 1], max_tokens=40)
    for _ in range(30):
        x = rng.standard_normal((2, 4000)).astype(np.float32)
        x[:, :6] += 6.0
        assert gpu.step(x).tokens.tolist() == cpu.step(x).tokens.tolist()
    # top-n-σ runs in the device head too
    gpu.leave(0)
    cpu.leave(0)
    for h in (gpu, cpu):
        h.join(0, {"top_n_sigma": 1.0, "top_k": 50}, seed=9, prompt=[3, 4])
    for _ in range(20):
        x = rng.standard_normal((2, 4000)).astype(np.float32)
        assert gpu.step(x).tokens.tolist() == cpu.step(x).tokens.tolist()
    # and XTC, its coin drawn on the device at the slot's step, over peaked rows
    gpu.leave(0)
    cpu.leave(0)
    for h in (gpu, cpu):
        h.join(0, {"xtc_probability": 0.6, "xtc_threshold": 0.05, "min_p": 0.01},
               seed=10, prompt=[3, 4])
    for _ in range(20):
        x = rng.standard_normal((2, 4000)).astype(np.float32)
        x[:, [7, 900, 2500, 3999]] += [6.0, 5.5, 5.5, 5.0]
        assert gpu.step(x).tokens.tolist() == cpu.step(x).tokens.tolist()
    # and typical-p
    gpu.leave(0)
    cpu.leave(0)
    for h in (gpu, cpu):
        h.join(0, {"typical_p": 0.8, "top_k": 100}, seed=11, prompt=[3, 4])
    for _ in range(20):
        x = rng.standard_normal((2, 4000)).astype(np.float32)
        assert gpu.step(x).tokens.tolist() == cpu.step(x).tokens.tolist()
    # and the kept distribution: the same sets and probabilities as the CPU head's
    gpu.leave(0)
    cpu.leave(0)
    for h in (gpu, cpu):
        h.join(0, {"kept": 4, "top_k": 50}, seed=12, prompt=[3, 4])
    for _ in range(5):
        x = rng.standard_normal((2, 4000)).astype(np.float32)
        g, c = gpu.step(x), cpu.step(x)
        assert g.tokens.tolist() == c.tokens.tolist()
        assert g.kept[0]["size"] == c.kept[0]["size"] == 50
        assert [k["id"] for k in g.kept[0]["top"]] == [k["id"] for k in c.kept[0]["top"]]
        for a, b in zip(g.kept[0]["top"], c.kept[0]["top"]):
            assert abs(a["p"] - b["p"]) <= 1e-6
    # a DRY window that could outgrow the device's 4,096 tokens is refused, naming
    # the slot and the field
    gpu.leave(0)
    with pytest.raises(ValueError, match="dry_penalty_last_n"):
        gpu.join(0, {"dry_multiplier": 0.5})


def test_dlpack_inputs_torch_and_mlx():
    x = rows(3, 1000, seed=12)
    s = decoda.Sampler(device="cpu")
    want = s.sample(x, {"top_p": 0.9}, seeds=4).tokens.tolist()
    tried = []
    try:
        import mlx.core as mx
    except ImportError:
        mx = None
    if mx is not None:
        tried.append("mlx")
        assert s.sample(mx.array(x), {"top_p": 0.9}, seeds=4).tokens.tolist() == want
        b = mx.array(x).astype(mx.bfloat16)
        want16 = s.sample(np.asarray(b.astype(mx.float32)), {"temperature": 0}).tokens.tolist()
        assert s.sample(b, {"temperature": 0}).tokens.tolist() == want16
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        tried.append("torch")
        t = torch.from_numpy(x)
        assert s.sample(t, {"top_p": 0.9}, seeds=4).tokens.tolist() == want
        tb = t.to(torch.bfloat16)
        assert s.sample(tb, {"temperature": 0}).tokens.tolist() == \
            s.sample(tb.float().numpy(), {"temperature": 0}).tokens.tolist()
    if not tried:
        pytest.skip("neither torch nor mlx is installed")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    exe = cli()
    if exe is None:
        pytest.skip("the decoda CLI is not built (cargo build --release)")
    d = tmp_path_factory.mktemp("gen")
    subprocess.run([exe, "tiny-model", str(d), "--seed", "4"], check=True, capture_output=True)
    return d


def cli_generate(d, *args):
    out = subprocess.run(
        [cli(), "generate", "--model", str(d), "--device", "cpu", "--json", *args],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout)


def test_generate_streams_the_clis_tokens(tiny_model):
    m = decoda.load(tiny_model, device="cpu")
    assert m.vocab_size == 320 and m.encode("Hi") == [72, 105]
    g = m.generate("Hello", max_tokens=10, params={"temperature": 0.8, "top_p": 0.9}, seed=5)
    streamed = [t for s, t in g]
    assert g.report["outputs"][0]["tokens"] == streamed
    want = cli_generate(tiny_model, "--prompt", "Hello", "--max-tokens", "10",
                        "--temperature", "0.8", "--top-p", "0.9", "--seed", "5")
    assert streamed == want["tokens"]
    assert g.texts[0] == want["text"]
    # n sequences of one prompt: each the CLI's with its seed
    g = m.generate([72, 101], max_tokens=6, params={"temperature": 1.0}, seed=20, n=3)
    per = {0: [], 1: [], 2: []}
    for s, t in g:
        per[s].append(t)
    for k in range(3):
        want = cli_generate(tiny_model, "--prompt-ids", "72,101", "--max-tokens", "6",
                            "--temperature", "1.0", "--seed", str(20 + k))
        assert per[k] == want["tokens"]


def test_generate_with_a_draft_gives_plain_decodings_tokens(tiny_model, tmp_path):
    exe = cli()
    close = tmp_path / "close"
    subprocess.run([exe, "tiny-model", str(close), "--seed", "4", "--perturb", "0.05"],
                   check=True, capture_output=True)
    m = decoda.load(tiny_model, device="cpu")
    d = decoda.load(close, device="cpu")
    kw = dict(max_tokens=30, params={"temperature": 0.8, "top_p": 0.9,
                                     "repetition_penalty": 1.1}, seed=5, n=3)
    plain = m.generate([72, 101, 108], **kw).collect()
    g = m.generate([72, 101, 108], draft=d, speculate=3, **kw)
    streamed = {0: [], 1: [], 2: []}
    for s, t in g:
        streamed[s].append(t)
    spec = g.report
    for k in range(3):
        assert spec["outputs"][k]["tokens"] == plain["outputs"][k]["tokens"] == streamed[k]
    assert 0.3 < spec["acceptance"] <= 1.0 and spec["speculate"] == 3
    assert spec["drafted"] >= spec["accepted"] > 0
    with pytest.raises(ValueError, match="speculate"):
        m.generate([1], draft=d, speculate=0)
    other = tmp_path / "v400"
    subprocess.run([exe, "tiny-model", str(other), "--vocab", "400"],
                   check=True, capture_output=True)
    with pytest.raises(ValueError, match="vocab"):
        m.generate([1], draft=decoda.load(other, device="cpu"))


def test_generate_stop_strings_masks_and_errors(tiny_model):
    m = decoda.load(tiny_model, device="cpu")
    w = (320 + 31) // 32
    mask = np.zeros(w, dtype=np.uint32)
    for t in range(97, 123):
        mask[t // 32] |= np.uint32(1 << (t % 32))
    full = m.generate("abc", max_tokens=14, seed=3, grammar_mask=mask).collect()
    toks = full["outputs"][0]["tokens"]
    assert all(97 <= t <= 122 for t in toks)
    text = m.decode(toks)
    stop = text[5:7]
    g = m.generate("abc", max_tokens=14, seed=3, grammar_mask=mask, stop_str=[stop])
    g.collect()
    at = text.find(stop)
    assert g.texts[0] == text[:at]
    assert g.report["outputs"][0]["tokens"] == toks[:at]
    assert g.report["outputs"][0]["finish"] == "stop"
    with pytest.raises(ValueError, match="top_p"):
        m.generate("a", params={"top_p": 2.0}).collect()
    with pytest.raises(ValueError, match="prompt"):
        m.generate()
    # the tiny checkpoint holds 4,096 positions: refused before anything runs
    with pytest.raises(ValueError, match="max_position_embeddings"):
        m.generate("a", max_tokens=5000)
    with pytest.raises(ValueError):
        decoda.load(tiny_model / "missing")
