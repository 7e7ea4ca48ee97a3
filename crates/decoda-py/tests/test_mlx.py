"""decoda.mlx with mlx-lm on a checkpoint written by `decoda tiny-model`: greedy ids are
mlx-lm's own, seeded runs repeat, and a request's tokens do not depend on the other
requests of its batch. Skipped without mlx and mlx-lm (`pip install "mlx[cpu]" mlx-lm`)
or without the decoda CLI."""

import subprocess

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
mlx_lm = pytest.importorskip("mlx_lm")

import decoda.mlx  # noqa: E402
from test_sampler import cli  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    exe = cli()
    if exe is None:
        pytest.skip("the decoda CLI is not built (cargo build --release)")
    d = tmp_path_factory.mktemp("tiny")
    subprocess.run([exe, "tiny-model", str(d), "--seed", "3"], check=True, capture_output=True)
    m, tok = mlx_lm.load(str(d))
    return m, tok, d


def run(m, sampler, prompt, n=12):
    from mlx_lm.generate import generate_step

    out = []
    for (t, _), _ in zip(generate_step(mx.array(prompt), m, max_tokens=n, sampler=sampler), range(n)):
        out.append(int(t))
    return out


PROMPT = [72, 101, 108, 108, 111]


def test_greedy_is_mlx_lms_own(model):
    m, _, d = model
    from mlx_lm.sample_utils import make_sampler as mlx_make

    theirs = run(m, mlx_make(temp=0.0), PROMPT)
    ours = run(m, decoda.mlx.make_sampler(temp=0.0, seed=1), PROMPT)
    assert ours == theirs
    # and the decoda CLI's greedy on the same checkpoint
    exe = cli()
    got = subprocess.run(
        [exe, "generate", "--model", str(d), "--prompt-ids", "72,101,108,108,111",
         "--max-tokens", "12", "--temperature", "0", "--device", "cpu", "--json"],
        check=True, capture_output=True, text=True,
    )
    import json

    assert json.loads(got.stdout)["tokens"] == ours


def test_seeded_runs_repeat(model):
    m, _, _ = model
    a = run(m, decoda.mlx.make_sampler(temp=0.9, top_p=0.95, seed=5), PROMPT)
    b = run(m, decoda.mlx.make_sampler(temp=0.9, top_p=0.95, seed=5), PROMPT)
    c = run(m, decoda.mlx.make_sampler(temp=0.9, top_p=0.95, seed=6), PROMPT)
    assert a == b
    assert a != c
    s = decoda.mlx.make_sampler(temperature=0.9)
    assert isinstance(s.seed, int)


def test_a_request_does_not_depend_on_its_batch(model):
    m, _, _ = model
    from mlx_lm.generate import BatchGenerator

    def generate(prompts, seeds):
        gen = BatchGenerator(m, max_tokens=10, stop_tokens=[])
        samplers = [decoda.mlx.make_sampler(temp=1.0, top_k=50, seed=s) for s in seeds]
        uids = gen.insert(prompts, [10] * len(prompts), samplers=samplers)
        out = {u: [] for u in uids}
        while responses := gen.next_generated():
            for r in responses:
                if r.finish_reason != "stop":
                    out[r.uid].append(int(r.token))
        gen.close()
        return [out[u] for u in uids]

    alone = generate([PROMPT], [11])[0]
    batched = generate([[65, 66, 67], PROMPT, [120, 121]], [3, 11, 4])
    assert batched[1] == alone
