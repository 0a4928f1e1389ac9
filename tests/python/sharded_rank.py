"""One rank of a sharded-optimizer test run (launched by test_sharded_optimizer.py
with RANK / WORLD_SIZE set, as torchrun would): builds its module's parameters,
steps ShardedMuonAdamW on deterministic gradients, and writes its state_dict
and parameters to OUT/rank-R.pt."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture_model

import muonshard.torch as mst


def lr_lambda(step):
    """The schedule the LR test uses (LambdaLR multiplier)."""
    return 1.0 / (1.0 + step)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--version", type=int, required=True)
    ap.add_argument("--model", default="dense")
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--schedule", action="store_true")
    ap.add_argument("--reduce-order", default="rank")
    ap.add_argument("--save-dir")
    ap.add_argument("--save-at", type=int, default=-1)
    ap.add_argument("--resume-dir")
    ap.add_argument("--overlap", action="store_true", help="overlap_backward: gradients through a real backward")
    ap.add_argument("--step-piece-kib", type=int, default=0, help="step_piece_kib (NOTE [Step pieces])")
    ap.add_argument("--step-trace-dir", help="step_trace_dir (NOTE [Step trace])")
    ap.add_argument("--bad-lr-at", type=int, default=-1, help="sets lr -1 before this step (0-based): bad input")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rank = int(os.environ["RANK"])
    params = fixture_model.local_parameters(a.model, a.seed, rank, a.ep)
    full_shapes = {n: s for n, s, _ in fixture_model.specs(a.model)}
    opt = mst.ShardedMuonAdamW(
        params,
        coordinator=a.coordinator,
        job=a.job,
        plan_version=a.version,
        lr=a.lr,
        reduce_order=a.reduce_order,
        blas_threads=1,
        comm_timeout=60,
        join_timeout=30,
        overlap_backward=a.overlap,
        step_piece_kib=a.step_piece_kib,
        step_trace_dir=a.step_trace_dir,
    )
    start = opt.load_checkpoint(a.resume_dir) if a.resume_dir else 0
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda) if a.schedule else None
    lrs = []
    for step in range(start, a.steps):
        with_grad = 0
        if a.overlap:
            # d/dp sum(p * g) = g: the same gradients, produced by backward (the
            # hooks hand each one over as it is accumulated).
            loss = None
            for name, p in params:
                g = fixture_model.local_gradient(name, full_shapes[name], rank, step, a.seed, a.ep)
                if g is not None:
                    with_grad += 1
                    term = (p * g.to(p.dtype)).sum().float()
                    loss = term if loss is None else loss + term
            if loss is not None:
                loss.backward()
        for i, (name, p) in enumerate(params if not a.overlap else []):
            g = fixture_model.local_gradient(name, full_shapes[name], rank, step, a.seed, a.ep)
            if g is None:
                p.grad = None
            elif p.grad is not None and (step + i) % 2 == 0:
                p.grad.copy_(g.to(p.dtype))  # in place: into the fused buffer where it is one
            else:
                p.grad = g.to(p.dtype)
        if step == a.bad_lr_at:
            opt.param_groups[0]["lr"] = -1.0
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched is not None:
            sched.step()
        opt.zero_grad()
        if step + 1 == a.save_at:
            opt.save_checkpoint(a.save_dir)
    result = {
        "state": opt.state_dict(),
        "params": {n: p.detach().clone() for n, p in params},
        "lrs": lrs,
        "memory": opt.memory(),
        "rank": opt.rank,
        "world_size": opt.world_size,
        "stats": opt.last_step_stats,
        "hooked": opt.hooked_gradients,
        "with_grad": with_grad,
    }
    torch.save(result, os.path.join(a.out, "rank-%d.pt" % rank))
    opt.close()


if __name__ == "__main__":
    main()
