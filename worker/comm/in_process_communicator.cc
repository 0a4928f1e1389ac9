#include "worker/comm/in_process_communicator.h"

#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "worker/comm/internal/host_float.h"

namespace muonshard::worker {
namespace internal {

using Payloads = std::vector<std::shared_ptr<const std::string>>;

// The rendezvous point of one in-process group. Collective number `seq` of
// every rank meets in round `seq`.
class InProcessHub {
 public:
  InProcessHub(int size, absl::Duration timeout) : size_(size), timeout_(timeout) {}

  // Deposits `rank`'s contribution to round `seq` and returns all ranks'
  // contributions once every rank has arrived.
  absl::StatusOr<Payloads> Exchange(int rank, int64_t seq, std::string signature, std::string payload);
  void Abort(absl::Status reason);
  absl::Status abort_status() const;

 private:
  struct Round {
    std::vector<std::string> signatures;
    Payloads payloads;
    int arrived = 0;
    int departed = 0;
  };

  Round& Arrive(int rank, int64_t seq, std::string signature, std::string payload) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Payloads> Depart(int64_t seq, Round& round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int size_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  // std::map: references to a Round stay valid while other rounds are added.
  std::map<int64_t, Round> rounds_ ABSL_GUARDED_BY(mu_);
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<Payloads> InProcessHub::Exchange(int rank, int64_t seq, std::string signature, std::string payload) {
  absl::MutexLock lock(&mu_);
  if (!abort_.ok()) return abort_;
  Round& round = Arrive(rank, seq, std::move(signature), std::move(payload));
  auto done = [this, &round]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return round.arrived == size_ || !abort_.ok(); };
  mu_.AwaitWithTimeout(absl::Condition(&done), timeout_);
  // A round every rank reached has completed, even if the group was aborted
  // after that (by a peer already in a later collective).
  if (round.arrived == size_) return Depart(seq, round);
  if (!abort_.ok()) return abort_;
  abort_ = absl::AbortedError(absl::StrCat("rank ", rank, " timed out in collective #", seq, "; group aborted"));
  return absl::DeadlineExceededError(absl::StrCat("rank ", rank, ": only ", round.arrived, " of ", size_,
                                                  " ranks reached collective #", seq, " within ",
                                                  absl::FormatDuration(timeout_)));
}

InProcessHub::Round& InProcessHub::Arrive(int rank, int64_t seq, std::string signature, std::string payload) {
  Round& round = rounds_[seq];
  if (round.payloads.empty()) {
    round.payloads.resize(size_);
    round.signatures.resize(size_);
  }
  round.signatures[rank] = std::move(signature);
  round.payloads[rank] = std::make_shared<const std::string>(std::move(payload));
  ++round.arrived;
  return round;
}

absl::StatusOr<Payloads> InProcessHub::Depart(int64_t seq, Round& round) {
  for (int r = 1; r < size_; ++r) {
    if (round.signatures[r] == round.signatures[0]) continue;
    // Every rank sees the same mismatch; the first one breaks the group.
    absl::Status mismatch =
        absl::InternalError(absl::StrCat("collective #", seq, " differs across ranks: rank 0 called ",
                                         round.signatures[0], ", rank ", r, " called ", round.signatures[r]));
    if (abort_.ok()) {
      abort_ = absl::AbortedError(absl::StrCat("group broken earlier: ", mismatch.message()));
    }
    return mismatch;
  }
  Payloads payloads = round.payloads;
  if (++round.departed == size_) rounds_.erase(seq);
  return payloads;
}

void InProcessHub::Abort(absl::Status reason) {
  absl::MutexLock lock(&mu_);
  if (abort_.ok()) abort_ = std::move(reason);
}

absl::Status InProcessHub::abort_status() const {
  absl::MutexLock lock(&mu_);
  return abort_;
}

}  // namespace internal

namespace {

std::string CopyBytes(const void* data, int64_t bytes) {
  if (bytes == 0) return std::string();
  return std::string(static_cast<const char*>(data), static_cast<size_t>(bytes));
}

// out = op over ranks (in rank order) of elements [offset, offset + count) of
// every payload, accumulated in fp32.
void ReduceInto(const internal::Payloads& payloads, int64_t offset, int64_t count, CommDType dtype, ReduceOp op,
                void* out) {
  if (count == 0) return;
  const int64_t esize = CommDTypeSize(dtype).value_or(0);
  std::vector<float> acc(count), widened(count);
  for (size_t r = 0; r < payloads.size(); ++r) {
    const char* src = payloads[r]->data() + offset * esize;
    internal::WidenToFloat(src, count, dtype, r == 0 ? acc.data() : widened.data());
    if (r > 0) internal::AddFloats(acc.data(), widened.data(), count);
  }
  if (op == ReduceOp::kAvg) {
    internal::DivideFloats(acc.data(), count, static_cast<float>(payloads.size()));
  }
  internal::NarrowFromFloat(acc.data(), count, dtype, out);
}

std::string ReduceSignature(absl::string_view name, int64_t count, CommDType dtype, ReduceOp op) {
  return absl::StrCat(name, "(count=", count, ", ", CommDTypeName(dtype), ", ", ReduceOpName(op));
}

}  // namespace

InProcessCommunicator::InProcessCommunicator(std::shared_ptr<internal::InProcessHub> hub, int rank, int size,
                                             const InProcessOptions& options)
    : hub_(std::move(hub)), rank_(rank), size_(size), options_(options) {}

InProcessCommunicator::~InProcessCommunicator() {
  // A rank that goes away breaks its group, as a closed connection would,
  // so peers still calling collectives fail fast instead of timing out.
  // Rounds that every rank reached still complete (see Exchange).
  hub_->Abort(absl::AbortedError(absl::StrCat("rank ", rank_, " left the group")));
}

absl::Status InProcessCommunicator::BeginCollective() {
  const int64_t call = calls_++;
  if (rank_ != options_.fail_rank || call != options_.fail_call) {
    return absl::OkStatus();
  }
  absl::Status fault = absl::AbortedError(absl::StrCat("injected fault: rank ", rank_, " collective #", call));
  hub_->Abort(fault);
  return fault;
}

absl::StatusOr<std::vector<std::shared_ptr<const std::string>>> InProcessCommunicator::Exchange(std::string signature,
                                                                                                std::string payload) {
  MUONSHARD_RETURN_IF_ERROR(BeginCollective());
  return hub_->Exchange(rank_, sequence_++, std::move(signature), std::move(payload));
}

absl::Status InProcessCommunicator::Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t bytes, internal::CheckBuffer(buf, count, dtype, "Reduce"));
  MUONSHARD_RETURN_IF_ERROR(internal::CheckReduceOp(op));
  MUONSHARD_RETURN_IF_ERROR(internal::CheckRoot(root, size_));
  MUONSHARD_ASSIGN_OR_RETURN(
      const internal::Payloads all,
      Exchange(absl::StrCat(ReduceSignature("Reduce", count, dtype, op), ", root=", root, ")"), CopyBytes(buf, bytes)));
  if (rank_ == root) ReduceInto(all, 0, count, dtype, op, buf);
  return absl::OkStatus();
}

absl::Status InProcessCommunicator::Broadcast(void* buf, int64_t count, CommDType dtype, int root) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t bytes, internal::CheckBuffer(buf, count, dtype, "Broadcast"));
  MUONSHARD_RETURN_IF_ERROR(internal::CheckRoot(root, size_));
  MUONSHARD_ASSIGN_OR_RETURN(
      const internal::Payloads all,
      Exchange(absl::StrCat("Broadcast(count=", count, ", ", CommDTypeName(dtype), ", root=", root, ")"),
               rank_ == root ? CopyBytes(buf, bytes) : std::string()));
  if (rank_ != root && bytes > 0) std::memcpy(buf, all[root]->data(), bytes);
  return absl::OkStatus();
}

absl::Status InProcessCommunicator::AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t bytes, internal::CheckBuffer(buf, count, dtype, "AllReduce"));
  MUONSHARD_RETURN_IF_ERROR(internal::CheckReduceOp(op));
  MUONSHARD_ASSIGN_OR_RETURN(
      const internal::Payloads all,
      Exchange(absl::StrCat(ReduceSignature("AllReduce", count, dtype, op), ")"), CopyBytes(buf, bytes)));
  ReduceInto(all, 0, count, dtype, op, buf);
  return absl::OkStatus();
}

absl::Status InProcessCommunicator::ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts,
                                                  CommDType dtype, ReduceOp op) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t total,
                             internal::CheckReduceScatterArgs(in, out, counts, dtype, op, rank_, size_));
  MUONSHARD_ASSIGN_OR_RETURN(const internal::Payloads all,
                             Exchange(absl::StrCat("ReduceScatter(counts=[", absl::StrJoin(counts, ","), "], ",
                                                   CommDTypeName(dtype), ", ", ReduceOpName(op), ")"),
                                      CopyBytes(in, total * *CommDTypeSize(dtype))));
  const std::vector<int64_t> offsets = internal::Offsets(counts);
  ReduceInto(all, offsets[rank_], counts[rank_], dtype, op, out);
  return absl::OkStatus();
}

absl::Status InProcessCommunicator::AllGather(const void* in, void* out, absl::Span<const int64_t> counts,
                                              CommDType dtype) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t total, internal::CheckCounts(counts, size_));
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t in_bytes,
                             internal::CheckBuffer(in, counts[rank_], dtype, "AllGather input"));
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t out_bytes, internal::CheckBuffer(out, total, dtype, "AllGather output"));
  // In place (`in` is this rank's segment of `out`) needs nothing more: the
  // input is copied before the output is written.
  const int64_t esize = CommDTypeSize(dtype).value_or(0);  // checked above
  MUONSHARD_RETURN_IF_ERROR(
      internal::CheckAllGatherBuffers(in, in_bytes, out, out_bytes, internal::Offsets(counts)[rank_] * esize).status());
  MUONSHARD_ASSIGN_OR_RETURN(
      const internal::Payloads all,
      Exchange(absl::StrCat("AllGather(counts=[", absl::StrJoin(counts, ","), "], ", CommDTypeName(dtype), ")"),
               CopyBytes(in, in_bytes)));
  char* dst = static_cast<char*>(out);
  for (const auto& payload : all) {
    if (payload->empty()) continue;
    std::memcpy(dst, payload->data(), payload->size());
    dst += payload->size();
  }
  return absl::OkStatus();
}

absl::Status InProcessCommunicator::Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t bytes,
                             internal::CheckRootedBuffers(in, out, count, dtype, root, rank_, size_, "Gather"));
  MUONSHARD_ASSIGN_OR_RETURN(
      const internal::Payloads all,
      Exchange(absl::StrCat("Gather(count=", count, ", ", CommDTypeName(dtype), ", root=", root, ")"),
               CopyBytes(in, bytes)));
  if (rank_ != root || bytes == 0) return absl::OkStatus();
  for (int r = 0; r < size_; ++r) std::memcpy(static_cast<char*>(out) + r * bytes, all[r]->data(), bytes);
  return absl::OkStatus();
}

absl::Status InProcessCommunicator::Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t bytes,
                             internal::CheckRootedBuffers(out, in, count, dtype, root, rank_, size_, "Scatter"));
  MUONSHARD_ASSIGN_OR_RETURN(
      const internal::Payloads all,
      Exchange(absl::StrCat("Scatter(count=", count, ", ", CommDTypeName(dtype), ", root=", root, ")"),
               rank_ == root ? CopyBytes(in, bytes * size_) : std::string()));
  if (bytes > 0) std::memcpy(out, all[root]->data() + rank_ * bytes, bytes);
  return absl::OkStatus();
}

absl::Status InProcessCommunicator::Barrier() {
  MUONSHARD_RETURN_IF_ERROR(group_.CheckNotInGroup("Barrier()"));
  return Exchange("Barrier()", std::string()).status();
}

absl::Status InProcessCommunicator::GroupStart() {
  group_.Start();
  return absl::OkStatus();
}

absl::Status InProcessCommunicator::GroupEnd() { return group_.End(); }

absl::Status InProcessCommunicator::Synchronize() {
  MUONSHARD_RETURN_IF_ERROR(group_.CheckNotInGroup("Synchronize()"));
  return hub_->abort_status();
}

void InProcessCommunicator::AbortGroup(absl::string_view reason) {
  hub_->Abort(absl::AbortedError(absl::StrCat("group aborted by rank ", rank_, ": ", reason)));
}

absl::StatusOr<std::vector<std::unique_ptr<InProcessCommunicator>>> CreateInProcessCommunicators(
    int size, const InProcessOptions& options) {
  if (size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("in-process group size ", size, " < 1"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("in-process timeout must be positive");
  }
  if (options.fail_rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("fault rank ", options.fail_rank, " outside a group of ", size));
  }
  auto hub = std::make_shared<internal::InProcessHub>(size, options.timeout);
  std::vector<std::unique_ptr<InProcessCommunicator>> comms;
  comms.reserve(size);
  for (int rank = 0; rank < size; ++rank) {
    comms.push_back(std::make_unique<InProcessCommunicator>(hub, rank, size, options));
  }
  return comms;
}

}  // namespace muonshard::worker
