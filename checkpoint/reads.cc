#include "checkpoint/reads.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "checkpoint/index.h"

namespace muonshard::checkpoint {
namespace {

absl::Status NotInCheckpoint(const ShardSpec& wanted, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", wanted.name, "\" ", StateKindName(wanted.kind), " [",
                                                 wanted.begin, ", ", wanted.end, "): ", why));
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
  if (wanted.end > t.numel()) {
    return NotInCheckpoint(wanted, absl::StrCat("the checkpoint's tensor has ", t.numel(), " elements"));
  }
  const auto& pieces = t.states(state).pieces();
  // Pieces tile [0, numel) in order (ValidateIndex): start at the last one
  // beginning at or before `wanted.begin`.
  auto first = std::upper_bound(pieces.begin(), pieces.end(), wanted.begin,
                                [](int64_t at, const v1::StatePiece& p) { return at < p.begin(); });
  std::vector<Read> reads;
  int64_t at = wanted.begin;
  for (auto it = first == pieces.begin() ? first : first - 1; it != pieces.end() && at < wanted.end; ++it) {
    if (it->begin() > at || it->end() <= at) {
      return absl::DataLossError(absl::StrCat("tensor \"", wanted.name, "\" ", StateKindName(wanted.kind), ": element ",
                                              at, " is in no piece of the checkpoint"));
    }
    const int64_t stop = std::min(it->end(), wanted.end);
    reads.push_back({it->file(), tensor, state, static_cast<int>(it - pieces.begin()), (at - it->begin()) * 4,
                     (stop - at) * 4, at - wanted.begin});
    at = stop;
  }
  if (at < wanted.end) {
    return absl::DataLossError(absl::StrCat("tensor \"", wanted.name, "\" ", StateKindName(wanted.kind), ": element ",
                                            at, " is in no piece of the checkpoint"));
  }
  return reads;
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
