#include "worker/session_buddies.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::worker {

SessionBuddies::SessionBuddies(const RankSessionOptions& options, const RankMembership& membership, RankGroup& group,
                               MetricsEndpoint& endpoint)
    : options_(options), membership_(membership), group_(group), endpoint_(endpoint) {}

absl::Status SessionBuddies::Refresh(int64_t done) {
  ByteChannel* channel = group_.buddy_channel();
  if (channel == nullptr || done % options_.buddy_every != 0) return absl::OkStatus();
  MUONSHARD_RETURN_IF_ERROR(group_.CheckFormed());
  ShardedOptimizer& optimizer = group_.optimizer();
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::StateShard> shards, optimizer.StateShards());
  absl::Status s = copies_.Refresh(*channel, shards, optimizer.scalars(), done, membership_.view().content_hash());
  endpoint_.metrics().SetBuddyBytes(copies_.held_bytes());
  return Annotate(s, absl::StrCat("refreshing the buddy copies of step ", done));
}

absl::StatusOr<std::optional<int64_t>> SessionBuddies::Restore(int64_t at_least) {
  ByteChannel* channel = group_.buddy_channel();
  if (channel == nullptr) return std::nullopt;
  MUONSHARD_RETURN_IF_ERROR(group_.CheckFormed());
  MUONSHARD_ASSIGN_OR_RETURN(const std::vector<BuddyHoldings> holdings, ExchangeHoldings());
  const std::string& plan_hash = membership_.view().content_hash();
  std::optional<BuddyRestorePlan> plan = PlanBuddyRestore(holdings, plan_hash);
  if (!plan.has_value() || plan->step < at_least) return std::nullopt;
  ShardedOptimizer& optimizer = group_.optimizer();
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::StateShard> shards, optimizer.StateShards());
  MUONSHARD_ASSIGN_OR_RETURN(checkpoint::Scalars scalars, copies_.Restore(*channel, *plan, shards, plan_hash));
  MUONSHARD_RETURN_IF_ERROR(optimizer.RestoreFromState(scalars));
  endpoint_.metrics().SetBuddyBytes(copies_.held_bytes());
  const int sent =
      static_cast<int>(std::count_if(plan->source.begin(), plan->source.end(), [](int s) { return s >= 0; }));
  membership_.Log() << "restored step " << plan->step << " from buddy copies (" << sent
                    << " rank(s) from their buddy, no disk read)\n";
  return plan->step;
}

absl::StatusOr<std::vector<BuddyHoldings>> SessionBuddies::ExchangeHoldings() {
  client::GrpcRendezvousStore& store = group_.store();
  MUONSHARD_RETURN_IF_ERROR(store.Set(absl::StrCat("buddy/", membership_.rank()), EncodeHoldings(copies_.holdings())));
  std::vector<std::string> keys;
  for (int r = 0; r < membership_.world_size(); ++r) keys.push_back(absl::StrCat("buddy/", r));
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<std::string> adverts, store.WaitAll(keys, options_.comm_timeout));
  std::vector<BuddyHoldings> holdings;
  for (const std::string& advert : adverts) {
    MUONSHARD_ASSIGN_OR_RETURN(BuddyHoldings h, DecodeHoldings(advert));
    holdings.push_back(std::move(h));
  }
  return holdings;
}

}  // namespace muonshard::worker
