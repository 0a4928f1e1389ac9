// Mixtral: bias-free GQA attention and a sparse MoE block named as in the
// released checkpoints (block_sparse_moe.gate, block_sparse_moe.experts.E.w1
// / w2 / w3), gate before experts as MixtralSparseMoeBlock defines them.
#include "common/status_macros.h"
#include "importer/internal/families.h"

namespace muonshard::importer::internal {

absl::Status BuildMixtral(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(DecoderDims dims, ReadDecoderDims(config, /*tie_default=*/false));
  MUONSHARD_ASSIGN_OR_RETURN(GqaSpec attention, ReadGqaSpec(config, dims.hidden));
  MUONSHARD_ASSIGN_OR_RETURN(int64_t experts, config.Int("num_local_experts", kCountRange));
  MUONSHARD_RETURN_IF_ERROR(CheckExpertBudget(dims.layers, experts));
  MlpSpec expert{dims.hidden};
  expert.naming = MlpNaming::kW1W2W3;
  MUONSHARD_ASSIGN_OR_RETURN(expert.intermediate, config.Int("intermediate_size", kDimRange));

  auto moe = [&](int64_t, const std::string& prefix, TensorList* list) {
    const std::string p = prefix + "block_sparse_moe.";
    list->Add(p + "gate.weight", {experts, dims.hidden});
    AddExperts(p + "experts.", experts, expert, list);
  };
  AddDecoder(dims, GqaAttentionPart(attention), moe, out);
  return absl::OkStatus();
}

}  // namespace muonshard::importer::internal
