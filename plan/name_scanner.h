#ifndef MUONSHARD_PLAN_NAME_SCANNER_H_
#define MUONSHARD_PLAN_NAME_SCANNER_H_

// What the planner reads from tensor names (ResolveModel's first stage):
// the layer and expert indices, fused expert stacks, duplicates and Muon
// exclusion, each name scanned once (NameScanner).

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"
#include "plan/model.h"

namespace muonshard::planner {

// Parses the integer after `token` where token starts the name or follows a
// '.', e.g. IndexAfter("model.layers.12.mlp", "layers.") == 12. -1 if absent.
int IndexAfter(absl::string_view name, absl::string_view token);

// A fused expert stack: "experts." followed by a non-index, e.g.
// "model.layers.0.mlp.experts.gate_up_proj" with shape [E, ...].
bool IsExpertStackName(absl::string_view name);

// Scans each tensor name once. Digit runs collapse to one '0' in the name's
// skeleton ("model.layers.0.mlp.experts.0.up_proj.weight"; a 70k-tensor MoE
// manifest has a few dozen), and what depends on the skeleton only -- where
// "layers.N" and "experts.N" sit, whether it names a fused expert stack and,
// for digit-agnostic patterns, exclusion -- is worked out once per skeleton.
// Names of one skeleton differ only in their digits; manifests list them
// in increasing index order (layer, then expert), so the duplicate check is
// a comparison with the skeleton's previous name until that order breaks,
// and a set of the digits packed in one integer from then on.
class NameScanner {
 public:
  struct Facts {
    bool duplicate = false;
    bool excluded = false;  // only when asked for
    int layer = -1;         // IndexAfter(name, "layers.")
    int expert = -1;        // IndexAfter(name, "experts.")
    bool expert_stack = false;
  };

  explicit NameScanner(const ExcludeMatcher& excludes) : excludes_(excludes) {}

  // The facts of the next name; `need_excluded`: whether to match it
  // against the exclusions.
  Facts Scan(absl::string_view name, bool need_excluded);

 private:
  static constexpr int kMaxRuns = 8;
  static constexpr int kMaxNibbles = 16;
  static constexpr uint64_t kSeparator = 0xF;

  // The digits seen under one skeleton.
  struct Digits {
    bool ordered = true;                // every name's run values above the last's
    std::array<int, kMaxRuns> last{};   // run values of the last name, while ordered
    std::vector<uint64_t> keys;         // packed digits, while ordered
    absl::flat_hash_set<uint64_t> set;  // packed digits, once not
  };

  struct SkeletonInfo {
    bool excluded = false;
    bool expert_stack = false;
    int layer_run = -1;
    int expert_run = -1;
    Digits digits;
  };

  struct Recent {
    static constexpr uint32_t kNone = ~uint32_t{0};
    std::string skeleton;
    uint32_t index = kNone;
  };

  // Whether this name's digits were seen under its skeleton; records them.
  bool SeenDigits(Digits& d);
  // Fills skeleton_, the run values and the nibbles of `name`.
  void BuildSkeleton(absl::string_view name);
  // Per character of every name: defined here, so they inline into
  // BuildSkeleton (out of line they cost 2 % of plan time).
  void AddChar(absl::string_view name, size_t i) {
    const char c = name[i];
    if (!absl::ascii_isdigit(c)) {
      skeleton_[n_++] = c;
      return;
    }
    if (i == 0 || !absl::ascii_isdigit(name[i - 1])) {  // a run starts
      skeleton_[n_++] = '0';
      if (runs_ > 0) AddNibble(kSeparator);
      if (runs_ < kMaxRuns) run_value_[runs_] = 0;
      run_digits_ = 0;
      ++runs_;
    }
    if (++run_digits_ > 9) long_run_ = true;
    if (runs_ <= kMaxRuns && !long_run_) run_value_[runs_ - 1] = run_value_[runs_ - 1] * 10 + (c - '0');
    AddNibble(static_cast<uint64_t>(c - '0') + 1);
  }

  void AddNibble(uint64_t v) {
    if (num_nibbles_ == kMaxNibbles) {
      packable_ = false;
      return;
    }
    nibbles_ |= v << (4 * num_nibbles_++);
  }
  // The skeleton's facts, worked out on its first name.
  SkeletonInfo& Lookup(absl::string_view name);

  const ExcludeMatcher& excludes_;
  absl::flat_hash_map<std::string, uint32_t> memo_;  // skeleton -> its index in infos_
  std::vector<SkeletonInfo> infos_;
  std::array<Recent, 4> recent_;
  size_t next_recent_ = 0;
  absl::flat_hash_set<absl::string_view> unpacked_;
  // The name being scanned.
  std::string skeleton_;
  size_t n_ = 0;
  int runs_ = 0;
  int run_digits_ = 0;
  std::array<int, kMaxRuns> run_value_{};
  uint64_t nibbles_ = 0;
  int num_nibbles_ = 0;
  bool packable_ = true;
  bool long_run_ = false;
};

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_NAME_SCANNER_H_
