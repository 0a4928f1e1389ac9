// Qwen2-MoE and Qwen3-MoE. Per layer either a sparse MoE block or a dense MLP
// (intermediate_size), chosen as both decoder layers do: sparse unless listed
// in mlp_only_layers, when num_experts > 0 and
// (layer + 1) % decoder_sparse_step == 0. The sparse block is defined router
// "gate", then experts.E.*, and in Qwen2-MoE then shared_expert (an MLP of
// shared_expert_intermediate_size) and shared_expert_gate ([1, hidden], the
// sigmoid gate on the shared expert's output).
// Attention: Qwen2-MoE has biases on q/k/v (qkv_bias, default true) and none
// on o_proj; Qwen3-MoE has per-head q_norm / k_norm and biases on all four
// projections with attention_bias.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "importer/internal/families.h"

namespace muonshard::importer::internal {
namespace {

struct QwenMoeSpec {
  int64_t experts = 0;
  int64_t sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  MlpSpec expert;
  MlpSpec dense;   // read only when some layer is dense
  MlpSpec shared;  // Qwen2-MoE's shared_expert; intermediate 0: none

  bool IsSparse(int64_t layer) const {
    return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end() && experts > 0 &&
           (layer + 1) % sparse_step == 0;
  }
};

absl::StatusOr<QwenMoeSpec> ReadQwenMoeSpec(const HfConfig& config, const DecoderDims& dims, bool shared_expert) {
  QwenMoeSpec spec;
  MUONSHARD_ASSIGN_OR_RETURN(spec.experts, config.Int("num_experts", kOptionalCountRange));
  MUONSHARD_RETURN_IF_ERROR(CheckExpertBudget(dims.layers, spec.experts));
  MUONSHARD_ASSIGN_OR_RETURN(spec.sparse_step, config.IntOr("decoder_sparse_step", 1, kCountRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.mlp_only_layers, config.IntListOr("mlp_only_layers", {0, kMaxCount}));
  spec.expert.hidden = spec.dense.hidden = spec.shared.hidden = dims.hidden;
  if (spec.experts > 0) {
    MUONSHARD_ASSIGN_OR_RETURN(spec.expert.intermediate, config.Int("moe_intermediate_size", kDimRange));
    if (shared_expert) {
      MUONSHARD_ASSIGN_OR_RETURN(spec.shared.intermediate, config.Int("shared_expert_intermediate_size", kDimRange));
    }
  }
  for (int64_t layer = 0; layer < dims.layers; ++layer) {
    if (spec.IsSparse(layer)) continue;
    MUONSHARD_ASSIGN_OR_RETURN(spec.dense.intermediate, config.Int("intermediate_size", kDimRange));
    break;
  }
  return spec;
}

void AddSparseBlock(const std::string& p, const QwenMoeSpec& spec, TensorList* out) {
  out->Add(p + "gate.weight", {spec.experts, spec.expert.hidden});
  AddExperts(p + "experts.", spec.experts, spec.expert, out);
  if (spec.shared.intermediate == 0) return;
  AddMlp(p + "shared_expert.", spec.shared, {}, out);
  out->AddLinear(p + "shared_expert_gate", 1, spec.shared.hidden, /*bias=*/false);
}

LayerPartFn QwenMoeMlpPart(QwenMoeSpec spec) {
  return [spec = std::move(spec)](int64_t layer, const std::string& prefix, TensorList* out) {
    if (spec.IsSparse(layer)) {
      AddSparseBlock(prefix + "mlp.", spec, out);
    } else {
      AddMlp(prefix + "mlp.", spec.dense, {}, out);
    }
  };
}

}  // namespace

absl::Status BuildQwen2Moe(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(DecoderDims dims, ReadDecoderDims(config, /*tie_default=*/false));
  MUONSHARD_ASSIGN_OR_RETURN(GqaSpec attention, ReadGqaSpec(config, dims.hidden));
  MUONSHARD_ASSIGN_OR_RETURN(attention.qkv_bias, config.BoolOr("qkv_bias", true));
  MUONSHARD_ASSIGN_OR_RETURN(QwenMoeSpec moe, ReadQwenMoeSpec(config, dims, /*shared_expert=*/true));
  AddDecoder(dims, GqaAttentionPart(attention), QwenMoeMlpPart(std::move(moe)), out);
  return absl::OkStatus();
}

absl::Status BuildQwen3Moe(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(DecoderDims dims, ReadDecoderDims(config, /*tie_default=*/false));
  MUONSHARD_ASSIGN_OR_RETURN(GqaSpec attention, ReadGqaSpec(config, dims.hidden));
  MUONSHARD_ASSIGN_OR_RETURN(bool attention_bias, config.BoolOr("attention_bias", false));
  attention.qkv_bias = attention.o_bias = attention_bias;
  attention.qk_norm = true;
  MUONSHARD_ASSIGN_OR_RETURN(QwenMoeSpec moe, ReadQwenMoeSpec(config, dims, /*shared_expert=*/false));
  AddDecoder(dims, GqaAttentionPart(attention), QwenMoeMlpPart(std::move(moe)), out);
  return absl::OkStatus();
}

}  // namespace muonshard::importer::internal
