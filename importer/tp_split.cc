#include "importer/tp_split.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "plan/model.h"

namespace muonshard::importer {
namespace {

constexpr absl::string_view kColumnModules[] = {
    "q_proj", "k_proj", "v_proj", "qkv_proj", "q_b_proj", "kv_b_proj", "gate_proj", "up_proj", "gate_up_proj", "w1",
    "w3", "embed_tokens", "lm_head",
    // GPT-NeoX and Falcon (Megatron's GPT names).
    "query_key_value", "dense_h_to_4h", "embed_in", "embed_out", "word_embeddings"};
constexpr absl::string_view kRowModules[] = {"o_proj", "down_proj", "w2", "dense_4h_to_h"};

bool In(absl::string_view module, absl::Span<const absl::string_view> modules) {
  for (absl::string_view m : modules) {
    if (module == m) return true;
  }
  return false;
}

// Per-expert ("experts.N.") or a fused stack ("experts.<proj>"); not
// "shared_experts.".
bool IsExpertTensor(const v1::TensorSpec& t) {
  if (t.has_expert()) return true;
  for (absl::string_view part : absl::StrSplit(t.name(), '.')) {
    if (part == "experts") return true;
  }
  return false;
}

// The split of `name` by its module (the component before a final
// ".weight" / ".bias", or the last one for fused stacks such as
// "experts.gate_up_proj").
v1::TpSplit SplitOf(absl::string_view name) {
  std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  absl::string_view last = parts.back();
  const bool is_bias = last == "bias" || absl::EndsWith(last, "_bias");
  absl::string_view module = last;
  if ((last == "weight" || last == "bias") && parts.size() >= 2) module = parts[parts.size() - 2];
  if (absl::EndsWith(module, "_bias")) module.remove_suffix(5);
  if (module == "head" && absl::EndsWith(name, "shared_head.head.weight")) return v1::TP_COLUMN;
  // The attention output projection of GPT-NeoX ("attention.dense") and
  // Falcon ("self_attention.dense").
  const bool attention_dense = module == "dense" && parts.size() >= 3 &&
                               (parts[parts.size() - 3] == "attention" || parts[parts.size() - 3] == "self_attention");
  if (attention_dense && !is_bias) return v1::TP_ROW;
  if (In(module, kColumnModules)) return v1::TP_COLUMN;
  if (In(module, kRowModules) && !is_bias) return v1::TP_ROW;
  return v1::TP_REPLICATED;
}

}  // namespace

absl::Status MarkTensorParallel(const TpSplitOptions& options, v1::ModelManifest* manifest) {
  if (options.tp < 1) return absl::InvalidArgumentError(absl::StrCat("tp must be >= 1, got ", options.tp));
  std::vector<v1::TpSplit> splits;
  splits.reserve(manifest->tensors_size());
  for (const v1::TensorSpec& t : manifest->tensors()) {
    v1::TpSplit split = t.shape_size() == 0 ? v1::TP_REPLICATED : SplitOf(t.name());
    if (IsExpertTensor(t) && !options.split_experts) split = v1::TP_REPLICATED;
    if (split == v1::TP_ROW && t.shape_size() < 2) split = v1::TP_REPLICATED;
    if (options.keep_marked && t.tp_split() != v1::TP_SPLIT_UNSPECIFIED) split = t.tp_split();
    if (split != v1::TP_REPLICATED && t.shape_size() > 0) {
      const int dim = planner::TpSplitDim(t.shape_size(), t.layout(), split);
      if (dim < 0) {
        return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name(), "\": a 1-D tensor has no row split"));
      }
      if (!options.shard_shapes && t.shape(dim) % options.tp != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", t.name(), "\": ", split == v1::TP_COLUMN ? "column" : "row",
                         "-parallel dimension ", dim, " (", t.shape(dim), ") is not divisible by tp ", options.tp));
      }
    }
    splits.push_back(split);
  }
  for (int i = 0; i < manifest->tensors_size(); ++i) {
    v1::TensorSpec& t = *manifest->mutable_tensors(i);
    t.set_tp_split(splits[i]);
    if (options.shard_shapes && splits[i] != v1::TP_REPLICATED && t.shape_size() > 0) {
      const int dim = planner::TpSplitDim(t.shape_size(), t.layout(), splits[i]);
      t.set_shape(dim, t.shape(dim) * options.tp);
    }
  }
  return absl::OkStatus();
}

}  // namespace muonshard::importer
