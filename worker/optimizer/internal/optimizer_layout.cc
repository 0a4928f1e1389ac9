#include "worker/optimizer/internal/optimizer_layout.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/model.h"
#include "plan/muon_rounds.h"
#include "plan/tp_mesh.h"
#include "worker/optimizer/internal/bucket_split.h"

namespace muonshard::worker::internal {
namespace {

// The view a step runs: `view` with its Muon buckets in pieces (NOTE [Step
// pieces] in bucket_split.h).
absl::StatusOr<v1::RankView> ViewInPieces(const v1::RankView& view, int64_t muon_piece_bytes) {
  if (muon_piece_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step options: muon_piece_bytes is ", muon_piece_bytes));
  }
  if (muon_piece_bytes == 0) return view;
  // Errors name the plan's buckets, not the pieces.
  MUONSHARD_RETURN_IF_ERROR(BuildViewLayout(view).status());
  return SplitMuonBuckets(view, muon_piece_bytes);
}

}  // namespace

absl::StatusOr<std::unique_ptr<OptimizerLayout>> OptimizerLayout::Create(const v1::RankView& view,
                                                                         int64_t muon_piece_bytes) {
  if (view.policy().muon_reduce() == v1::MUON_REDUCE_SCATTER_ROUNDS) {
    // NOTE [Muon scatter rounds]: the rounds are the plan's (its byte counts
    // and memory terms are), so neither TP nor pieces cut other buckets.
    if (view.topology().tp() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank view: policy.muon_reduce MUON_REDUCE_SCATTER_ROUNDS needs tp = 1, got tp ", view.topology().tp()));
    }
    if (muon_piece_bytes > 0) {
      return absl::InvalidArgumentError(absl::StrCat("step options: muon_piece_bytes is ", muon_piece_bytes,
                                                     "; a plan with policy.muon_reduce MUON_REDUCE_SCATTER_ROUNDS "
                                                     "reduces its own buckets (0)"));
    }
  }
  MUONSHARD_ASSIGN_OR_RETURN(v1::RankView pieces, ViewInPieces(view, muon_piece_bytes));
  const v1::DType grad_dtype = planner::GradDType(pieces.policy());
  if (planner::DTypeSize(grad_dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("rank view: unknown policy.grad_dtype ", grad_dtype));
  }
  auto layout = absl::WrapUnique(new OptimizerLayout(std::move(pieces), grad_dtype));
  MUONSHARD_ASSIGN_OR_RETURN(layout->index_, BuildViewLayout(layout->view_));
  layout->IndexHeldAndOwned();
  layout->IndexScatterRounds();
  return layout;
}

OptimizerLayout::OptimizerLayout(v1::RankView view, v1::DType grad_dtype)
    : view_(std::move(view)), grad_dtype_(grad_dtype) {}

void OptimizerLayout::IndexHeldAndOwned() {
  for (const PartLayout& p : index_.parts) {
    HeldTensor h{p.tensor, &Spec(p), index_.groups[p.group].id, p.element_begin, p.element_end};
    if (planner::IsTpSplit(Spec(p))) {
      h.tp = view_.topology().tp();
      h.tp_rank = view_.rank().tp_rank();
      h.tp_mesh = planner::TpMeshOf(view_.topology());
    }
    held_.push_back(h);
  }
  owned_in_muon_.assign(view_.muon_buckets_size(), {});
  for (size_t i = 0; i < index_.owned.size(); ++i) {
    owned_in_muon_[index_.owned[i].bucket].push_back(static_cast<int>(i));
  }
}

// The rounds of the view's buckets, group by group (planner::MuonScatterRounds,
// as the plan's byte counts and memory terms have them).
void OptimizerLayout::IndexScatterRounds() {
  round_of_.assign(view_.muon_buckets_size(), -1);
  if (view_.policy().muon_reduce() != v1::MUON_REDUCE_SCATTER_ROUNDS) return;
  for (size_t g = 0; g < index_.groups.size(); ++g) {
    const GroupLayout& group = index_.groups[g];
    if (group.size < 2) continue;
    std::vector<planner::MuonRoundBucket> buckets;
    for (int b : group.muon_buckets) {
      const v1::MuonBucket& mb = view_.muon_buckets(b);
      buckets.push_back(
          {index_.muon_buckets[b].owner_group_rank, planner::LastTensorOf(mb.entries()), mb.dtype(), mb.numel()});
    }
    for (const planner::MuonRound& round : planner::MuonScatterRounds(buckets, group.size)) {
      if (!round.scatter) continue;
      ScatterRound r;
      r.group = static_cast<int>(g);
      for (int i : round.buckets) {
        const int b = group.muon_buckets[i];
        r.buckets.push_back(b);
        r.owner_ranks.push_back(buckets[i].owner);
        r.segment = std::max(r.segment, view_.muon_buckets(b).numel());
        round_of_[b] = static_cast<int>(scatter_rounds_.size());
      }
      scatter_rounds_.push_back(std::move(r));
    }
  }
}

std::vector<int> OptimizerLayout::RoundCollectives(const std::vector<BucketKey>& order) const {
  std::vector<int> round_at_place;
  round_at_place.reserve(order.size());
  for (const BucketKey& key : order) round_at_place.push_back(key.muon ? round_of_[key.bucket] : -1);
  return planner::RoundPlaces(round_at_place);
}

int OptimizerLayout::tp_size() const { return std::max(1, view_.topology().tp()); }

absl::StatusOr<const PartLayout*> OptimizerLayout::HeldPart(int tensor) const {
  auto it = index_.part_of_tensor.find(tensor);
  if (it == index_.part_of_tensor.end()) {
    return absl::NotFoundError(absl::StrCat("rank ", rank(), " holds no part of tensor ", tensor));
  }
  return &index_.parts[it->second];
}

const v1::PlannedTensor& OptimizerLayout::Spec(const PartLayout& part) const {
  return view_.tensors(part.view_tensor).tensor();
}

const v1::BucketEntry& OptimizerLayout::Entry(const EntryRef& ref) const {
  return ref.muon ? view_.muon_buckets(ref.bucket).entries(ref.entry)
                  : view_.adamw_buckets(ref.bucket).entries(ref.entry);
}

const v1::BucketEntry& OptimizerLayout::OwnedEntry(int shard) const {
  const MuonShardLayout& o = index_.owned[shard];
  return view_.muon_buckets(o.bucket).entries(o.entry);
}

BucketKey OptimizerLayout::KeyBucket(int key) const {
  const int muon = view_.muon_buckets_size();
  return key < muon ? BucketKey{true, key} : BucketKey{false, key - muon};
}

bool OptimizerLayout::Updates(const BucketKey& key) const { return !key.muon || index_.muon_buckets[key.bucket].owned; }

int OptimizerLayout::GroupOf(const BucketKey& key) const {
  return key.muon ? index_.muon_buckets[key.bucket].group : index_.adamw_buckets[key.bucket].group;
}

std::vector<BucketKey> OptimizerLayout::GroupBuckets(int group) const {
  std::vector<BucketKey> keys;
  for (int b : index_.groups[group].muon_buckets) keys.push_back({true, b});
  for (int b : index_.groups[group].adamw_buckets) keys.push_back({false, b});
  return keys;
}

int OptimizerLayout::LastTensor(const BucketKey& key) const {
  return key.muon ? planner::LastTensorOf(view_.muon_buckets(key.bucket).entries())
                  : planner::LastTensorOf(view_.adamw_buckets(key.bucket).entries());
}

}  // namespace muonshard::worker::internal
