"""Manifests (what the planner plans) of real checkpoints and configs.

Both read only metadata: a checkpoint's safetensors headers, a config's
fields. The manifest is a dict in the project's proto3 JSON form (what
`muonshardctl import-hf` / `import-safetensors` print) and goes to
`Coordinator.submit` as it is.
"""

import json
import os

from muonshard import _muonshard


def manifest_from_safetensors(path, name=None, skip_unsupported=False):
    """The manifest of a checkpoint: `path` is a .safetensors file, or a directory
    with `model.safetensors` or `model.safetensors.index.json` (every shard the
    index names). Only the headers are read: names, shapes and dtypes in the
    index's (or the header's) order, experts detected from their names as the
    HuggingFace importer does. Tensors of other dtypes than bf16/fp16/fp32 are
    an error (ValueError naming one) unless `skip_unsupported`."""
    return json.loads(_muonshard.import_safetensors(os.fspath(path), name or "", bool(skip_unsupported)))


def manifest_from_hf_config(config, name=None, mtp=False):
    """The manifest of a HuggingFace `config.json` (a path, or its parsed dict)."""
    if isinstance(config, dict):
        text = json.dumps(config)
    else:
        with open(os.fspath(config), encoding="utf-8") as f:
            text = f.read()
    return json.loads(_muonshard.import_hf_config(text, name or "", bool(mtp)))
