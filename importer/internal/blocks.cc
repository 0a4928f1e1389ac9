#include "importer/internal/blocks.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::importer::internal {
namespace {

// Expert MLPs in the whole model; Kimi-K2, the largest supported, has 23,040.
constexpr int64_t kMaxExpertMlps = int64_t{1} << 20;

}  // namespace

v1::TensorSpec* TensorList::Add(std::string name, const std::vector<int64_t>& shape) {
  v1::TensorSpec* t = manifest_->add_tensors();
  if (name_prefix_.empty()) {
    t->set_name(std::move(name));
  } else {
    t->set_name(absl::StrCat(name_prefix_, name));
  }
  for (int64_t d : shape) t->add_shape(d);
  t->set_dtype(dtype_);
  return t;
}

void TensorList::AddLinear(const std::string& name, int64_t out_features, int64_t in_features, bool bias) {
  Add(name + ".weight", {out_features, in_features});
  if (bias) Add(name + ".bias", {out_features});
}

TensorList TensorList::WithNamePrefix(absl::string_view prefix) const {
  TensorList list(dtype_, manifest_);
  list.name_prefix_ = absl::StrCat(name_prefix_, prefix);
  return list;
}

std::string LayerPrefix(int64_t layer) { return absl::StrCat("model.layers.", layer, "."); }

void SetNsBlocks(v1::TensorSpec* tensor, v1::NsBlocks::Axis axis, const std::vector<int64_t>& sizes, int64_t groups) {
  v1::NsBlocks* b = tensor->mutable_ns_blocks();
  b->set_axis(axis);
  for (int64_t s : sizes) b->add_sizes(s);
  if (groups != 1) b->set_groups(groups);
}

void SetNsBlockStride(v1::TensorSpec* tensor, v1::NsBlocks::Axis axis, int64_t stride) {
  v1::NsBlocks* b = tensor->mutable_ns_blocks();
  b->set_axis(axis);
  b->set_stride(stride);
}

absl::StatusOr<DecoderDims> ReadDecoderDims(const HfConfig& config, bool tie_default,
                                            std::optional<int64_t> vocab_default) {
  DecoderDims dims;
  MUONSHARD_ASSIGN_OR_RETURN(dims.hidden, config.Int("hidden_size", kDimRange));
  MUONSHARD_ASSIGN_OR_RETURN(dims.layers, config.Int("num_hidden_layers", kCountRange));
  if (vocab_default) {
    MUONSHARD_ASSIGN_OR_RETURN(dims.vocab, config.IntOr("vocab_size", *vocab_default, kDimRange));
  } else {
    MUONSHARD_ASSIGN_OR_RETURN(dims.vocab, config.Int("vocab_size", kDimRange));
  }
  MUONSHARD_ASSIGN_OR_RETURN(dims.tie_embeddings, config.BoolOr("tie_word_embeddings", tie_default));
  return dims;
}

void AddLayerNorms(const std::string& prefix, int64_t hidden, TensorList* out) {
  out->Add(prefix + "input_layernorm.weight", {hidden});
  out->Add(prefix + "post_attention_layernorm.weight", {hidden});
}

void AddEmbeddingAndLayers(const DecoderDims& dims, const LayerPartFn& attention, const LayerPartFn& mlp,
                           TensorList* out) {
  out->Add("model.embed_tokens.weight", {dims.vocab, dims.hidden});
  for (int64_t layer = 0; layer < dims.layers; ++layer) {
    std::string prefix = LayerPrefix(layer);
    attention(layer, prefix, out);
    mlp(layer, prefix, out);
    AddLayerNorms(prefix, dims.hidden, out);
  }
}

void AddFinalNormAndHead(const DecoderDims& dims, TensorList* out) {
  out->Add("model.norm.weight", {dims.hidden});
  if (!dims.tie_embeddings) out->AddLinear("lm_head", dims.vocab, dims.hidden, dims.head_bias);
}

void AddDecoder(const DecoderDims& dims, const LayerPartFn& attention, const LayerPartFn& mlp, TensorList* out) {
  AddEmbeddingAndLayers(dims, attention, mlp, out);
  AddFinalNormAndHead(dims, out);
}

absl::StatusOr<GqaSpec> ReadGqaSpec(const HfConfig& config, int64_t hidden, std::optional<int64_t> head_dim_default) {
  GqaSpec spec;
  spec.hidden = hidden;
  MUONSHARD_ASSIGN_OR_RETURN(spec.heads, config.Int("num_attention_heads", kCountRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.kv_heads, config.IntOr("num_key_value_heads", spec.heads, kCountRange));
  if (head_dim_default) {
    MUONSHARD_ASSIGN_OR_RETURN(spec.head_dim, config.IntOr("head_dim", *head_dim_default, kDimRange));
    return spec;
  }
  if (!config.Has("head_dim") && hidden % spec.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: hidden_size ", hidden,
                                                   " is not divisible by num_attention_heads ", spec.heads,
                                                   " and there is no \"head_dim\""));
  }
  MUONSHARD_ASSIGN_OR_RETURN(spec.head_dim, config.IntOr("head_dim", hidden / spec.heads, kDimRange));
  return spec;
}

void AddGqaAttention(const std::string& prefix, const GqaSpec& spec, TensorList* out) {
  const std::string p = prefix + "self_attn.";
  out->AddLinear(p + "q_proj", spec.heads * spec.head_dim, spec.hidden, spec.qkv_bias);
  out->AddLinear(p + "k_proj", spec.kv_heads * spec.head_dim, spec.hidden, spec.qkv_bias);
  out->AddLinear(p + "v_proj", spec.kv_heads * spec.head_dim, spec.hidden, spec.qkv_bias);
  out->AddLinear(p + "o_proj", spec.hidden, spec.heads * spec.head_dim, spec.o_bias);
  if (spec.qk_norm) {
    out->Add(p + "q_norm.weight", {spec.head_dim});
    out->Add(p + "k_norm.weight", {spec.head_dim});
  }
  if (spec.sinks) out->Add(p + "sinks", {spec.heads});
}

LayerPartFn GqaAttentionPart(GqaSpec spec) {
  return [spec](int64_t, const std::string& prefix, TensorList* out) { AddGqaAttention(prefix, spec, out); };
}

absl::StatusOr<MlaSpec> ReadMlaSpec(const HfConfig& config, int64_t hidden) {
  MlaSpec spec;
  spec.hidden = hidden;
  MUONSHARD_ASSIGN_OR_RETURN(spec.heads, config.Int("num_attention_heads", kCountRange));
  // q_lora_rank is null in the DeepSeek configs without a query LoRA (V2-Lite).
  MUONSHARD_ASSIGN_OR_RETURN(spec.q_lora_rank, config.IntOr("q_lora_rank", 0, {0, kMaxDim}));
  MUONSHARD_ASSIGN_OR_RETURN(spec.kv_lora_rank, config.Int("kv_lora_rank", kDimRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.qk_nope_head_dim, config.Int("qk_nope_head_dim", kDimRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.qk_rope_head_dim, config.Int("qk_rope_head_dim", kDimRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.v_head_dim, config.Int("v_head_dim", kDimRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.bias, config.BoolOr("attention_bias", false));
  return spec;
}

void AddMlaAttention(const std::string& prefix, const MlaSpec& spec, TensorList* out) {
  const std::string p = prefix + "self_attn.";
  const int64_t q_out = spec.heads * (spec.qk_nope_head_dim + spec.qk_rope_head_dim);
  if (spec.q_lora_rank == 0) {
    out->AddLinear(p + "q_proj", q_out, spec.hidden, /*bias=*/false);
  } else {
    out->AddLinear(p + "q_a_proj", spec.q_lora_rank, spec.hidden, spec.bias);
    out->Add(p + "q_a_layernorm.weight", {spec.q_lora_rank});
    out->AddLinear(p + "q_b_proj", q_out, spec.q_lora_rank, /*bias=*/false);
  }
  out->AddLinear(p + "kv_a_proj_with_mqa", spec.kv_lora_rank + spec.qk_rope_head_dim, spec.hidden, spec.bias);
  out->Add(p + "kv_a_layernorm.weight", {spec.kv_lora_rank});
  v1::TensorSpec* kv_b =
      out->Add(p + "kv_b_proj.weight", {spec.heads * (spec.qk_nope_head_dim + spec.v_head_dim), spec.kv_lora_rank});
  if (spec.kv_b_head_blocks) {
    SetNsBlocks(kv_b, v1::NsBlocks::ROWS, {spec.qk_nope_head_dim, spec.v_head_dim}, spec.heads);
  }
  out->AddLinear(p + "o_proj", spec.hidden, spec.heads * spec.v_head_dim, spec.bias);
}

void AddMlp(const std::string& prefix, const MlpSpec& spec, std::optional<int> expert, TensorList* out) {
  struct Proj {
    const char* name;
    int64_t out_features;
    int64_t in_features;
  };
  const Proj gate_up_down[] = {{"gate_proj", spec.intermediate, spec.hidden},
                               {"up_proj", spec.intermediate, spec.hidden},
                               {"down_proj", spec.hidden, spec.intermediate}};
  const Proj w1_w2_w3[] = {{"w1", spec.intermediate, spec.hidden},
                           {"w2", spec.hidden, spec.intermediate},
                           {"w3", spec.intermediate, spec.hidden}};
  for (const Proj& proj : spec.naming == MlpNaming::kW1W2W3 ? w1_w2_w3 : gate_up_down) {
    const std::string name = prefix + proj.name;
    v1::TensorSpec* w = out->Add(name + ".weight", {proj.out_features, proj.in_features});
    if (expert) w->set_expert(*expert);
    if (!spec.bias) continue;
    v1::TensorSpec* b = out->Add(name + ".bias", {proj.out_features});
    if (expert) b->set_expert(*expert);
  }
}

LayerPartFn MlpPart(MlpSpec spec) {
  return [spec](int64_t, const std::string& prefix, TensorList* out) { AddMlp(prefix + "mlp.", spec, {}, out); };
}

void AddExperts(const std::string& prefix, int64_t count, const MlpSpec& spec, TensorList* out) {
  for (int64_t e = 0; e < count; ++e) {
    AddMlp(absl::StrCat(prefix, e, "."), spec, static_cast<int>(e), out);
  }
}

absl::Status CheckExpertBudget(int64_t layers, int64_t experts) {
  if (layers * experts <= kMaxExpertMlps) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", layers, " layers x ", experts,
                                                 " experts is more than the ", kMaxExpertMlps,
                                                 " expert MLPs an import may hold"));
}

}  // namespace muonshard::importer::internal
