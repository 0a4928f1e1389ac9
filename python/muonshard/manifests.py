"""Manifests (what the planner plans) of real checkpoints and configs.

Both read only metadata: a checkpoint's safetensors headers, a config's
fields. The manifest is a dict in the project's proto3 JSON form (what
`muonshardctl import-hf` / `import-safetensors` print) and goes to
`Coordinator.submit` as it is.
"""

import json
import os

from muonshard import _muonshard


def _rules(ns_blocks):
    """ns_blocks rules as the importers take them: "REGEX=BLOCKS" strings
    (muonshardctl's --ns-blocks; docs/planner.md, "Fused weights")."""
    if ns_blocks is None:
        return []
    if isinstance(ns_blocks, str) or not all(isinstance(r, str) for r in ns_blocks):
        raise TypeError(
            'ns_blocks must be a list of "REGEX=BLOCKS" strings, e.g. ["qkv_proj.weight=rows:3072,1024,1024"]'
        )
    return list(ns_blocks)


def manifest_from_safetensors(path, name=None, skip_unsupported=False, ns_blocks=None):
    """The manifest of a checkpoint: `path` is a .safetensors file, or a directory
    with `model.safetensors` or `model.safetensors.index.json` (every shard the
    index names). Only the headers are read: names, shapes and dtypes in the
    index's (or the header's) order, experts detected from their names as the
    HuggingFace importer does. Tensors of other dtypes than bf16/fp16/fp32 are
    an error (ValueError naming one) unless `skip_unsupported`. `ns_blocks`:
    "REGEX=BLOCKS" rules marking fused matrices for per-block Newton-Schulz."""
    return json.loads(
        _muonshard.import_safetensors(os.fspath(path), name or "", bool(skip_unsupported), _rules(ns_blocks))
    )


def manifest_from_hf_config(config, name=None, mtp=False, ns_blocks_mla=False, ns_blocks=None):
    """The manifest of a HuggingFace `config.json` (a path, or its parsed dict).
    Fused weights of the families that have them carry their blocks (phi3,
    gpt_neox, falcon, gpt-oss); `ns_blocks_mla` also splits DeepSeek-V3's
    kv_b_proj per head; `ns_blocks` adds "REGEX=BLOCKS" rules."""
    if isinstance(config, dict):
        text = json.dumps(config)
    else:
        with open(os.fspath(config), encoding="utf-8") as f:
            text = f.read()
    return json.loads(_muonshard.import_hf_config(text, name or "", bool(mtp), bool(ns_blocks_mla), _rules(ns_blocks)))
