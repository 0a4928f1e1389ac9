// Phi-3 (Phi-3 / Phi-3.5 mini and medium, Phi-4-mini; model_type phi3):
// Llama's decoder with fused projections, as Phi3Attention and Phi3MLP
// define them: o_proj, then qkv_proj (rows [q | k | v]: heads x head_dim,
// then kv_heads x head_dim twice, GQA); gate_up_proj (rows [gate | up]),
// then down_proj; no biases. Each fused weight is orthogonalised per block
// (ns_blocks), as the separate q/k/v and gate/up of Llama are.
#include "common/status_macros.h"
#include "importer/internal/families.h"

namespace muonshard::importer::internal {
namespace {

void AddPhi3Attention(const std::string& prefix, const GqaSpec& spec, TensorList* out) {
  const std::string p = prefix + "self_attn.";
  const int64_t q = spec.heads * spec.head_dim;
  const int64_t kv = spec.kv_heads * spec.head_dim;
  out->AddLinear(p + "o_proj", spec.hidden, q, /*bias=*/false);
  SetNsBlocks(out->Add(p + "qkv_proj.weight", {q + 2 * kv, spec.hidden}), v1::NsBlocks::ROWS, {q, kv, kv});
}

void AddPhi3Mlp(const std::string& prefix, int64_t hidden, int64_t intermediate, TensorList* out) {
  const std::string p = prefix + "mlp.";
  SetNsBlocks(out->Add(p + "gate_up_proj.weight", {2 * intermediate, hidden}), v1::NsBlocks::ROWS,
              {intermediate, intermediate});
  out->AddLinear(p + "down_proj", hidden, intermediate, /*bias=*/false);
}

}  // namespace

absl::Status BuildPhi3(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(DecoderDims dims, ReadDecoderDims(config, /*tie_default=*/false));
  // head_dim: the config's when it has one, else hidden / heads (Phi3Attention).
  MUONSHARD_ASSIGN_OR_RETURN(GqaSpec attention, ReadGqaSpec(config, dims.hidden));
  MUONSHARD_ASSIGN_OR_RETURN(int64_t intermediate, config.Int("intermediate_size", kDimRange));

  AddDecoder(
      dims, [&](int64_t, const std::string& prefix, TensorList* list) { AddPhi3Attention(prefix, attention, list); },
      [&](int64_t, const std::string& prefix, TensorList* list) {
        AddPhi3Mlp(prefix, dims.hidden, intermediate, list);
      },
      out);
  return absl::OkStatus();
}

}  // namespace muonshard::importer::internal
