#ifndef MUONSHARD_IMPORTER_NS_BLOCKS_RULES_H_
#define MUONSHARD_IMPORTER_NS_BLOCKS_RULES_H_

// Per-block Newton-Schulz by tensor-name rules (`--ns-blocks`): sets
// TensorSpec.ns_blocks on the tensors whose names a rule matches, for
// checkpoints the HF families do not describe (a torchtitan w13, a Paddle
// fused qkv, ...). Pure.
//
// A rule is REGEX=BLOCKS: REGEX an RE2 regex that must match the whole
// tensor name (case-sensitive; whitespace around it is dropped), BLOCKS the
// text form of planner::ParseNsBlocks (the last '=' splits them):
//   '.*\.qkv_proj\.weight=rows:3072,1024,1024'   q | k | v rows
//   '.*\.query_key_value\.weight=rows:64,64,64x32' per head [q_h, k_h, v_h], 32 heads
//   '.*experts\.gate_up_proj=cols:stride2'       alternating columns
// docs/planner.md, "Fused weights: per-block Newton-Schulz".

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard::importer {

struct NsBlocksRule {
  std::string text;     // the rule as given, for messages
  std::string pattern;  // REGEX
  v1::NsBlocks blocks;
};

// Parses one rule. INVALID_ARGUMENT naming the rule: no '=', an empty or
// invalid regex, or blocks that do not parse.
absl::StatusOr<NsBlocksRule> ParseNsBlocksRule(absl::string_view rule);

// Parses `rules` and sets the blocks of every tensor one matches, replacing
// any it had. INVALID_ARGUMENT, with the manifest unchanged: a rule that does
// not parse or matches no tensor (naming the rule), a tensor two rules match,
// or blocks that do not tile the tensor they match (naming the tensor, the
// rule and the sizes: planner::CheckNsBlocks). Whether the tensor is a Muon
// matrix is the planner's to check (it depends on the plan's policy).
absl::Status ApplyNsBlocksRules(const std::vector<std::string>& rules, v1::ModelManifest* manifest);

}  // namespace muonshard::importer

#endif  // MUONSHARD_IMPORTER_NS_BLOCKS_RULES_H_
