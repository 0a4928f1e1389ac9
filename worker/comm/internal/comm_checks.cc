#include "worker/comm/internal/comm_checks.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::worker::internal {

absl::StatusOr<int64_t> CheckBuffer(const void* buf, int64_t count, CommDType dtype, absl::string_view what) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t esize, CommDTypeSize(dtype));
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": negative count ", count));
  }
  if (count > std::numeric_limits<int64_t>::max() / esize) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": count ", count, " overflows a byte size"));
  }
  if (buf == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null buffer with count ", count));
  }
  return count * esize;
}

absl::StatusOr<int64_t> CheckRootedBuffers(const void* single, const void* all, int64_t count, CommDType dtype,
                                           int root, int rank, int size, absl::string_view what) {
  MUONSHARD_RETURN_IF_ERROR(CheckRoot(root, size));
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t bytes, CheckBuffer(single, count, dtype, what));
  if (rank != root) return bytes;
  if (count > 0 && size > std::numeric_limits<int64_t>::max() / count) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", size, " segments of ", count, " overflow"));
  }
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t all_bytes,
                             CheckBuffer(all, count * size, dtype, absl::StrCat(what, " (root's buffer)")));
  MUONSHARD_RETURN_IF_ERROR(CheckNoOverlap(single, bytes, all, all_bytes));
  return bytes;
}

absl::Status CheckRoot(int root, int size) {
  if (root < 0 || root >= size) {
    return absl::InvalidArgumentError(absl::StrCat("root ", root, " outside [0, ", size, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckReduceOp(ReduceOp op) {
  if (op == ReduceOp::kSum || op == ReduceOp::kAvg) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("unknown ReduceOp ", static_cast<int>(op)));
}

absl::StatusOr<int64_t> CheckCounts(absl::Span<const int64_t> counts, int size) {
  if (counts.size() != static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(absl::StrCat("counts has ", counts.size(), " entries for ", size, " ranks"));
  }
  int64_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("counts[", i, "] is negative: ", counts[i]));
    }
    if (counts[i] > std::numeric_limits<int64_t>::max() - total) {
      return absl::InvalidArgumentError("sum of counts overflows int64");
    }
    total += counts[i];
  }
  return total;
}

absl::Status CheckNoOverlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return absl::OkStatus();
  const auto a_begin = reinterpret_cast<uintptr_t>(a);
  const auto b_begin = reinterpret_cast<uintptr_t>(b);
  if (a_begin < b_begin + b_bytes && b_begin < a_begin + a_bytes) {
    return absl::InvalidArgumentError("input and output buffers overlap");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CheckAllGatherBuffers(const void* in, int64_t in_bytes, const void* out, int64_t out_bytes,
                                           int64_t own_offset) {
  if (in_bytes > 0 && in == static_cast<const char*>(out) + own_offset) return true;
  MUONSHARD_RETURN_IF_ERROR(CheckNoOverlap(in, in_bytes, out, out_bytes));
  return false;
}

std::vector<int64_t> Offsets(absl::Span<const int64_t> counts) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) {
    offsets[i + 1] = offsets[i] + counts[i];
  }
  return offsets;
}

bool AllEqual(absl::Span<const int64_t> counts) {
  for (int64_t c : counts) {
    if (c != counts[0]) return false;
  }
  return true;
}

absl::Status GroupDepth::End() {
  if (depth_ == 0) {
    return absl::FailedPreconditionError("GroupEnd() without GroupStart()");
  }
  --depth_;
  return absl::OkStatus();
}

absl::Status GroupDepth::CheckNotInGroup(absl::string_view what) const {
  if (depth_ == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, " is not allowed between GroupStart() and GroupEnd()"));
}

absl::Status StickyError::Check() const {
  if (first_.ok()) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat("communicator is broken by an earlier error (re-rendezvous): ", first_.ToString()));
}

absl::Status StickyError::Record(absl::Status s) {
  const bool breaks = absl::IsAborted(s) || absl::IsDeadlineExceeded(s) || absl::IsInternal(s);
  if (breaks && first_.ok()) first_ = s;
  return s;
}

absl::StatusOr<int64_t> CheckReduceScatterArgs(const void* in, void* out, absl::Span<const int64_t> counts,
                                               CommDType dtype, ReduceOp op, int rank, int size) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t total, CheckCounts(counts, size));
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t in_bytes, CheckBuffer(in, total, dtype, "ReduceScatter input"));
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t out_bytes, CheckBuffer(out, counts[rank], dtype, "ReduceScatter output"));
  MUONSHARD_RETURN_IF_ERROR(CheckReduceOp(op));
  MUONSHARD_RETURN_IF_ERROR(CheckNoOverlap(in, in_bytes, out, out_bytes));
  return total;
}

}  // namespace muonshard::worker::internal
