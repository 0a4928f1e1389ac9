"""Tests of the torch example (examples/torch/): the model, the data and the training script.

Run with the project's .venv (its pinned torch):  .venv/bin/python -m pytest tests/python/test_example_gpt.py -q
The multi-process runs go through torch.distributed.run on loopback (Gloo).
"""

import json
import math
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(REPO, "examples", "torch")
sys.path.insert(0, EXAMPLE)

try:  # the package's conftest: PYTHONPATH for child processes to import muonshard
    from conftest import package_env
except ImportError:

    def package_env():
        return dict(os.environ)


import data  # noqa: E402
import train_gpt  # noqa: E402
from gpt import GPT, GPTConfig  # noqa: E402

# A config small enough for a few ms per step on one core.
TINY = dict(vocab=64, d_model=32, n_layers=2, n_heads=4, d_ff=48, seq_len=16, n_experts=4)
# The same for the training script.
TINY_FLAGS = [
    "--vocab",
    "64",
    "--d-model",
    "64",
    "--n-layers",
    "2",
    "--n-heads",
    "4",
    "--seq-len",
    "32",
    "--batch-size",
    "8",
    "--log-every",
    "10",
]

VARIANTS = {
    "dense": dict(moe=False),
    "moe": dict(moe=True, stacked_experts=False),
    "moe-stacked": dict(moe=True, stacked_experts=True),
}


def tiny_model(variant="dense", seed=0, **overrides):
    return GPT(GPTConfig(**{**TINY, **VARIANTS[variant], **overrides}), seed=seed)


def tokens(cfg, batch=4, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(cfg.vocab, (batch, cfg.seq_len), generator=gen)


# --------------------------------------------------------------------------- gpt.py


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_forward_shape_and_gradients(variant):
    model = tiny_model(variant)
    cfg = model.cfg
    # Record which experts the router picks, to know which expert tensors are used.
    chosen = {}

    def record_choice(layer):
        def hook(mod, inp, out):
            chosen[layer] = set(out.topk(cfg.top_k, dim=-1).indices.flatten().tolist())

        return hook

    for name, module in model.named_modules():
        if name.endswith("mlp.gate"):
            module.register_forward_hook(record_choice(name.split(".")[1]))

    idx = tokens(cfg)
    logits = model(idx)
    assert logits.shape == (4, cfg.seq_len, cfg.vocab)
    assert logits.dtype == torch.float32
    model.loss(idx[:, :-1], idx[:, 1:]).backward()

    for name, p in model.named_parameters():
        parts = name.split(".")
        if ".mlp.experts." in name and parts[4].isdigit() and int(parts[4]) not in chosen[parts[1]]:
            assert p.grad is None, f"{name}: an expert no token chose has a gradient"
            continue
        assert p.grad is not None, f"{name}: no gradient"
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"{name}: zero gradient"


def test_tensor_names_and_shapes():
    h, i, e = TINY["d_model"], TINY["d_ff"], TINY["n_experts"]
    dense = dict(tiny_model("dense").named_parameters())
    assert dense["layers.0.self_attn.q_proj.weight"].shape == (h, h)
    assert dense["layers.1.mlp.gate_proj.weight"].shape == (i, h)
    assert dense["layers.1.mlp.down_proj.weight"].shape == (h, i)
    for name in [
        "embed_tokens.weight",
        "embed_positions.weight",
        "norm.weight",
        "lm_head.weight",
        "layers.0.input_layernorm.weight",
        "layers.0.post_attention_layernorm.weight",
    ]:
        assert name in dense

    moe = dict(tiny_model("moe").named_parameters())
    assert moe["layers.0.mlp.gate.weight"].shape == (e, h)
    assert moe["layers.0.mlp.experts.3.up_proj.weight"].shape == (i, h)
    assert moe["layers.1.mlp.experts.0.down_proj.weight"].shape == (h, i)

    stacked = dict(tiny_model("moe-stacked").named_parameters())
    assert stacked["layers.0.mlp.experts.gate_up_proj"].shape == (e, 2 * i, h)
    assert stacked["layers.0.mlp.experts.down_proj"].shape == (e, h, i)
    assert not any(".experts.0." in n for n in stacked)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_init_is_deterministic(variant):
    torch.manual_seed(123)  # the init must not depend on torch's global RNG
    a = tiny_model(variant, seed=7).state_dict()
    torch.manual_seed(456)
    b = tiny_model(variant, seed=7).state_dict()
    c = tiny_model(variant, seed=8).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if not k.endswith("norm.weight"))


def test_stacked_experts_compute_the_same_as_expert_modules():
    per_expert = tiny_model("moe")
    stacked = tiny_model("moe-stacked")
    # Copy the per-expert weights into the stacked layout; everything else is shared.
    state = {k: v for k, v in per_expert.state_dict().items() if ".experts." not in k}
    for layer in range(TINY["n_layers"]):
        prefix = f"layers.{layer}.mlp.experts"
        experts = per_expert.layers[layer].mlp.experts
        state[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([ex.gate_proj.weight, ex.up_proj.weight]) for ex in experts]
        )
        state[f"{prefix}.down_proj"] = torch.stack([ex.down_proj.weight for ex in experts])
    stacked.load_state_dict(state)
    idx = tokens(per_expert.cfg)
    torch.testing.assert_close(stacked(idx), per_expert(idx))


def test_moe_routing_matches_a_per_token_reference():
    model = tiny_model("moe")
    moe = model.layers[0].mlp
    x = torch.randn(3, 5, TINY["d_model"], generator=torch.Generator().manual_seed(0))
    expected = torch.zeros_like(x)
    for b in range(3):
        for t in range(5):
            logits = moe.gate(x[b, t])
            top, experts = logits.topk(2)
            for w, e in zip(torch.softmax(top, -1), experts.tolist(), strict=True):
                expected[b, t] += w * moe.experts[e](x[b, t])
    torch.testing.assert_close(moe(x), expected)


def test_causal_attention():
    # Changing a later token must not change the logits of earlier positions.
    model = tiny_model("moe")
    idx = tokens(model.cfg, batch=1)
    changed = idx.clone()
    changed[0, 10] = (changed[0, 10] + 1) % model.cfg.vocab
    torch.testing.assert_close(model(idx)[:, :10], model(changed)[:, :10])


def test_bf16_parameters():
    model = tiny_model("moe-stacked", dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    idx = tokens(model.cfg)
    loss = model.loss(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert math.isfinite(loss.item())


# --------------------------------------------------------------------------- data.py


def test_batch_is_a_pure_function():
    a = data.batch(3, 1, 4, 8, 32, seed=5)
    b = data.batch(3, 1, 4, 8, 32, seed=5)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    inputs, targets = a
    assert inputs.shape == targets.shape == (8, 32)
    assert inputs.dtype == targets.dtype == torch.long
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are inputs shifted by one
    assert not torch.equal(inputs, data.batch(3, 1, 4, 8, 32, seed=6)[0])


def test_ranks_and_steps_get_different_data():
    seen = [data.batch(step, rank, 2, 4, 16, seed=0)[0] for step in (1, 2) for rank in (0, 1)]
    for i in range(len(seen)):
        for j in range(i):
            assert not torch.equal(seen[i], seen[j])


def test_global_batch_does_not_depend_on_the_split():
    one = data.batch(5, 0, 1, 8, 16, seed=0)[0]
    two = torch.cat([data.batch(5, r, 2, 4, 16, seed=0)[0] for r in range(2)])
    assert torch.equal(one, two)


def test_sequences_follow_the_grammar():
    inputs, targets = data.batch(0, 0, 1, 16, 64, seed=3, vocab=128)
    succ = data.successor_table(128, 3)
    allowed = (succ[inputs] == targets.unsqueeze(-1)).any(-1)
    assert allowed.all()
    assert data.entropy_floor() < 0.5 * math.log(128)  # a learnable, low-entropy language


# --------------------------------------------------------------------------- train_gpt.py


def test_muon_classification_follows_the_planner_defaults():
    is_muon = train_gpt.is_muon
    w2, w3, w1 = torch.zeros(4, 4), torch.zeros(2, 4, 4), torch.zeros(4)
    assert is_muon("layers.0.self_attn.q_proj.weight", w2)
    assert is_muon("layers.0.mlp.experts.3.up_proj.weight", w2)
    assert is_muon("layers.0.mlp.experts.gate_up_proj", w3)
    assert is_muon("layers.0.mlp.gate_proj.weight", w2)  # the SwiGLU gate, not the router
    assert not is_muon("layers.0.mlp.gate.weight", w2)  # the router
    assert not is_muon("embed_tokens.weight", w2)
    assert not is_muon("embed_positions.weight", w2)
    assert not is_muon("lm_head.weight", w2)
    assert not is_muon("norm.weight", w1)


def test_newton_schulz_orthogonalises():
    gen = torch.Generator().manual_seed(0)
    for shape in [(32, 64), (64, 32), (3, 16, 24)]:
        o = train_gpt.newton_schulz(torch.randn(*shape, generator=gen))
        assert o.shape == shape
        s = torch.linalg.svdvals(o)
        # The quintic's fixed point band (it trades exactness for speed).
        assert s.min() > 0.5 and s.max() < 1.3, (shape, s.min(), s.max())


def test_exit_status_when_the_loss_does_not_fall():
    args = train_gpt.parse_args(["--optimizer", "adamw"])
    ref = train_gpt.unsharded_reference_bytes(tiny_model())
    mem = [{"optimizer_state": 1}]
    times = {1: 0.1, 2: 0.1}
    # The check is on the held-out batch's loss, not on one training batch's.
    assert train_gpt.report(args, 1, {1: 3.0, 2: 2.0}, times, mem, ref, [3.0, 2.0], ["a", "b"]) == 0
    assert train_gpt.report(args, 1, {1: 3.0, 2: 2.0}, times, mem, ref, [2.0, 2.0], ["a", "b"]) == 1
    assert train_gpt.report(args, 1, {1: 2.0, 2: 3.0}, times, mem, ref, [3.0, 2.5], ["a", "b"]) == 0


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--min-workers", "-1"], "--min-workers must be >= 0"),
        (["--min-workers", "2", "--coordinator", "127.0.0.1:1", "--max-restarts", "1"], "--min-workers needs"),
        (["--min-workers", "2", "--checkpoint-dir", "/tmp/x"], "--min-workers needs"),
    ],
)
def test_elastic_flags_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        train_gpt.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_unsharded_reference_bytes():
    model = tiny_model("moe")
    ref = train_gpt.unsharded_reference_bytes(model)
    n = sum(p.numel() for p in model.parameters())
    assert ref["params"] == n
    assert ref["adamw"] == 8 * n
    assert ref["muon_adamw"] == 4 * ref["muon_params"] + 8 * ref["adamw_params"]
    bf16 = train_gpt.unsharded_reference_bytes(tiny_model("moe", dtype=torch.bfloat16))
    assert bf16["adamw"] == 12 * n  # + an fp32 master per parameter


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_script(tmp_path, nproc, flags, timeout=120):
    """Runs train_gpt.py (under torch.distributed.run when nproc > 1); returns (rc, output, summary)."""
    summary = tmp_path / "summary.json"
    script = os.path.join(EXAMPLE, "train_gpt.py")
    if nproc == 1:
        cmd = [sys.executable, script]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc_per_node",
            str(nproc),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            "--log_dir",
            str(tmp_path / "logs"),
            script,
        ]
    env = {**package_env(), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        cmd + flags + ["--summary-json", str(summary)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    result = json.loads(summary.read_text()) if summary.exists() else None
    return proc.returncode, proc.stdout, result


def losses_of(summary):
    return [v for _, v in sorted((int(k), v) for k, v in summary["losses"].items())]


def test_adamw_two_processes(tmp_path):
    rc, out, summary = run_script(tmp_path, 2, ["--optimizer", "adamw", "--steps", "30"] + TINY_FLAGS)
    assert rc == 0, out
    losses = losses_of(summary)
    assert len(losses) == 30
    assert losses[0] > 0.9 * math.log(64)  # starts near uniform
    assert losses[-1] < losses[0] - 1.0, losses  # and visibly learns
    assert len(summary["memory"]) == 2  # one entry per rank, as replicas: equal
    assert summary["memory"][0]["optimizer_state"] == summary["unsharded"]["adamw"]
    assert "memory per rank" in out and "unsharded Muon + AdamW" in out


def test_muon_local_resume_is_exact(tmp_path):
    flags = ["--optimizer", "muon-local", "--moe", "--stacked-experts", "--schedule-steps", "16"] + TINY_FLAGS
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    rc, out, full = run_script(tmp_path, 1, flags + ["--steps", "16"])
    assert rc == 0, out
    assert full["memory"][0]["optimizer_state"] == full["unsharded"]["muon_adamw"]
    rc, out, _ = run_script(tmp_path, 1, flags + ckpt + ["--steps", "8"])
    assert rc == 0, out
    rc, out, resumed = run_script(tmp_path, 1, flags + ckpt + ["--steps", "16", "--resume"])
    assert rc == 0, out
    assert "resumed" in out
    assert sorted(resumed["losses"], key=int)[0] == "9"
    for step, loss in resumed["losses"].items():
        assert loss == full["losses"][step], step


def muonshard_available():
    try:
        import muonshard.torch  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not muonshard_available(), reason="the muonshard Python package is not importable")
def test_muonshard_two_processes(tmp_path):
    flags = ["--steps", "30", "--moe"] + TINY_FLAGS
    rc, out, shard = run_script(tmp_path, 2, ["--optimizer", "muonshard"] + flags)
    assert rc == 0, out
    losses = losses_of(shard)
    assert losses[-1] < losses[0] - 1.0, losses
    # Each rank holds part of the state (momentum, moments; fp32 parameters are
    # their own masters): together at least all of it (alignment padding on
    # top), the largest well under it.
    assert len(shard["memory"]) == 2
    whole = shard["unsharded"]["muon_adamw"]
    assert sum(m["optimizer_state"] for m in shard["memory"]) >= whole
    for m in shard["memory"]:
        assert 0 < m["optimizer_state"] < 0.75 * whole
        assert m["optimizer_state"] == m["plan_optimizer_state"]
    # The same math as muon-local (unsharded), up to the order of float sums.
    _, _, local = run_script(tmp_path, 2, ["--optimizer", "muon-local"] + flags)
    assert abs(losses[-1] - losses_of(local)[-1]) < 0.1


@pytest.mark.skipif(not muonshard_available(), reason="the muonshard Python package is not importable")
def test_fsdp_muonshard_trains_as_the_all_gather_muon_does(tmp_path):
    """--fsdp at 2 processes: FSDP2 + muonshard (gather to one rank, scatter
    back) and FSDP2 + the plain Muon that all-gathers every matrix compute the
    same update, so the losses agree; muonshard keeps less optimizer state
    (no whole momentum on every rank), and at W = 2 its gather and scatter
    move exactly the bytes of the all-gather (2 (W-1)/W of every matrix per
    rank; W/2 times fewer at larger W: docs/benchmarks.md)."""
    runs = {}
    for optimizer in ("muonshard", "muon-local"):
        work = tmp_path / optimizer
        work.mkdir()
        rc, out, summary = run_script(
            work, 2, ["--fsdp", "--optimizer", optimizer, "--steps", "10"] + TINY_FLAGS, timeout=300
        )
        assert rc == 0, out
        runs[optimizer] = summary
    ours, plain = runs["muonshard"], runs["muon-local"]
    for a, b in zip(losses_of(ours), losses_of(plain), strict=True):
        assert abs(a - b) <= 1e-4 * abs(b), (losses_of(ours), losses_of(plain))
    assert losses_of(ours)[-1] < losses_of(ours)[0] - 0.5
    assert max(m["optimizer_state"] for m in ours["memory"]) < min(m["optimizer_state"] for m in plain["memory"])
    for step in ours["comm_bytes"][0]:
        moved = [sum(c[step] for c in run["comm_bytes"]) for run in (ours, plain)]
        assert moved[0] == moved[1] > 0, (step, moved)
