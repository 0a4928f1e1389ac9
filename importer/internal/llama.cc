// Llama: GQA attention (biases with attention_bias) and a SwiGLU MLP (biases
// with mlp_bias), as in transformers' modeling_llama.py.
#include "common/status_macros.h"
#include "importer/internal/families.h"

namespace muonshard::importer::internal {

absl::Status BuildLlama(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(DecoderDims dims, ReadDecoderDims(config, /*tie_default=*/false));
  MUONSHARD_ASSIGN_OR_RETURN(GqaSpec attention, ReadGqaSpec(config, dims.hidden));
  MUONSHARD_ASSIGN_OR_RETURN(bool attention_bias, config.BoolOr("attention_bias", false));
  attention.qkv_bias = attention.o_bias = attention_bias;
  MlpSpec mlp{dims.hidden};
  MUONSHARD_ASSIGN_OR_RETURN(mlp.intermediate, config.Int("intermediate_size", kDimRange));
  MUONSHARD_ASSIGN_OR_RETURN(mlp.bias, config.BoolOr("mlp_bias", false));

  AddDecoder(
      dims, GqaAttentionPart(attention),
      [&](int64_t, const std::string& prefix, TensorList* list) { AddMlp(prefix + "mlp.", mlp, {}, list); }, out);
  return absl::OkStatus();
}

}  // namespace muonshard::importer::internal
