#include "checkpoint/reads.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/index.h"
#include "common/status_macros.h"
#include "plan/model.h"

namespace muonshard::checkpoint {
namespace {

absl::Status NotInCheckpoint(const ShardSpec& wanted, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", wanted.name, "\" ", StateKindName(wanted.kind), " [",
                                                 wanted.begin, ", ", wanted.end, "): ", why));
}

absl::Status NoPiece(const ShardSpec& wanted, int tp_rank, int64_t at) {
  return absl::DataLossError(absl::StrCat("tensor \"", wanted.name, "\" ", StateKindName(wanted.kind), ": element ", at,
                                          tp_rank > 0 ? absl::StrCat(" of tp rank ", tp_rank) : "",
                                          " is in no piece of the checkpoint"));
}

// Reads of one (tensor, state) of the checkpoint: Add() appends those of a
// contiguous range of one saved shard (tp rank 0 for a tensor saved whole).
class ReadCollector {
 public:
  ReadCollector(const ShardSpec& wanted, const v1::CheckpointTensor& t, int tensor, int state)
      : wanted_(wanted), tensor_(tensor), state_(state), pieces_(t.states(state).pieces()) {}

  absl::Status Add(int tp_rank, int64_t begin, int64_t end, int64_t dest) {
    // Pieces are in (tp rank, begin) order (ValidateIndex): start at the last
    // one beginning at or before `begin` in that shard.
    auto first = std::upper_bound(pieces_.begin(), pieces_.end(), std::make_pair(tp_rank, begin),
                                  [](const std::pair<int, int64_t>& at, const v1::StatePiece& p) {
                                    return at < std::make_pair(p.tp_rank(), p.begin());
                                  });
    int64_t at = begin;
    for (auto it = first == pieces_.begin() ? first : first - 1; it != pieces_.end() && at < end; ++it) {
      if (it->tp_rank() != tp_rank || it->begin() > at || it->end() <= at) return NoPiece(wanted_, tp_rank, at);
      const int64_t stop = std::min(it->end(), end);
      reads_.push_back({it->file(), tensor_, state_, static_cast<int>(it - pieces_.begin()), (at - it->begin()) * 4,
                        (stop - at) * 4, dest + (at - begin)});
      at = stop;
    }
    if (at < end) return NoPiece(wanted_, tp_rank, at);
    return absl::OkStatus();
  }

  std::vector<Read> Take() { return std::move(reads_); }

 private:
  const ShardSpec& wanted_;
  const int tensor_;
  const int state_;
  const google::protobuf::RepeatedPtrField<v1::StatePiece>& pieces_;
  std::vector<Read> reads_;
};

// The whole tensor's contiguous ranges [whole, whole + n) that hold
// wanted's elements, in order: fn(whole, n, dest) with dest the element
// offset in the wanted shard.
template <typename Fn>
absl::Status ForEachWholeRange(const ShardSpec& wanted, Fn fn) {
  if (wanted.tp <= 1) return fn(wanted.begin, wanted.numel(), 0);
  const planner::TpShardRuns runs = planner::TpShardRunsOf(wanted.shape, wanted.tp_dim, wanted.tp, wanted.tp_rank);
  for (int64_t i = wanted.begin; i < wanted.end;) {
    const int64_t n = std::min(wanted.end, (i / runs.run + 1) * runs.run) - i;
    MUONSHARD_RETURN_IF_ERROR(fn(runs.WholeIndex(i), n, i - wanted.begin));
    i += n;
  }
  return absl::OkStatus();
}

// NOTE [TP reshard]: a shard saved under one tp and wanted under another
// (or whole) meet in the whole tensor's element space. Each contiguous
// range of the wanted shard's place in the whole tensor is cut where the
// saved shards' blocks end, and each cut is a contiguous range of one saved
// shard. Under the same tp and split the shards are the same and are read
// directly.
absl::Status CollectReads(const ShardSpec& wanted, const v1::CheckpointTensor& t, ReadCollector& reads) {
  const int saved_tp = std::max(1, t.tp());
  if (saved_tp == std::max(1, wanted.tp) && (saved_tp == 1 || t.tp_dim() == wanted.tp_dim)) {
    return reads.Add(saved_tp > 1 ? wanted.tp_rank : 0, wanted.begin, wanted.end, 0);
  }
  if (saved_tp == 1) {
    return ForEachWholeRange(
        wanted, [&](int64_t whole, int64_t n, int64_t dest) { return reads.Add(0, whole, whole + n, dest); });
  }
  const std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
  const planner::TpShardRuns saved = planner::TpShardRunsOf(shape, t.tp_dim(), saved_tp, 0);
  return ForEachWholeRange(wanted, [&](int64_t whole, int64_t n, int64_t dest) -> absl::Status {
    for (int64_t g = whole; g < whole + n;) {
      const int64_t within = g % saved.pitch;
      const int64_t m = std::min(whole + n - g, saved.run - within % saved.run);
      const int64_t local = g / saved.pitch * saved.run + within % saved.run;
      MUONSHARD_RETURN_IF_ERROR(reads.Add(static_cast<int>(within / saved.run), local, local + m, dest + (g - whole)));
      g += m;
    }
    return absl::OkStatus();
  });
}

}  // namespace

IndexLookup::IndexLookup(const v1::CheckpointIndex& index) : index_(index) {
  tensors_.reserve(index.tensors_size());
  for (int i = 0; i < index.tensors_size(); ++i) tensors_[index.tensors(i).name()] = i;
}

int IndexLookup::FindTensor(absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? -1 : it->second;
}

int IndexLookup::FindState(int tensor, StateKind kind) const {
  const v1::CheckpointTensor& t = index_.tensors(tensor);
  for (int s = 0; s < t.states_size(); ++s) {
    if (t.states(s).kind() == ToProto(kind)) return s;
  }
  return -1;
}

absl::StatusOr<std::vector<Read>> ComputeReads(const IndexLookup& lookup, const ShardSpec& wanted) {
  if (wanted.begin < 0 || wanted.end < wanted.begin) return NotInCheckpoint(wanted, "not a valid range");
  const int tensor = lookup.FindTensor(wanted.name);
  if (tensor < 0) return NotInCheckpoint(wanted, "not in the checkpoint (a different model?)");
  const v1::CheckpointTensor& t = lookup.index().tensors(tensor);
  const int state = lookup.FindState(tensor, wanted.kind);
  if (state < 0) {
    return NotInCheckpoint(
        wanted, absl::StrCat("the checkpoint keeps no such state (saved for ", v1::Optimizer_Name(t.optimizer()), ")"));
  }
  if (wanted.tensor_numel > 0 && wanted.tensor_numel != t.numel()) {
    return NotInCheckpoint(
        wanted, absl::StrCat("the checkpoint's tensor has ", t.numel(), " elements, the plan's ", wanted.tensor_numel));
  }
  if (wanted.tp > 1 && !std::equal(wanted.shape.begin(), wanted.shape.end(), t.shape().begin(), t.shape().end())) {
    return NotInCheckpoint(wanted, "the checkpoint's tensor has another shape");
  }
  const int64_t held = t.numel() / std::max(1, wanted.tp);
  if (wanted.end > held) {
    return NotInCheckpoint(
        wanted, absl::StrCat("the checkpoint's tensor has ", held, " elements", wanted.tp > 1 ? " per tp shard" : ""));
  }
  ReadCollector reads(wanted, t, tensor, state);
  MUONSHARD_RETURN_IF_ERROR(CollectReads(wanted, t, reads));
  return reads.Take();
}

absl::StatusOr<std::vector<std::vector<Read>>> ComputeReads(const v1::CheckpointIndex& index,
                                                            absl::Span<const ShardSpec> wanted) {
  IndexLookup lookup(index);
  std::vector<std::vector<Read>> out;
  out.reserve(wanted.size());
  for (const ShardSpec& w : wanted) {
    auto reads = ComputeReads(lookup, w);
    if (!reads.ok()) return reads.status();
    out.push_back(*std::move(reads));
  }
  return out;
}

int64_t FileOffset(const v1::CheckpointIndex& index, const Read& read) {
  return index.tensors(read.tensor).states(read.state).pieces(read.piece).data_offset() + read.piece_offset;
}

int64_t VerifiedReadBytes(const v1::CheckpointIndex& index, const Read& read) {
  const v1::StatePiece& p = index.tensors(read.tensor).states(read.state).pieces(read.piece);
  const int64_t chunk = index.checksum_chunk_bytes();
  const int64_t begin = read.piece_offset / chunk * chunk;
  const int64_t end = std::min(PieceBytes(p), (read.piece_offset + read.bytes + chunk - 1) / chunk * chunk);
  return read.bytes == 0 ? 0 : end - begin;
}

}  // namespace muonshard::checkpoint
