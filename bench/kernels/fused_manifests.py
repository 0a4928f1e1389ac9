"""Writes the manifests of docs/benchmarks.md "Per-block Newton-Schulz" into a directory:
Phi-3-mini and gpt-oss-20b (their real shapes), each without and with nsBlocks on the fused
weights (phi3.json, phi3-blocked.json, gptoss.json, gptoss-blocked.json), for `muonshardctl plan`.

Usage: python3 bench/kernels/fused_manifests.py OUT_DIR
"""

import json
import os
import sys


def tensor(name, shape, blocks=None):
    t = {"name": name, "shape": [str(s) for s in shape], "dtype": "BF16"}
    if blocks:
        t["nsBlocks"] = blocks
    return t


def phi3(blocked):
    qkv = {"axis": "ROWS", "sizes": ["3072", "3072", "3072"]} if blocked else None
    gate_up = {"axis": "ROWS", "sizes": ["8192", "8192"]} if blocked else None
    ts = [tensor("model.embed_tokens.weight", [32064, 3072])]
    for layer in range(32):
        p = f"model.layers.{layer}."
        ts += [
            tensor(p + "self_attn.qkv_proj.weight", [9216, 3072], qkv),
            tensor(p + "self_attn.o_proj.weight", [3072, 3072]),
            tensor(p + "mlp.gate_up_proj.weight", [16384, 3072], gate_up),
            tensor(p + "mlp.down_proj.weight", [3072, 8192]),
            tensor(p + "input_layernorm.weight", [3072]),
            tensor(p + "post_attention_layernorm.weight", [3072]),
        ]
    ts += [tensor("model.norm.weight", [3072]), tensor("lm_head.weight", [32064, 3072])]
    return {"model": "phi3-mini", "tensors": ts}


def gptoss(blocked):
    gate_up = {"axis": "COLS", "stride": "2"} if blocked else None
    ts = [tensor("model.embed_tokens.weight", [201088, 2880])]
    for layer in range(24):
        p = f"model.layers.{layer}."
        ts += [
            tensor(p + "self_attn.q_proj.weight", [4096, 2880]),
            tensor(p + "self_attn.k_proj.weight", [512, 2880]),
            tensor(p + "self_attn.v_proj.weight", [512, 2880]),
            tensor(p + "self_attn.o_proj.weight", [2880, 4096]),
            tensor(p + "mlp.router.weight", [32, 2880]),
            tensor(p + "mlp.experts.gate_up_proj", [32, 2880, 5760], gate_up),
            tensor(p + "mlp.experts.down_proj", [32, 2880, 2880]),
            tensor(p + "input_layernorm.weight", [2880]),
        ]
    ts += [tensor("model.norm.weight", [2880]), tensor("lm_head.weight", [201088, 2880])]
    return {"model": "gpt-oss-20b", "tensors": ts}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    for name, build in (("phi3", phi3), ("gptoss", gptoss)):
        for blocked in (False, True):
            path = os.path.join(out, name + ("-blocked" if blocked else "") + ".json")
            with open(path, "w") as f:
                json.dump(build(blocked), f)


if __name__ == "__main__":
    main()
