// Mistral: Llama's modules without biases (MistralAttention and MistralMLP
// have none, whatever the config says); head_dim when the config gives it
// (Mistral-Nemo), else hidden / heads, as in transformers' modeling_mistral.py.
#include "common/status_macros.h"
#include "importer/internal/families.h"

namespace muonshard::importer::internal {

absl::Status BuildMistral(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(DecoderDims dims, ReadDecoderDims(config, /*tie_default=*/false));
  MUONSHARD_ASSIGN_OR_RETURN(GqaSpec attention, ReadGqaSpec(config, dims.hidden));
  MlpSpec mlp{dims.hidden};
  MUONSHARD_ASSIGN_OR_RETURN(mlp.intermediate, config.Int("intermediate_size", kDimRange));
  AddDecoder(dims, GqaAttentionPart(attention), MlpPart(mlp), out);
  return absl::OkStatus();
}

}  // namespace muonshard::importer::internal
