#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_VIEW_LAYOUT_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_VIEW_LAYOUT_H_

// ViewLayout: one rank's plan view, validated and indexed for execution —
// which tensor parts the rank holds, which bucket entries cover each of them,
// the Muon shards it owns and its shard of every AdamW bucket. Pure: no
// values, no communicators. Everything refers to positions in the view's
// repeated fields (not to plan ids), so a layout stays valid when the view it
// was built from is copied or moved.

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kernels/blocked_newton_schulz.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/model.h"

namespace muonshard::worker::internal {

// A bucket entry: position of the bucket in view.muon_buckets (muon) or
// view.adamw_buckets, and of the entry in the bucket.
struct EntryRef {
  bool muon = false;
  int bucket = 0;
  int entry = 0;
};

struct PartLayout {
  int tensor = 0;       // plan index
  int view_tensor = 0;  // position in view.tensors
  int group = 0;        // position in ViewLayout::groups
  int64_t element_begin = 0;
  int64_t element_end = 0;
  std::vector<EntryRef> entries;  // tile [element_begin, element_end) in order
};

struct GroupLayout {
  int view_group = 0;  // position in view.groups
  int id = 0;
  int size = 0;
  int group_rank = 0;              // this rank's position in the group
  std::vector<int> muon_buckets;   // positions in view.muon_buckets, plan order
  std::vector<int> adamw_buckets;  // positions in view.adamw_buckets
};

// The tensor-parallel side of an owned Muon shard whose matrices are split
// over the rank's TP group (OwnedTensor.tp_op): Newton-Schulz must see each
// whole matrix.
struct TpMuonLayout {
  v1::TpMuonOp op = v1::TP_OP_NONE;
  int group = -1;    // the TP group: position in ViewLayout::groups
  int ns_rank = -1;  // GATHER_SCATTER: the TP group rank that runs NS
  int dim = -1;      // the split matrix dimension: 0 rows, 1 cols
  // TP_OP_SHARDED_NS: the NS side the shards split (planner::ShardedNs).
  bool sharded_rows = false;
  int64_t rows = 0;  // one whole matrix
  int64_t cols = 0;
  // Each TP rank's shard of one whole matrix, in TP group rank order.
  std::vector<planner::TpShardRuns> all_runs;
};

// A Muon tensor (or matrix range of a stack) this rank owns.
struct MuonShardLayout {
  int part = 0;    // position in ViewLayout::parts
  int bucket = 0;  // position in view.muon_buckets
  int entry = 0;
  kernels::MatrixBatchShape shape;  // the owned matrices (TP: this rank's shards of them)
  kernels::WeightLayout layout = kernels::WeightLayout::kOutIn;
  TpMuonLayout tp;
  // Per-block Newton-Schulz (PlannedTensor.ns_blocks): the blocks of the
  // matrix NS runs on -- the whole matrix's (owner-whole, TP gather) or,
  // with TP_OP_LOCAL, this rank's shard's, relative to the shard.
  bool blocked = false;
  kernels::NsBlockSpec blocks;
};

struct MuonBucketLayout {
  int group = 0;  // position in ViewLayout::groups
  int owner_group_rank = 0;
  bool owned = false;
};

// A contiguous piece of this rank's AdamW shard inside one entry (its real
// elements and the padding that follows them), so each piece can get its own
// tensor's weight-decay flag.
struct AdamwSegment {
  int part = 0;
  int entry = 0;
  int64_t shard_offset = 0;  // from the start of this rank's shard
  int64_t numel = 0;
};

struct AdamwBucketLayout {
  int group = 0;
  int64_t shard_begin = 0;  // this rank's [begin, end) of the buffer
  int64_t shard_end = 0;
  std::vector<int64_t> counts;  // per group rank, from shard_offsets
  std::vector<AdamwSegment> segments;
};

struct ViewLayout {
  int rank = 0;
  std::vector<GroupLayout> groups;               // ascending group id
  std::vector<PartLayout> parts;                 // ascending plan tensor index
  absl::flat_hash_map<int, int> part_of_tensor;  // plan index -> parts position
  std::vector<MuonBucketLayout> muon_buckets;    // parallel to view.muon_buckets
  std::vector<AdamwBucketLayout> adamw_buckets;  // parallel to view.adamw_buckets
  std::vector<MuonShardLayout> owned;            // in view.rank.owned order
  int64_t muon_state_numel = 0;
  int64_t adamw_shard_numel = 0;
};

// Validates `view` (INVALID_ARGUMENT naming the bucket, tensor or field) and
// indexes it. TP-split tensors are held at their shard shape
// (planner::HeldShape). Checks: the rank is in each of its groups; each tensor has a
// known dtype, a shape matching numel and at most one part in the rank's
// groups; bucket entries lie inside a held part of the bucket's group, in
// order, without overlap, inside the buffer, with the bucket's dtype and
// optimizer (Muon entries whole matrices); AdamW shard offsets cover the
// buffer in group order; the entries tile every held part exactly; every
// owned tensor names an entry of a bucket this rank owns and vice versa; the
// rank's muon_numel, adamw_shard_numel and optimizer_state_bytes match;
// a split Muon matrix has a TP op (never NS on a shard alone: that would be
// blockwise Muon) naming the rank's TENSOR_PARALLEL group; TP_OP_LOCAL only on
// an ns_local tensor whose blocks tile the rank's shard of the split (blocked)
// axis. Tensors with ns_blocks get their blocks (MuonShardLayout::blocks).
absl::StatusOr<ViewLayout> BuildViewLayout(const v1::RankView& view);

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_VIEW_LAYOUT_H_
