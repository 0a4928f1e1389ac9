"""Fused weights orthogonalised per block: manifest_from_module(...,
ns_blocks={name_or_regex: spec}) sets each parameter's nsBlocks (TypeError /
ValueError naming the key for bad input), the coordinator plans them (the
plan and the rank views carry the blocks, a TP split that leaves whole blocks
on every tp rank is marked ns_local) and refuses blocks on a tensor that is
not a Muon matrix; the importer bindings take the same options as the CLI."""

import json

import pytest
import torch

import muonshard
import muonshard.torch as mst
from muonshard import _muonshard

HIDDEN = 32
HEADS = 4
HEAD_DIM = 8
FFN = 48
EXPERTS = 4


class Experts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # gpt-oss's [E, in, 2 * ffn]: gate and up in alternating columns.
        self.gate_up_proj = torch.nn.Parameter(torch.zeros(EXPERTS, HIDDEN, 2 * FFN))


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj = torch.nn.Linear(HIDDEN, 3 * HEADS * HEAD_DIM)  # per head [q_h, k_h, v_h]
        self.o_proj = torch.nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.gate_up_proj = torch.nn.Linear(HIDDEN, 2 * FFN, bias=False)  # [gate | up]
        self.down_proj = torch.nn.Linear(FFN, HIDDEN, bias=False)
        self.experts = Experts()


class Fused(torch.nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(layers))


PER_HEAD = {"axis": "rows", "sizes": [HEAD_DIM] * 3, "groups": HEADS}
GATE_UP = {"axis": "rows", "sizes": [FFN, FFN]}
ALTERNATING = {"axis": "cols", "stride": 2}
SPECS = {
    r"layers\.\d+\.qkv_proj\.weight": PER_HEAD,
    r".*\.gate_up_proj\.weight": GATE_UP,
    r".*experts\.gate_up_proj": ALTERNATING,
}


def blocks_by_name(manifest):
    return {t["name"]: t.get("nsBlocks") for t in manifest["tensors"]}


def test_specs_set_the_blocks_of_the_parameters_their_keys_name():
    m = mst.manifest_from_module(Fused(), "fused", ns_blocks=SPECS)
    blocks = blocks_by_name(m)
    assert blocks["layers.1.qkv_proj.weight"] == {"axis": "ROWS", "sizes": [8, 8, 8], "groups": 4}
    assert blocks["layers.1.gate_up_proj.weight"] == {"axis": "ROWS", "sizes": [48, 48]}
    assert blocks["layers.0.experts.gate_up_proj"] == {"axis": "COLS", "stride": 2}
    for name in ("layers.0.qkv_proj.bias", "layers.0.o_proj.weight", "layers.0.down_proj.weight"):
        assert blocks[name] is None, name
    # A parameter name names that parameter alone, before any regex.
    m = mst.manifest_from_module(
        Fused(), "fused", ns_blocks={**SPECS, "layers.0.qkv_proj.weight": {"axis": "ROWS", "sizes": [48, 48]}}
    )
    blocks = blocks_by_name(m)
    assert blocks["layers.0.qkv_proj.weight"] == {"axis": "ROWS", "sizes": [48, 48]}
    assert blocks["layers.1.qkv_proj.weight"]["groups"] == 4
    json.dumps(m)  # proto3 JSON, as submit sends it


@pytest.mark.parametrize(
    "ns_blocks, error, words",
    [
        ([("x", GATE_UP)], TypeError, ["ns_blocks must be a dict"]),
        ({3: GATE_UP}, TypeError, ["keys must be parameter names or regexes"]),
        ({"layers.0.gate_up_proj.weight": "rows:48,48"}, TypeError, ["'layers.0.gate_up_proj.weight'", "a dict"]),
        (
            {"layers.0.gate_up_proj.weight": {"axis": "rows", "sizes": [48, "48"]}},
            TypeError,
            ["sizes[1] must be an int"],
        ),
        ({"layers.0.gate_up_proj.weight": {"axis": "rows", "sizes": 96}}, TypeError, ["sizes must be a list"]),
        ({"layers.0.gate_up_proj.weight": {"axis": "rows", "sizes": [48, 48], "groups": 1.0}}, TypeError, ["groups"]),
        ({"layers.0.gate_up_proj.weight": {"axis": "diag", "sizes": [96]}}, ValueError, ['axis must be "rows"']),
        ({"layers.0.gate_up_proj.weight": {"sizes": [96]}}, ValueError, ["axis must be"]),
        ({"layers.0.gate_up_proj.weight": {"axis": "rows"}}, ValueError, ["give sizes or stride"]),
        ({"layers.0.gate_up_proj.weight": {"axis": "rows", "sizes": [48], "stride": 2}}, ValueError, ["exactly one"]),
        ({"layers.0.gate_up_proj.weight": {"axis": "rows", "sizes": []}}, ValueError, ["sizes is empty"]),
        ({"layers.0.gate_up_proj.weight": {"axis": "rows", "sizes": [96, 0]}}, ValueError, ["sizes[1] must be >= 1"]),
        ({"layers.0.gate_up_proj.weight": {"axis": "rows", "stride": 2, "groups": 2}}, ValueError, ["groups go with"]),
        ({"layers.0.gate_up_proj.weight": {"axis": "rows", "sizes": [96], "group": 1}}, ValueError, ["unknown field"]),
        (
            {"layers.0.gate_up_proj.weight": {"axis": "rows", "sizes": [48, 40]}},
            ValueError,
            ["do not tile the 96 rows"],
        ),
        ({"layers.0.gate_up_proj.weight": {"axis": "cols", "stride": 5}}, ValueError, ["stride 5", "shape [96, 32]"]),
        ({"layers.0.qkv_proj.bias": {"axis": "rows", "sizes": [96]}}, ValueError, ["is not a matrix"]),
        ({"(unclosed": GATE_UP}, ValueError, ["not a valid regex"]),
        ({"gate_up_proj": GATE_UP}, ValueError, ["'gate_up_proj'", "names no parameter"]),
        (
            {r"layers\.0\.gate_up_proj\.weight": GATE_UP, r".*gate_up_proj\..*": GATE_UP},
            ValueError,
            ["parameter 'layers.0.gate_up_proj.weight' is matched by the keys"],
        ),
    ],
)
def test_bad_specs_raise_naming_the_key(ns_blocks, error, words):
    with pytest.raises(error) as raised:
        mst.manifest_from_module(Fused(), "fused", ns_blocks=ns_blocks)
    for word in words:
        assert word in str(raised.value), (word, str(raised.value))


def test_the_plan_and_every_rank_view_carry_the_blocks(coordinator):
    client = muonshard.Coordinator(coordinator.address)
    version = client.submit(
        mst.manifest_from_module(Fused(), "fused", ns_blocks=SPECS), world_size=2, policy="balanced"
    )
    plan = client.plan(version)
    by_name = {t["name"]: t for t in plan["tensors"]}
    qkv = by_name["layers.0.qkv_proj.weight"]["ns_blocks"]  # proto3 JSON: int64 as strings, defaults printed
    assert (qkv["axis"], qkv["sizes"], qkv["groups"], qkv.get("stride", "0")) == ("ROWS", ["8", "8", "8"], "4", "0")
    stack = by_name["layers.0.experts.gate_up_proj"]["ns_blocks"]
    assert (stack["axis"], stack["stride"], stack.get("sizes", [])) == ("COLS", "2", [])
    index = [t["name"] for t in plan["tensors"]].index("layers.1.gate_up_proj.weight")
    seen = 0
    for rank in range(2):
        for t in client.rank_view(version, rank)["tensors"]:
            if t.get("index", 0) == index:
                assert t["tensor"]["ns_blocks"]["sizes"] == ["48", "48"]
                seen += 1
    assert seen == 2
    # Blocks change the request: another version.
    other = client.submit(mst.manifest_from_module(Fused(), "fused"), world_size=2, policy="balanced")
    assert other != version


def test_blocks_aligned_with_the_tp_split_are_orthogonalised_on_each_shard(coordinator):
    """tp 2 over the column-split qkv_proj (two heads per tp rank) and
    gate_up_proj (gate on one tp rank, up on the other): ns_local."""
    m = mst.manifest_from_module(Fused(), "fused", tp=2, ns_blocks=SPECS)
    split = {t["name"]: t.get("tpSplit") for t in m["tensors"]}
    assert split["layers.0.qkv_proj.weight"] == "TP_COLUMN"
    client = muonshard.Coordinator(coordinator.address)
    plan = client.plan(client.submit(m, world_size=4, tp=2, policy="balanced"))
    by_name = {t["name"]: t for t in plan["tensors"]}
    assert by_name["layers.0.qkv_proj.weight"].get("ns_local") is True
    assert by_name["layers.0.gate_up_proj.weight"].get("ns_local") is True
    assert not by_name["layers.0.o_proj.weight"].get("ns_local")
    ops = {o["tp_op"] for r in plan["ranks"] for o in r.get("owned", []) if o["name"] == "layers.0.qkv_proj.weight"}
    assert ops == {"TP_OP_LOCAL"}


def test_blocks_on_a_tensor_that_is_not_a_muon_matrix_are_refused_on_submit(coordinator):
    m = mst.manifest_from_module(Fused(), "fused", muon_exclude=[r"gate_up_proj\.weight"], ns_blocks=SPECS)
    with pytest.raises(ValueError) as raised:
        muonshard.Coordinator(coordinator.address).submit(m, world_size=2)
    assert "layers.0.gate_up_proj.weight" in str(raised.value)
    assert "ns_blocks rows:48,48 on a tensor that uses AdamW" in str(raised.value)


DEEPSEEK = {
    "model_type": "deepseek_v3",
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 2,
    "num_attention_heads": 4,
    "q_lora_rank": 24,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 6,
    "n_routed_experts": 4,
    "vocab_size": 100,
}


def test_importer_bindings_take_the_block_options():
    text = json.dumps(DEEPSEEK)
    m = json.loads(_muonshard.import_hf_config(text, ns_blocks_mla=True))
    kv_b = {t["name"]: t for t in m["tensors"]}["model.layers.1.self_attn.kv_b_proj.weight"]
    assert kv_b["shape"] == ["56", "16"]
    assert kv_b["ns_blocks"] == {"axis": "ROWS", "sizes": ["8", "6"], "groups": "4"}
    plain = {t["name"]: t for t in json.loads(_muonshard.import_hf_config(text))["tensors"]}
    assert "ns_blocks" not in plain["model.layers.1.self_attn.kv_b_proj.weight"]
    m = json.loads(_muonshard.import_hf_config(text, ns_blocks=[r".*o_proj\.weight=cols:6x4"]))
    assert {t["name"]: t for t in m["tensors"]}["model.layers.0.self_attn.o_proj.weight"]["ns_blocks"]["groups"] == "4"
    with pytest.raises(ValueError, match="matches no tensor"):
        _muonshard.import_hf_config(text, ns_blocks=["nothing=rows:1"])
    llama = json.dumps({**DEEPSEEK, "model_type": "llama"})
    with pytest.raises(ValueError, match="--ns-blocks-mla"):
        _muonshard.import_hf_config(llama, ns_blocks_mla=True)


def test_the_package_importers_pass_the_block_options():
    m = muonshard.manifest_from_hf_config(DEEPSEEK, ns_blocks_mla=True)
    kv_b = {t["name"]: t for t in m["tensors"]}["model.layers.1.self_attn.kv_b_proj.weight"]
    assert kv_b["ns_blocks"] == {"axis": "ROWS", "sizes": ["8", "6"], "groups": "4"}
    m = muonshard.manifest_from_hf_config(DEEPSEEK, ns_blocks=[r".*o_proj\.weight=cols:6x4"])
    assert {t["name"]: t for t in m["tensors"]}["model.layers.0.self_attn.o_proj.weight"]["ns_blocks"]["groups"] == "4"
    with pytest.raises(TypeError, match="REGEX=BLOCKS"):
        muonshard.manifest_from_hf_config(DEEPSEEK, ns_blocks=r".*o_proj\.weight=cols:6x4")
