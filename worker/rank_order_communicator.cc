#include "worker/rank_order_communicator.h"

#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/comm/internal/host_float.h"

namespace muonshard::worker {
namespace {

absl::Status CheckOp(ReduceOp op) {
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg) {
    return absl::InvalidArgumentError(absl::StrCat("unknown reduce op ", static_cast<int>(op)));
  }
  return absl::OkStatus();
}

absl::Status CheckArgs(int64_t count, CommDType dtype, const void* buf) {
  MUONSHARD_RETURN_IF_ERROR(CommDTypeSize(dtype).status());
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("count ", count, " is negative"));
  if (count > 0 && buf == nullptr) return absl::InvalidArgumentError("null buffer with a non-zero count");
  return absl::OkStatus();
}

// out = op over ranks, in rank order, of `count` elements at element
// `offset` of each rank's `stride`-element block of `all`; accumulated in
// fp32 and rounded once to `dtype`, as InProcessCommunicator and the
// reference optimizer do.
void ReduceInRankOrder(const std::string& all, int ranks, int64_t stride, int64_t offset, int64_t count,
                       CommDType dtype, ReduceOp op, void* out) {
  if (count == 0) return;
  const int64_t esize = CommDTypeSize(dtype).value_or(0);
  std::vector<float> acc(count), widened(count);
  for (int r = 0; r < ranks; ++r) {
    const char* src = all.data() + (r * stride + offset) * esize;
    internal::WidenToFloat(src, count, dtype, r == 0 ? acc.data() : widened.data());
    if (r > 0) internal::AddFloats(acc.data(), widened.data(), count);
  }
  if (op == ReduceOp::kAvg) internal::DivideFloats(acc.data(), count, static_cast<float>(ranks));
  internal::NarrowFromFloat(acc.data(), count, dtype, out);
}

}  // namespace

absl::StatusOr<std::string> RankOrderCommunicator::GatherAll(const void* in, int64_t count, CommDType dtype) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t esize, CommDTypeSize(dtype));
  std::string all(static_cast<size_t>(count * esize * size()), '\0');
  const std::vector<int64_t> counts(size(), count);
  MUONSHARD_RETURN_IF_ERROR(inner_->AllGather(in, all.empty() ? nullptr : all.data(), counts, dtype));
  return all;
}

absl::Status RankOrderCommunicator::Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) {
  if (size() == 1) return inner_->Reduce(buf, count, dtype, op, root);
  MUONSHARD_RETURN_IF_ERROR(CheckOp(op));
  MUONSHARD_RETURN_IF_ERROR(CheckArgs(count, dtype, buf));
  if (root < 0 || root >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("root ", root, " is outside a group of ", size()));
  }
  MUONSHARD_ASSIGN_OR_RETURN(const std::string all, GatherAll(buf, count, dtype));
  if (rank() == root) ReduceInRankOrder(all, size(), count, 0, count, dtype, op, buf);
  return absl::OkStatus();
}

absl::Status RankOrderCommunicator::AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) {
  if (size() == 1) return inner_->AllReduce(buf, count, dtype, op);
  MUONSHARD_RETURN_IF_ERROR(CheckOp(op));
  MUONSHARD_RETURN_IF_ERROR(CheckArgs(count, dtype, buf));
  MUONSHARD_ASSIGN_OR_RETURN(const std::string all, GatherAll(buf, count, dtype));
  ReduceInRankOrder(all, size(), count, 0, count, dtype, op, buf);
  return absl::OkStatus();
}

absl::Status RankOrderCommunicator::ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts,
                                                  CommDType dtype, ReduceOp op) {
  if (size() == 1) return inner_->ReduceScatter(in, out, counts, dtype, op);
  if (static_cast<int>(counts.size()) != size()) {
    return absl::InvalidArgumentError(absl::StrCat(counts.size(), " counts for a group of ", size()));
  }
  for (int64_t c : counts) {
    if (c < 0) return absl::InvalidArgumentError(absl::StrCat("count ", c, " is negative"));
  }
  MUONSHARD_RETURN_IF_ERROR(CheckOp(op));
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  MUONSHARD_RETURN_IF_ERROR(CheckArgs(total, dtype, in));
  MUONSHARD_RETURN_IF_ERROR(CheckArgs(counts[rank()], dtype, out));
  const int64_t esize = CommDTypeSize(dtype).value_or(0);
  const char* in_begin = static_cast<const char*>(in);
  const char* out_begin = static_cast<const char*>(out);
  if (total > 0 && counts[rank()] > 0 && in_begin < out_begin + counts[rank()] * esize &&
      out_begin < in_begin + total * esize) {
    return absl::InvalidArgumentError("ReduceScatter: in and out overlap");
  }
  MUONSHARD_ASSIGN_OR_RETURN(const std::string all, GatherAll(in, total, dtype));
  const int64_t offset = std::accumulate(counts.begin(), counts.begin() + rank(), int64_t{0});
  ReduceInRankOrder(all, size(), total, offset, counts[rank()], dtype, op, out);
  return absl::OkStatus();
}

}  // namespace muonshard::worker
