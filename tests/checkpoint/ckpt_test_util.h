#ifndef MUONSHARD_TESTS_CHECKPOINT_CKPT_TEST_UTIL_H_
#define MUONSHARD_TESTS_CHECKPOINT_CKPT_TEST_UTIL_H_

// Helpers for the checkpoint tests: small models and their plans, synthetic
// optimizer state whose every element is a known function of (tensor name,
// kind, element index) — so the expected value of any element under any
// layout is known — scratch directories and byte surgery on files.

#include <signal.h>
#include <sys/resource.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/state.h"
#include "gmock/gmock.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"
#include "tests/testing/subprocess.h"

namespace muonshard::checkpoint::testing {

// A dense decoder (AdamW embeddings/norms, Muon projections), small.
v1::ModelManifest SmallDenseManifest();
// An MoE decoder with per-expert tensors, a router and a fused 3-D expert
// stack per layer (split into matrix ranges under ep), small.
v1::ModelManifest SmallMoeManifest();

struct PlanAndRequest {
  v1::PlanRequest request;  // canonical
  v1::Plan plan;
};
absl::StatusOr<PlanAndRequest> MakePlan(const v1::ModelManifest& manifest, int world_size, int pp = 1, int ep = 1,
                                        v1::Policy policy = v1::SEED);

// Deterministic across processes: a float in [1, 2) from (name, kind, element).
float SyntheticValue(absl::string_view name, StateKind kind, int64_t element);
// The beta powers after `step` AdamW steps (beta^step, in float).
Scalars SyntheticScalars(int64_t step);

// One rank's state: the shards of ExpectedShards backed by one buffer.
struct RankBuffers {
  std::vector<float> storage;
  std::vector<StateShard> shards;
};
absl::StatusOr<std::unique_ptr<RankBuffers>> AllocateRank(const v1::Plan& plan, int rank);
void FillSynthetic(RankBuffers& rank);
// Every rank of `plan`, filled.
absl::StatusOr<std::vector<std::unique_ptr<RankBuffers>>> SyntheticState(const v1::Plan& plan);
std::vector<std::vector<StateShard>> ShardLists(const std::vector<std::unique_ptr<RankBuffers>>& ranks);

// OK when every element equals SyntheticValue; else the first mismatch.
absl::Status CheckSynthetic(const RankBuffers& rank);

// A fresh directory under the test temp dir, removed when destroyed.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(absl::string_view name) const;

 private:
  std::string path_;
};

// Byte surgery for corruption tests.
absl::Status FlipByte(const std::string& path, int64_t offset);
absl::Status TruncateFile(const std::string& path, int64_t size);
absl::StatusOr<std::string> ReadAll(const std::string& path);
absl::Status WriteAll(const std::string& path, absl::string_view data);

// While alive, every write of this process that would take a file past
// `bytes` fails with EFBIG (RLIMIT_FSIZE, SIGXFSZ ignored): a disk filling
// up mid-save, without a full disk, root or a special mount. The limit is
// process-wide: only for a test's own thread writing.
class ScopedFileSizeLimit {
 public:
  explicit ScopedFileSizeLimit(int64_t bytes);
  ~ScopedFileSizeLimit();
  ScopedFileSizeLimit(const ScopedFileSizeLimit&) = delete;
  ScopedFileSizeLimit& operator=(const ScopedFileSizeLimit&) = delete;

 private:
  rlimit saved_limit_{};
  struct sigaction saved_action_ {};
};

// gmock's Optional() for a StatusOr: EXPECT_THAT(f(), IsOkAndHolds(3)).
MATCHER_P(IsOkAndHolds, value_matcher, "") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

// $MUONSHARD_BIN_DIR/<name>.
using ::muonshard::testing::BinaryPath;

}  // namespace muonshard::checkpoint::testing

#endif  // MUONSHARD_TESTS_CHECKPOINT_CKPT_TEST_UTIL_H_
