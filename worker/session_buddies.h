#ifndef MUONSHARD_WORKER_SESSION_BUDDIES_H_
#define MUONSHARD_WORKER_SESSION_BUDDIES_H_

// SessionBuddies: a RankSession's NOTE [Buddy copies] (buddy_copies.h): the
// copies it holds, which outlive recoveries (what they hold is what a
// recovery restores from), refreshed from and restored into the group's
// optimizer over the group's buddy channel, with the holdings advertised in
// the generation's rendezvous store. Each change of what is held sets the
// endpoint's muonshard_worker_buddy_bytes.
//
// Thread-compatible: the session's thread drives it. Everything it is given
// must outlive it.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/buddy_copies.h"
#include "worker/metrics_endpoint.h"
#include "worker/rank_group.h"
#include "worker/rank_membership.h"
#include "worker/rank_session_options.h"

namespace muonshard::worker {

class SessionBuddies {
 public:
  // options.buddy_every: the refresh period; options.comm_timeout bounds the
  // wait for the holdings of every rank.
  SessionBuddies(const RankSessionOptions& options, const RankMembership& membership, RankGroup& group,
                 MetricsEndpoint& endpoint);
  SessionBuddies(const SessionBuddies&) = delete;
  SessionBuddies& operator=(const SessionBuddies&) = delete;

  // RankSession::RefreshBuddyCopies.
  absl::Status Refresh(int64_t done);
  // RankSession::RestoreFromBuddies.
  absl::StatusOr<std::optional<int64_t>> Restore(int64_t at_least);

 private:
  // Every rank's holdings, by rank: each advertises its own in the store.
  absl::StatusOr<std::vector<BuddyHoldings>> ExchangeHoldings();

  const RankSessionOptions& options_;
  const RankMembership& membership_;
  RankGroup& group_;
  MetricsEndpoint& endpoint_;
  BuddyCopies copies_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_SESSION_BUDDIES_H_
