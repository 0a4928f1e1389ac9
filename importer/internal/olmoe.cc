// OLMoE: Llama-style GQA attention (biases with attention_bias) followed by
// q_norm and k_norm over the whole projection (q_norm [hidden], k_norm
// [hidden / heads * kv_heads], not per head), and in every layer a sparse MoE
// block defined as OlmoeSparseMoeBlock does: router "gate", then
// experts.E.gate_proj / up_proj / down_proj.
#include "common/status_macros.h"
#include "importer/internal/families.h"

namespace muonshard::importer::internal {
namespace {

void AddOlmoeAttention(const std::string& prefix, const GqaSpec& spec, TensorList* out) {
  AddGqaAttention(prefix, spec, out);
  out->Add(prefix + "self_attn.q_norm.weight", {spec.hidden});
  out->Add(prefix + "self_attn.k_norm.weight", {spec.hidden / spec.heads * spec.kv_heads});
}

}  // namespace

absl::Status BuildOlmoe(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(DecoderDims dims, ReadDecoderDims(config, /*tie_default=*/false));
  MUONSHARD_ASSIGN_OR_RETURN(GqaSpec attention, ReadGqaSpec(config, dims.hidden));
  MUONSHARD_ASSIGN_OR_RETURN(bool attention_bias, config.BoolOr("attention_bias", false));
  attention.qkv_bias = attention.o_bias = attention_bias;
  MUONSHARD_ASSIGN_OR_RETURN(int64_t experts, config.Int("num_experts", kCountRange));
  MUONSHARD_RETURN_IF_ERROR(CheckExpertBudget(dims.layers, experts));
  MlpSpec expert{dims.hidden};
  MUONSHARD_ASSIGN_OR_RETURN(expert.intermediate, config.Int("intermediate_size", kDimRange));

  auto attention_part = [&](int64_t, const std::string& prefix, TensorList* list) {
    AddOlmoeAttention(prefix, attention, list);
  };
  auto moe = [&](int64_t, const std::string& prefix, TensorList* list) {
    const std::string p = prefix + "mlp.";
    list->Add(p + "gate.weight", {experts, dims.hidden});
    AddExperts(p + "experts.", experts, expert, list);
  };
  AddDecoder(dims, attention_part, moe, out);
  return absl::OkStatus();
}

}  // namespace muonshard::importer::internal
