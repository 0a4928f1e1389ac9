// gpt-oss: GQA attention with biases and one learned sink per head, and a
// MoE block defined as GptOssMLP does: router (weight, bias), then the fused
// experts. The experts are 3-D tensors stored [E, in, out] (gate_up_proj
// [E, hidden, 2*intermediate], down_proj [E, intermediate, hidden]), the
// transpose of nn.Linear, hence layout IN_OUT; their biases are [E, out].
// gate_up_proj holds gate and up in alternating columns (GptOssExperts
// reads gate_up[..., ::2] and gate_up[..., 1::2]): Newton-Schulz runs per
// half, ns_blocks cols stride 2.
#include "common/status_macros.h"
#include "importer/internal/families.h"

namespace muonshard::importer::internal {
namespace {

void AddMoeBlock(const std::string& prefix, int64_t experts, int64_t hidden, int64_t intermediate, TensorList* out) {
  const std::string p = prefix + "mlp.";
  out->AddLinear(p + "router", experts, hidden, /*bias=*/true);
  v1::TensorSpec* gate_up = out->Add(p + "experts.gate_up_proj", {experts, hidden, 2 * intermediate});
  gate_up->set_layout(v1::IN_OUT);
  SetNsBlockStride(gate_up, v1::NsBlocks::COLS, 2);
  out->Add(p + "experts.gate_up_proj_bias", {experts, 2 * intermediate});
  out->Add(p + "experts.down_proj", {experts, intermediate, hidden})->set_layout(v1::IN_OUT);
  out->Add(p + "experts.down_proj_bias", {experts, hidden});
}

}  // namespace

absl::Status BuildGptOss(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(DecoderDims dims, ReadDecoderDims(config, /*tie_default=*/false));
  // GptOssConfig's head_dim defaults to 64, not hidden / heads (2880 / 64).
  MUONSHARD_ASSIGN_OR_RETURN(GqaSpec attention, ReadGqaSpec(config, dims.hidden, /*head_dim_default=*/64));
  MUONSHARD_ASSIGN_OR_RETURN(bool attention_bias, config.BoolOr("attention_bias", true));
  attention.qkv_bias = attention.o_bias = attention_bias;
  attention.sinks = true;
  MUONSHARD_ASSIGN_OR_RETURN(int64_t experts, config.Int("num_local_experts", kCountRange));
  MUONSHARD_ASSIGN_OR_RETURN(int64_t intermediate, config.Int("intermediate_size", kDimRange));

  AddDecoder(
      dims, GqaAttentionPart(attention),
      [&](int64_t, const std::string& prefix, TensorList* list) {
        AddMoeBlock(prefix, experts, dims.hidden, intermediate, list);
      },
      out);
  return absl::OkStatus();
}

}  // namespace muonshard::importer::internal
