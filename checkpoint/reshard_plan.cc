#include "checkpoint/reshard_plan.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/reads.h"
#include "checkpoint/state.h"
#include "common/status_macros.h"
#include "plan/planner.h"

namespace muonshard::checkpoint {

absl::StatusOr<v1::PlanRequest> RequestForTopology(const v1::PlanRequest& saved, const v1::Topology& topology,
                                                   std::optional<v1::Policy> policy) {
  v1::PlanRequest request = saved;
  *request.mutable_topology() = topology;
  if (policy) request.mutable_policy()->set_policy(*policy);
  request.mutable_policy()->clear_sticky_to();
  return planner::CanonicalizeRequest(request);
}

absl::StatusOr<ReadTraffic> ComputeReadTraffic(const v1::CheckpointIndex& index, const v1::Plan& to) {
  IndexLookup lookup(index);
  std::map<std::pair<int, int>, int64_t> pairs;
  ReadTraffic traffic;
  for (int rank = 0; rank < to.ranks_size(); ++rank) {
    MUONSHARD_ASSIGN_OR_RETURN(std::vector<ShardSpec> specs, ExpectedShards(to, rank));
    for (const ShardSpec& spec : specs) {
      MUONSHARD_ASSIGN_OR_RETURN(std::vector<Read> reads, ComputeReads(lookup, spec));
      for (const Read& r : reads) {
        pairs[{index.files(r.file).rank(), rank}] += r.bytes;
        traffic.payload_bytes += r.bytes;
        traffic.verified_bytes += VerifiedReadBytes(index, r);
      }
    }
  }
  for (const auto& [key, bytes] : pairs) traffic.pairs.push_back({key.first, key.second, bytes});
  return traffic;
}

absl::StatusOr<v1::ReshardSummary> SummarizeReshard(const v1::CheckpointIndex& index, const v1::Plan& from,
                                                    const v1::Plan& to) {
  if (from.content_hash() != index.plan_hash()) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan ", from.content_hash(), " is not the checkpoint's (", index.plan_hash(), ")"));
  }
  MUONSHARD_ASSIGN_OR_RETURN(ReadTraffic traffic, ComputeReadTraffic(index, to));
  planner::TransferSummary transfers;
  if (from.topology().tp() > 1 || to.topology().tp() > 1) {
    // ComputeTransfers compares element ranges of one space; TP shards have
    // their own, which the reads map through the whole tensor (NOTE [TP
    // reshard]): the matrix is what each new rank reads from each old one.
    transfers.transfers = traffic.pairs;
    for (const planner::RankTransfer& t : traffic.pairs) {
      transfers.state_bytes += t.bytes;
      if (t.from != t.to) transfers.moved_bytes += t.bytes;
    }
  } else {
    MUONSHARD_ASSIGN_OR_RETURN(transfers, planner::ComputeTransfers(from, to));
  }
  v1::ReshardSummary s;
  s.set_step(index.step());
  s.set_from_plan_hash(from.content_hash());
  s.set_to_plan_hash(to.content_hash());
  *s.mutable_from_topology() = from.topology();
  *s.mutable_to_topology() = to.topology();
  *s.mutable_to_policy() = to.policy();
  s.set_state_bytes(transfers.state_bytes);
  s.set_moved_bytes(transfers.moved_bytes);
  s.set_bytes_read(traffic.verified_bytes);
  for (const planner::RankTransfer& t : transfers.transfers) {
    v1::RankTransferBytes* out = s.add_transfers();
    out->set_from(t.from);
    out->set_to(t.to);
    out->set_bytes(t.bytes);
  }
  return s;
}

}  // namespace muonshard::checkpoint
