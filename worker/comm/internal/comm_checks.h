#ifndef MUONSHARD_WORKER_COMM_INTERNAL_COMM_CHECKS_H_
#define MUONSHARD_WORKER_COMM_INTERNAL_COMM_CHECKS_H_

// Argument checks and small state helpers shared by every Communicator
// implementation, so all backends reject the same calls with the same codes
// (see "Errors" in communicator.h). Not thread-safe; each communicator owns
// its helpers and has one caller thread.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/comm/communicator.h"

namespace muonshard::worker::internal {

// Returns the byte size of `count` elements of `dtype`. INVALID_ARGUMENT for
// a negative count, an unknown dtype, overflow, or a null `buf` with a
// non-zero count. `what` names the buffer in messages.
absl::StatusOr<int64_t> CheckBuffer(const void* buf, int64_t count, CommDType dtype, absl::string_view what);

// INVALID_ARGUMENT unless 0 <= root < size.
absl::Status CheckRoot(int root, int size);

// Gather and Scatter: `single` holds `count` elements on every rank and
// `all` size * count on the root (ignored elsewhere). Checks both buffers,
// the root and that they do not overlap; returns the bytes of one segment.
// `what` names the op in messages.
absl::StatusOr<int64_t> CheckRootedBuffers(const void* single, const void* all, int64_t count, CommDType dtype,
                                           int root, int rank, int size, absl::string_view what);

// INVALID_ARGUMENT for a value outside the enum.
absl::Status CheckReduceOp(ReduceOp op);

// Returns sum(counts). INVALID_ARGUMENT unless counts.size() == size, every
// count >= 0 and the sum does not overflow.
absl::StatusOr<int64_t> CheckCounts(absl::Span<const int64_t> counts, int size);

// ReduceScatter's arguments on group rank `rank` of `size`: the counts, both
// buffers (`in` of sum(counts), `out` of counts[rank]), the op, no overlap.
// Returns sum(counts).
absl::StatusOr<int64_t> CheckReduceScatterArgs(const void* in, void* out, absl::Span<const int64_t> counts,
                                               CommDType dtype, ReduceOp op, int rank, int size);

// INVALID_ARGUMENT when [a, a + a_bytes) and [b, b + b_bytes) overlap.
absl::Status CheckNoOverlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes);

// AllGather's buffers (`in` of in_bytes, `out` of out_bytes; this rank's
// segment of `out` starts at byte own_offset): OK when they do not overlap,
// or in place, when `in` is exactly that segment. Returns whether it is in
// place; INVALID_ARGUMENT for any other overlap.
absl::StatusOr<bool> CheckAllGatherBuffers(const void* in, int64_t in_bytes, const void* out, int64_t out_bytes,
                                           int64_t own_offset);

// offsets[i] = counts[0] + ... + counts[i - 1]; size counts.size() + 1.
std::vector<int64_t> Offsets(absl::Span<const int64_t> counts);

// True when every count equals counts[0] (or counts is empty).
bool AllEqual(absl::Span<const int64_t> counts);

// Tracks GroupStart/GroupEnd nesting.
class GroupDepth {
 public:
  void Start() { ++depth_; }
  // FAILED_PRECONDITION without a matching Start().
  absl::Status End();
  bool active() const { return depth_ > 0; }
  // FAILED_PRECONDITION inside a group; `what` names the call.
  absl::Status CheckNotInGroup(absl::string_view what) const;

 private:
  int depth_ = 0;
};

// The first transport failure breaks a communicator for good (NCCL and Gloo
// cannot resume a half-done collective), so every later call fails fast.
class StickyError {
 public:
  // OK while healthy; ABORTED naming the original failure once broken.
  absl::Status Check() const;
  // Records `s` if it is a failure that breaks the communicator (ABORTED,
  // DEADLINE_EXCEEDED, INTERNAL) and nothing was recorded yet. Returns `s`.
  absl::Status Record(absl::Status s);
  bool broken() const { return !first_.ok(); }

 private:
  absl::Status first_;
};

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_COMM_INTERNAL_COMM_CHECKS_H_
