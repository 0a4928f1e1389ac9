// ERNIE 4.5 MoE (-PT checkpoints): Llama-style GQA attention, with ERNIE's
// own field names (moe_num_experts, moe_k, moe_layer_start_index, ...). A
// layer is sparse, as Ernie4_5_MoeDecoderLayer decides, when
// (layer + 1) % moe_layer_interval == 0 and start <= layer <= end; its block
// is defined as moe_statics (the routing correction bias), gate, experts,
// shared_experts. use_bias puts biases on every Linear, lm_head included.
#include "common/status_macros.h"
#include "importer/internal/families.h"

namespace muonshard::importer::internal {
namespace {

struct ErnieMoeSpec {
  int64_t experts = 0;
  int64_t shared_experts = 0;
  int64_t start = 1;
  int64_t end = 0;
  int64_t interval = 1;
  MlpSpec expert;
  MlpSpec dense;  // read only when some layer is dense

  bool IsMoe(int64_t layer) const { return (layer + 1) % interval == 0 && layer >= start && layer <= end; }
};

absl::StatusOr<ErnieMoeSpec> ReadErnieMoeSpec(const HfConfig& config, const DecoderDims& dims, bool bias) {
  ErnieMoeSpec spec;
  MUONSHARD_ASSIGN_OR_RETURN(spec.experts, config.Int("moe_num_experts", kCountRange));
  MUONSHARD_RETURN_IF_ERROR(CheckExpertBudget(dims.layers, spec.experts));
  MUONSHARD_ASSIGN_OR_RETURN(spec.shared_experts, config.IntOr("moe_num_shared_experts", 0, kOptionalCountRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.start, config.IntOr("moe_layer_start_index", 1, kOptionalCountRange));
  // -1 (the default) means the last layer, as Ernie4_5_MoeConfig resolves it.
  MUONSHARD_ASSIGN_OR_RETURN(spec.end, config.IntOr("moe_layer_end_index", -1, {-1, kMaxCount}));
  if (spec.end == -1) spec.end = dims.layers - 1;
  MUONSHARD_ASSIGN_OR_RETURN(spec.interval, config.IntOr("moe_layer_interval", 1, kCountRange));
  spec.expert = spec.dense = MlpSpec{dims.hidden, 0, bias};
  MUONSHARD_ASSIGN_OR_RETURN(spec.expert.intermediate, config.Int("moe_intermediate_size", kDimRange));
  for (int64_t layer = 0; layer < dims.layers; ++layer) {
    if (spec.IsMoe(layer)) continue;
    MUONSHARD_ASSIGN_OR_RETURN(spec.dense.intermediate, config.Int("intermediate_size", kDimRange));
    break;
  }
  return spec;
}

void AddMoeBlock(const std::string& prefix, const ErnieMoeSpec& spec, TensorList* out) {
  const std::string p = prefix + "mlp.";
  // Both routing tensors stay fp32: the HF model lists gate and moe_statics
  // in _keep_in_fp32_modules_strict, and the router runs in fp32.
  out->Add(p + "moe_statics.e_score_correction_bias", {1, spec.experts})->set_dtype(v1::FP32);
  out->Add(p + "gate.weight", {spec.experts, spec.expert.hidden})->set_dtype(v1::FP32);
  AddExperts(p + "experts.", spec.experts, spec.expert, out);
  if (spec.shared_experts > 0) {
    MlpSpec shared = spec.expert;
    shared.intermediate *= spec.shared_experts;
    AddMlp(p + "shared_experts.", shared, {}, out);
  }
}

}  // namespace

absl::Status BuildErnie45Moe(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(DecoderDims dims, ReadDecoderDims(config, /*tie_default=*/true));
  MUONSHARD_ASSIGN_OR_RETURN(bool bias, config.BoolOr("use_bias", false));
  dims.head_bias = bias;
  MUONSHARD_ASSIGN_OR_RETURN(GqaSpec attention, ReadGqaSpec(config, dims.hidden));
  attention.qkv_bias = attention.o_bias = bias;
  MUONSHARD_ASSIGN_OR_RETURN(ErnieMoeSpec moe, ReadErnieMoeSpec(config, dims, bias));

  auto mlp = [&](int64_t layer, const std::string& prefix, TensorList* list) {
    if (moe.IsMoe(layer)) {
      AddMoeBlock(prefix, moe, list);
    } else {
      AddMlp(prefix + "mlp.", moe.dense, {}, list);
    }
  };
  AddDecoder(dims, GqaAttentionPart(attention), mlp, out);
  return absl::OkStatus();
}

}  // namespace muonshard::importer::internal
