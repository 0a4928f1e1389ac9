// Qwen2 (and Qwen2.5): Llama's modules with biases on q_proj, k_proj and
// v_proj (not o_proj), as Qwen2Attention defines them; head_dim when the
// config gives it, else hidden / heads.
#include "common/status_macros.h"
#include "importer/internal/families.h"

namespace muonshard::importer::internal {

absl::Status BuildQwen2(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(DecoderDims dims, ReadDecoderDims(config, /*tie_default=*/false));
  MUONSHARD_ASSIGN_OR_RETURN(GqaSpec attention, ReadGqaSpec(config, dims.hidden));
  attention.qkv_bias = true;
  MlpSpec mlp{dims.hidden};
  MUONSHARD_ASSIGN_OR_RETURN(mlp.intermediate, config.Int("intermediate_size", kDimRange));
  AddDecoder(dims, GqaAttentionPart(attention), MlpPart(mlp), out);
  return absl::OkStatus();
}

}  // namespace muonshard::importer::internal
