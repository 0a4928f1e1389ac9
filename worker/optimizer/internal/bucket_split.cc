#include "worker/optimizer/internal/bucket_split.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/model.h"

namespace muonshard::worker::internal {
namespace {

// Positions of the entries that start a piece; the first is 0.
std::vector<int> PieceStarts(const v1::MuonBucket& bucket, int64_t element_bytes, int64_t max_bytes) {
  std::vector<int> starts{0};
  int64_t start = 0;
  for (int k = 1; k < bucket.entries_size(); ++k) {
    const v1::BucketEntry& e = bucket.entries(k);
    if ((e.offset() + e.numel() - start) * element_bytes <= max_bytes) continue;
    starts.push_back(k);
    start = e.offset();
  }
  return starts;
}

absl::Status CheckEntries(const v1::MuonBucket& bucket) {
  int64_t at = 0;
  for (const v1::BucketEntry& e : bucket.entries()) {
    if (e.offset() < at || e.numel() < 0 || e.offset() + e.numel() > bucket.numel()) {
      return absl::InvalidArgumentError(absl::StrCat("muon bucket ", bucket.id(), ": entry of tensor ", e.tensor(),
                                                     " at offset ", e.offset(), " is out of order or outside the ",
                                                     bucket.numel(), "-element buffer"));
    }
    at = e.offset() + e.numel();
  }
  return absl::OkStatus();
}

// Entries [first, last) of `bucket` as a bucket of its own from `begin` to
// `end` of the buffer.
v1::MuonBucket Piece(const v1::MuonBucket& bucket, int id, int first, int last, int64_t begin, int64_t end) {
  v1::MuonBucket piece;
  piece.set_id(id);
  piece.set_group(bucket.group());
  piece.set_owner(bucket.owner());
  piece.set_dtype(bucket.dtype());
  piece.set_numel(end - begin);
  for (int k = first; k < last; ++k) {
    v1::BucketEntry* e = piece.add_entries();
    *e = bucket.entries(k);
    e->set_offset(e->offset() - begin);
  }
  return piece;
}

// Whether `e` holds the matrices `o` owns.
bool Holds(const v1::BucketEntry& e, const v1::OwnedTensor& o) {
  const int64_t matrices = o.matrix_end() - o.matrix_begin();
  if (e.tensor() != o.tensor() || e.numel() != o.numel() || matrices <= 0) return false;
  return e.element_begin() == o.matrix_begin() * (o.numel() / matrices);
}

// Appends `bucket` to out's Muon buckets, as it is when it fits, else in
// pieces numbered from *next_id.
void AppendPieces(const v1::MuonBucket& bucket, int64_t element_bytes, int64_t max_bytes, int* next_id,
                  v1::RankView* out) {
  const std::vector<int> starts = PieceStarts(bucket, element_bytes, max_bytes);
  if (starts.size() == 1) {
    *out->add_muon_buckets() = bucket;
    return;
  }
  for (size_t p = 0; p < starts.size(); ++p) {
    const int last = p + 1 < starts.size() ? starts[p + 1] : bucket.entries_size();
    const int64_t begin = p == 0 ? 0 : bucket.entries(starts[p]).offset();
    const int64_t end = last < bucket.entries_size() ? bucket.entries(last).offset() : bucket.numel();
    *out->add_muon_buckets() = Piece(bucket, (*next_id)++, starts[p], last, begin, end);
  }
}

// Points an owned tensor of a cut bucket at the piece holding its entry,
// one of buckets [first, end).
absl::Status RenameOwned(const google::protobuf::RepeatedPtrField<v1::MuonBucket>& buckets, int first, int end,
                         v1::OwnedTensor* o) {
  for (int k = first; k < end; ++k) {
    for (const v1::BucketEntry& e : buckets[k].entries()) {
      if (!Holds(e, *o)) continue;
      o->set_bucket(buckets[k].id());
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("owned tensor ", o->tensor(), " \"", o->name(), "\": matrices [",
                                                 o->matrix_begin(), ", ", o->matrix_end(),
                                                 ") match no entry of muon bucket ", o->bucket()));
}

}  // namespace

absl::StatusOr<v1::RankView> SplitMuonBuckets(const v1::RankView& view, int64_t max_bytes) {
  if (max_bytes <= 0) return view;
  const int64_t element_bytes = std::max<int64_t>(1, planner::DTypeSize(planner::GradDType(view.policy())));
  int next_id = 0;
  for (const v1::MuonBucket& b : view.muon_buckets()) next_id = std::max(next_id, b.id() + 1);
  v1::RankView out = view;
  out.clear_muon_buckets();
  // Per bucket id: what replaced it, positions [first, end) in out.
  absl::flat_hash_map<int, std::pair<int, int>> pieces_of;
  for (const v1::MuonBucket& b : view.muon_buckets()) {
    MUONSHARD_RETURN_IF_ERROR(CheckEntries(b));
    const int first = out.muon_buckets_size();
    AppendPieces(b, element_bytes, max_bytes, &next_id, &out);
    pieces_of[b.id()] = {first, out.muon_buckets_size()};
  }
  for (v1::OwnedTensor& o : *out.mutable_rank()->mutable_owned()) {
    auto it = pieces_of.find(o.bucket());
    if (it == pieces_of.end()) continue;  // BuildViewLayout names it
    MUONSHARD_RETURN_IF_ERROR(RenameOwned(out.muon_buckets(), it->second.first, it->second.second, &o));
  }
  return out;
}

}  // namespace muonshard::worker::internal
