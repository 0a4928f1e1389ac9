#ifndef MUONSHARD_COORDINATOR_RANK_VIEWS_H_
#define MUONSHARD_COORDINATOR_RANK_VIEWS_H_

// RankViews: serves GetPlanResponse{info, rank_view} for every rank of one
// plan version without extracting and encoding a RankView per rank.
//
// NOTE [Shared view pieces]: two ranks in the same set of communication
// groups have identical RankViews except for the `rank` field (same groups,
// tensors, buckets, stats). So the encoded view is cached once per group set
// ("signature") without `rank`, and a response is sent as pieces:
//   info field | rank_view tag + length | shared view body | rank field
// Protobuf parses fields in any order and merges concatenated encodings, so
// the pieces parse to exactly planner::ExtractRankView(plan, rank). A
// 10,240-rank pp=1 plan has one signature: one ~90 KiB body instead of
// 10,240 copies, and the first request per rank costs a few microseconds.
//
// Thread-safe; bodies are built lazily, once per signature.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "muonshard/v1/coordinator.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::coordinator {

// An encoded message in pieces; their concatenation is the message.
using SerializedPieces = std::vector<std::shared_ptr<const std::string>>;
std::string Concatenate(const SerializedPieces& pieces);

class RankViews {
 public:
  RankViews(std::shared_ptr<const v1::Plan> plan, const v1::PlanVersionInfo& info);

  // INVALID_ARGUMENT when the rank is outside the plan's world.
  absl::StatusOr<SerializedPieces> Response(int rank) const;

  const v1::Plan& plan() const { return *plan_; }

 private:
  std::shared_ptr<const std::string> Body(int signature) const;

  const std::shared_ptr<const v1::Plan> plan_;
  const std::shared_ptr<const std::string> info_field_;
  std::vector<int> signature_of_rank_;
  std::vector<int> representative_;  // one rank per signature
  mutable absl::Mutex mu_;
  mutable std::vector<std::shared_ptr<const std::string>> bodies_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_RANK_VIEWS_H_
