#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_OPTIMIZER_LAYOUT_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_OPTIMIZER_LAYOUT_H_

// OptimizerLayout: the plan view a ShardedOptimizer steps (the one it was
// given, with its Muon buckets in pieces: NOTE [Step pieces] in
// bucket_split.h), its ViewLayout index, the gradient dtype and the tensor
// parts the rank holds, with the lookups every part of the optimizer shares
// (parts by tensor, entries, owned shards, bucket keys). Pure: no buffers,
// no communicators.
//
// Immutable after Create; HeldTensor::spec points into the view, so a
// layout is never moved (Create hands out a unique_ptr).

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/muon_rounds.h"
#include "worker/optimizer/gradient_source.h"
#include "worker/optimizer/internal/view_layout.h"

namespace muonshard::worker::internal {

// A bucket of either kind. Its key numbers the buckets of a view: Muon
// bucket b is key b, AdamW bucket b is key muon_buckets + b (the step
// pipeline's events are numbered by key).
struct BucketKey {
  bool muon = false;
  int bucket = 0;

  bool operator==(const BucketKey& o) const { return muon == o.muon && bucket == o.bucket; }
};

// NOTE [Muon scatter rounds] (plan/muon_rounds.h): Muon buckets of one group
// whose gradients are reduce-scattered, and parameters all-gathered, as one
// buffer of `segment` elements per member, the bucket of group rank i in
// segment i (padded with zeros to the segment; a member without a bucket
// holds zeros).
struct ScatterRound {
  int group = 0;                 // position in index().groups
  int64_t segment = 0;           // the round's largest bucket
  std::vector<int> buckets;      // positions in view.muon_buckets, owner order
  std::vector<int> owner_ranks;  // their owners' group ranks (parallel)
};

// What a schedule issues for the reduce (or the sync) of a bucket at a place
// of its group's order (RoundCollectives).
constexpr int kBucketCollective = -1;                 // the bucket's own
constexpr int kNoCollective = planner::kNoRoundHere;  // none: its scatter round's comes later

class OptimizerLayout {
 public:
  // `view` with its Muon buckets cut into pieces of `muon_piece_bytes` (0:
  // as planned), validated and indexed.
  // Possible errors: INVALID_ARGUMENT (a negative piece size; an unknown
  // gradient dtype; a view that does not hold together, as BuildViewLayout).
  static absl::StatusOr<std::unique_ptr<OptimizerLayout>> Create(const v1::RankView& view, int64_t muon_piece_bytes);

  OptimizerLayout(const OptimizerLayout&) = delete;
  OptimizerLayout& operator=(const OptimizerLayout&) = delete;

  const v1::RankView& view() const { return view_; }
  const ViewLayout& index() const { return index_; }
  int rank() const { return index_.rank; }
  // The plan's gradient dtype (policy.grad_dtype, FP32 unless set).
  v1::DType grad_dtype() const { return grad_dtype_; }
  // The held parts, parallel to index().parts.
  const std::vector<HeldTensor>& held() const { return held_; }
  // The TP degree (1 without tensor parallelism).
  int tp_size() const;

  // The held part of plan tensor `tensor`: NOT_FOUND when the rank holds none.
  absl::StatusOr<const PartLayout*> HeldPart(int tensor) const;
  // Position of `part` in index().parts.
  int PartIndex(const PartLayout& part) const { return static_cast<int>(&part - index_.parts.data()); }
  const v1::PlannedTensor& Spec(const PartLayout& part) const;
  const v1::BucketEntry& Entry(const EntryRef& ref) const;
  // The bucket entry of owned Muon shard `shard` (position in index().owned).
  const v1::BucketEntry& OwnedEntry(int shard) const;
  // Whether owned shard `shard` is TP-split and exchanged (NOTE
  // [Tensor-parallel Muon]); a TP_OP_LOCAL shard is updated on its own.
  bool IsTp(int shard) const {
    const v1::TpMuonOp op = index_.owned[shard].tp.op;
    return op != v1::TP_OP_NONE && op != v1::TP_OP_LOCAL;
  }
  // The owned shards (positions in index().owned) of Muon bucket `bucket`,
  // in owned order.
  const std::vector<int>& OwnedIn(int bucket) const { return owned_in_muon_[bucket]; }

  int BucketCount() const { return view_.muon_buckets_size() + view_.adamw_buckets_size(); }
  int Key(const BucketKey& key) const { return key.muon ? key.bucket : view_.muon_buckets_size() + key.bucket; }
  BucketKey KeyBucket(int key) const;
  // Whether this rank updates the bucket (AdamW: always; Muon: its owner).
  bool Updates(const BucketKey& key) const;
  // The bucket's group (position in index().groups).
  int GroupOf(const BucketKey& key) const;
  // Whether the group has more than one rank (it then has a communicator).
  bool Shared(int group) const { return index_.groups[group].size > 1; }
  // The group's Muon buckets, then its AdamW buckets, by index: the
  // sequential schedule's collective order within a group.
  std::vector<BucketKey> GroupBuckets(int group) const;
  // The largest plan tensor index among the bucket's entries (-1: none).
  int LastTensor(const BucketKey& key) const;

  // The scatter rounds (empty unless the plan's policy.muon_reduce is
  // MUON_REDUCE_SCATTER_ROUNDS), and each Muon bucket's (-1: none).
  const std::vector<ScatterRound>& scatter_rounds() const { return scatter_rounds_; }
  int ScatterRoundOf(int muon_bucket) const { return round_of_[muon_bucket]; }
  // For each place of `order` (one group's buckets, in the order a schedule
  // runs their reduces or syncs, the same on every member): a scatter
  // round's position in scatter_rounds(), issued at its last bucket there;
  // kNoCollective for its other buckets; kBucketCollective for a bucket in
  // no round.
  std::vector<int> RoundCollectives(const std::vector<BucketKey>& order) const;

 private:
  OptimizerLayout(v1::RankView view, v1::DType grad_dtype);

  void IndexHeldAndOwned();
  void IndexScatterRounds();

  const v1::RankView view_;
  const v1::DType grad_dtype_;
  ViewLayout index_;
  std::vector<HeldTensor> held_;
  std::vector<std::vector<int>> owned_in_muon_;  // per muon bucket
  std::vector<ScatterRound> scatter_rounds_;
  std::vector<int> round_of_;  // per muon bucket, -1: none
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_OPTIMIZER_LAYOUT_H_
