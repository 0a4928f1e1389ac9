// DeepSeek-V3 and Kimi-K2: MLA attention; the first first_k_dense_replace
// layers (and those off moe_layer_freq) have a dense MLP, the others a MoE
// block defined as DeepseekV3MoE does: experts.E.*, then the router "gate"
// (weight, and e_score_correction_bias for noaux_tc routing), then
// shared_experts. With FamilyOptions.mla_head_blocks, kv_b_proj is
// orthogonalised per head (its rows: k_nope_h then v_h for each head h).
#include "common/status_macros.h"
#include "importer/internal/families.h"

namespace muonshard::importer::internal {
namespace {

struct DeepseekMoeSpec {
  int64_t experts = 0;
  int64_t shared_experts = 0;
  int64_t first_dense = 0;
  int64_t layer_freq = 1;
  bool correction_bias = false;
  MlpSpec expert;
  MlpSpec dense;  // read only when first_dense > 0

  bool IsMoe(int64_t layer) const { return layer >= first_dense && layer % layer_freq == 0; }
};

absl::StatusOr<DeepseekMoeSpec> ReadMoeSpec(const HfConfig& config, const DecoderDims& dims) {
  DeepseekMoeSpec spec;
  MUONSHARD_ASSIGN_OR_RETURN(spec.experts, config.Int("n_routed_experts", kCountRange));
  MUONSHARD_RETURN_IF_ERROR(CheckExpertBudget(dims.layers, spec.experts));
  MUONSHARD_ASSIGN_OR_RETURN(spec.shared_experts, config.IntOr("n_shared_experts", 0, kOptionalCountRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.first_dense, config.IntOr("first_k_dense_replace", 0, kOptionalCountRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.layer_freq, config.IntOr("moe_layer_freq", 1, kCountRange));
  // The router holds e_score_correction_bias only for aux-loss-free routing,
  // the default of DeepSeek-V3's configuration class.
  MUONSHARD_ASSIGN_OR_RETURN(std::string topk_method, config.StringOr("topk_method", "noaux_tc"));
  spec.correction_bias = topk_method == "noaux_tc";
  spec.expert.hidden = spec.dense.hidden = dims.hidden;
  MUONSHARD_ASSIGN_OR_RETURN(spec.expert.intermediate, config.Int("moe_intermediate_size", kDimRange));
  if (spec.first_dense > 0 || spec.layer_freq > 1) {
    MUONSHARD_ASSIGN_OR_RETURN(spec.dense.intermediate, config.Int("intermediate_size", kDimRange));
  }
  return spec;
}

void AddMoeBlock(const std::string& prefix, const DeepseekMoeSpec& spec, TensorList* out) {
  const std::string p = prefix + "mlp.";
  AddExperts(p + "experts.", spec.experts, spec.expert, out);
  out->Add(p + "gate.weight", {spec.experts, spec.expert.hidden});
  // fp32 in the checkpoints (DeepseekV3PreTrainedModel keeps it in fp32).
  if (spec.correction_bias) out->Add(p + "gate.e_score_correction_bias", {spec.experts})->set_dtype(v1::FP32);
  if (spec.shared_experts > 0) {
    MlpSpec shared = spec.expert;
    shared.intermediate *= spec.shared_experts;
    AddMlp(p + "shared_experts.", shared, {}, out);
  }
}

// One next-n prediction (MTP) layer as the checkpoints store it, under the
// next model.layers index: its own embedding and head around a full decoder
// layer. Order follows the data flow: embed_tokens -> enorm, hidden -> hnorm,
// eh_proj over both, the decoder layer, shared_head.
void AddMtpLayer(int64_t layer, const DecoderDims& dims, const LayerPartFn& attention, const LayerPartFn& mlp,
                 TensorList* out) {
  const std::string prefix = LayerPrefix(layer);
  out->Add(prefix + "embed_tokens.weight", {dims.vocab, dims.hidden});
  out->Add(prefix + "enorm.weight", {dims.hidden});
  out->Add(prefix + "hnorm.weight", {dims.hidden});
  out->AddLinear(prefix + "eh_proj", dims.hidden, 2 * dims.hidden, /*bias=*/false);
  attention(layer, prefix, out);
  mlp(layer, prefix, out);
  AddLayerNorms(prefix, dims.hidden, out);
  out->Add(prefix + "shared_head.norm.weight", {dims.hidden});
  // An output head over the vocabulary like lm_head, which the default
  // exclusion patterns catch by name; this one needs the explicit override.
  out->Add(prefix + "shared_head.head.weight", {dims.vocab, dims.hidden})->set_optimizer(v1::ADAMW);
}

}  // namespace

absl::Status BuildDeepseekV3(const HfConfig& config, const FamilyOptions& options, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(DecoderDims dims, ReadDecoderDims(config, /*tie_default=*/false));
  MUONSHARD_ASSIGN_OR_RETURN(MlaSpec mla, ReadMlaSpec(config, dims.hidden));
  mla.kv_b_head_blocks = options.mla_head_blocks;
  MUONSHARD_ASSIGN_OR_RETURN(DeepseekMoeSpec moe, ReadMoeSpec(config, dims));
  int64_t mtp_layers = 0;
  if (options.mtp) {
    MUONSHARD_ASSIGN_OR_RETURN(mtp_layers, config.IntOr("num_nextn_predict_layers", 0, kOptionalCountRange));
  }

  auto attention = [&](int64_t, const std::string& prefix, TensorList* list) { AddMlaAttention(prefix, mla, list); };
  auto mlp = [&](int64_t layer, const std::string& prefix, TensorList* list) {
    if (moe.IsMoe(layer)) {
      AddMoeBlock(prefix, moe, list);
    } else {
      AddMlp(prefix + "mlp.", moe.dense, {}, list);
    }
  };
  AddEmbeddingAndLayers(dims, attention, mlp, out);
  // The checkpoints name the MTP layers as further entries of model.layers,
  // so they come before model.norm; that also keeps model.norm and lm_head
  // trailing, where the planner puts them on the last pipeline stage.
  for (int64_t k = 0; k < mtp_layers; ++k) AddMtpLayer(dims.layers + k, dims, attention, mlp, out);
  AddFinalNormAndHead(dims, out);
  return absl::OkStatus();
}

}  // namespace muonshard::importer::internal
