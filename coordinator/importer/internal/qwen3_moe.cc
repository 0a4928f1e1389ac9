// Qwen3-MoE: GQA attention with per-head q_norm/k_norm, and per layer either
// a sparse MoE block (router "gate", then experts.E.*) or a dense MLP, chosen
// as Qwen3MoeDecoderLayer does: sparse unless listed in mlp_only_layers, when
// num_experts > 0 and (layer + 1) % decoder_sparse_step == 0.
#include <algorithm>
#include <vector>

#include "common/status_macros.h"
#include "coordinator/importer/internal/families.h"

namespace muonshard::importer::internal {
namespace {

struct Qwen3MoeSpec {
  int64_t experts = 0;
  int64_t sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  MlpSpec expert;
  MlpSpec dense;  // read only when some layer is dense

  bool IsSparse(int64_t layer) const {
    return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end() &&
           experts > 0 && (layer + 1) % sparse_step == 0;
  }
};

absl::StatusOr<Qwen3MoeSpec> ReadQwen3MoeSpec(const HfConfig& config, const DecoderDims& dims) {
  Qwen3MoeSpec spec;
  MUONSHARD_ASSIGN_OR_RETURN(spec.experts, config.Int("num_experts", kOptionalCountRange));
  MUONSHARD_RETURN_IF_ERROR(CheckExpertBudget(dims.layers, spec.experts));
  MUONSHARD_ASSIGN_OR_RETURN(spec.sparse_step, config.IntOr("decoder_sparse_step", 1, kCountRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.mlp_only_layers, config.IntListOr("mlp_only_layers", {0, kMaxCount}));
  spec.expert.hidden = spec.dense.hidden = dims.hidden;
  if (spec.experts > 0) {
    MUONSHARD_ASSIGN_OR_RETURN(spec.expert.intermediate, config.Int("moe_intermediate_size", kDimRange));
  }
  for (int64_t layer = 0; layer < dims.layers; ++layer) {
    if (spec.IsSparse(layer)) continue;
    MUONSHARD_ASSIGN_OR_RETURN(spec.dense.intermediate, config.Int("intermediate_size", kDimRange));
    break;
  }
  return spec;
}

}  // namespace

absl::Status BuildQwen3Moe(const HfConfig& config, bool /*mtp*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(DecoderDims dims, ReadDecoderDims(config, /*tie_default=*/false));
  MUONSHARD_ASSIGN_OR_RETURN(GqaSpec attention, ReadGqaSpec(config, dims.hidden));
  MUONSHARD_ASSIGN_OR_RETURN(bool attention_bias, config.BoolOr("attention_bias", false));
  attention.qkv_bias = attention.o_bias = attention_bias;
  attention.qk_norm = true;
  MUONSHARD_ASSIGN_OR_RETURN(Qwen3MoeSpec moe, ReadQwen3MoeSpec(config, dims));

  auto mlp = [&](int64_t layer, const std::string& prefix, TensorList* list) {
    const std::string p = prefix + "mlp.";
    if (!moe.IsSparse(layer)) {
      AddMlp(p, moe.dense, {}, list);
      return;
    }
    list->Add(p + "gate.weight", {moe.experts, dims.hidden});
    AddExperts(p + "experts.", moe.experts, moe.expert, list);
  };
  AddDecoder(dims, GqaAttentionPart(attention), mlp, out);
  return absl::OkStatus();
}

}  // namespace muonshard::importer::internal
