#ifndef MUONSHARD_PLAN_TP_ROUNDS_H_
#define MUONSHARD_PLAN_TP_ROUNDS_H_

// NOTE [TP exchange rounds]
// With tp > 1 the Muon buckets whose matrices are TP-split exchange their
// shards over the TP group: the NS inputs go to the tp rank that
// orthogonalises each matrix (the plan's ns_tp_rank) and the results come
// back. Exchanged one bucket at a time, a bucket's step lasts as long as
// its largest matrix's Newton-Schulz, and the other tp ranks wait: the
// planner balances the NS ranks over a rank's whole step, not inside each
// bucket (a 405B model's bucket holds one MLP matrix or two). So the
// buckets are exchanged in rounds: consecutive buckets in the hand-off
// order (descending last tensor, then position), a round closing with the
// bucket at which every tp rank has a matrix of the round to orthogonalise
// (an all-gathered matrix counts for every rank), the last round with the
// last bucket. A round is one gather per NS rank there and one scatter per
// NS rank back, and the tp ranks orthogonalise its matrices side by side;
// the next round's buckets are reduced meanwhile on the pipelined schedule.
// Every rank of a TP group holds shards of the same tensors, so it computes
// the same rounds. One definition for the worker (TpMuonExchange), the
// memory estimate (TP staging) and the simulator (BuildPlanProgram).
//
// The planner chooses the NS ranks round by round (PlanNsRounds): the step's
// NS time on the TP group is the sum of its rounds' longest NS, not its
// busiest rank's total, so balancing the whole step (LPT over a rank's
// matrices) can leave every round as long as its two largest matrices on one
// rank (Llama-3.1-405B at 256 GPUs: 2 rounds of 532 ms where the busiest
// rank's total is 758 ms). The rounds are cut where the sum of their
// longest NS is least, and each is cut where the rule above closes it: a
// round not closed by a matrix every rank runs gives its last bucket's
// matrices a tp rank of their own and spreads the others (at least tp - 1)
// over the rest, so that rank is covered, and the round closed, only there.

#include <utility>
#include <vector>

#include "muonshard/v1/plan.pb.h"

namespace muonshard::planner {

// One Muon bucket with TP-exchanged shards, as TpExchangeRounds sees it.
struct TpExchangeBucket {
  // The largest tensor index of the bucket's entries (its hand-off place).
  int last_tensor = -1;
  // The NS tp rank of each exchanged shard; -1 for an all-gathered or sharded one
  // (every rank orthogonalises it). Repeats are allowed.
  std::vector<int> ns_ranks;
};

// The rounds, in order, each the positions in `buckets` it exchanges, in
// order (NOTE [TP exchange rounds]). `buckets` in ascending bucket position;
// tp >= 1. Every position is in exactly one round.
std::vector<std::vector<int>> TpExchangeRounds(const std::vector<TpExchangeBucket>& buckets, int tp);

// The rounds of rank `r` of `plan` (on the plan's buckets, as a worker
// without step pieces runs them), each the positions in plan.muon_buckets()
// of its buckets. Owned tensors naming a bucket not in the plan are left
// out (ValidatePlan reports them).
std::vector<std::vector<int>> TpExchangeRoundsOf(const v1::Plan& plan, const v1::RankPlan& r);

// A TP-exchanged bucket of one replica rank, as PlanNsRounds sees it.
struct NsRoundBucket {
  // The gathered matrices: an id of the caller's, and its NS FLOPs.
  std::vector<std::pair<int, double>> gathered;
  // The NS FLOPs every tp rank runs for the bucket's sharded (or
  // all-gathered) matrices; such a matrix closes its round (`covers_all`).
  double every_rank = 0;
  bool covers_all = false;
};

// One round as PlanNsRounds cuts it: its buckets' positions [begin, end),
// and the gathered matrices' ids in bins (at most tp, in no particular
// order), each bin for one tp rank to orthogonalise.
struct NsRound {
  int begin = 0;
  int end = 0;
  std::vector<std::vector<int>> bins;
};

// The rounds of `buckets` (in hand-off order, NOTE [TP exchange rounds]),
// cut and binned so that the sum of the rounds' longest bin (plus their
// every-rank FLOPs) is least among the cuts that TpExchangeRounds reproduces
// (rounds of at most `max_round_buckets` buckets, but the step's last round,
// which may reach back to the first bucket so that every cut ends). tp >= 2;
// every bucket has a gathered matrix or covers all.
std::vector<NsRound> PlanNsRounds(const std::vector<NsRoundBucket>& buckets, int tp, int max_round_buckets);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_TP_ROUNDS_H_
