#include "worker/comm/nccl_communicator.h"

#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/retry.h"
#include "common/status_macros.h"
#include "worker/comm/nccl_status.h"

namespace muonshard::worker {
namespace {

constexpr char kUniqueIdKey[] = "nccl_unique_id";

ncclDataType_t ToNccl(CommDType dtype) {
  switch (dtype) {
    case CommDType::kBFloat16:
      return ncclBfloat16;
    case CommDType::kFloat16:
      return ncclFloat16;
    case CommDType::kFloat32:
    default:  // callers checked the dtype
      return ncclFloat32;
  }
}

ncclRedOp_t ToNccl(ReduceOp op) { return op == ReduceOp::kAvg ? ncclAvg : ncclSum; }

absl::Status CheckOptions(const NcclOptions& options, const RendezvousStore* store) {
  if (store == nullptr) return absl::InvalidArgumentError("null store");
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("nccl rank ", options.rank, " of size ", options.size));
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("nccl device ", options.device));
  }
  if (options.key_prefix.empty()) {
    return absl::InvalidArgumentError("nccl key_prefix must name the group");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("nccl timeout must be positive");
  }
  return absl::OkStatus();
}

// Rank 0 creates the id and publishes it; the others wait for it.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(const NcclOptions& options, RendezvousStore* store) {
  PrefixedRendezvousStore prefixed(store, options.key_prefix);
  if (options.rank == 0) {
    ncclUniqueId id;
    MUONSHARD_RETURN_IF_ERROR(NcclToStatus(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId"));
    MUONSHARD_RETURN_IF_ERROR(Annotate(prefixed.Set(kUniqueIdKey, EncodeNcclUniqueId(id)), "publishing id"));
    return id;
  }
  absl::StatusOr<std::string> text = prefixed.Wait(kUniqueIdKey, options.timeout);
  if (!text.ok()) {
    return Annotate(text.status(), absl::StrCat("waiting for the NCCL id under \"", options.key_prefix, "\""));
  }
  return DecodeNcclUniqueId(*text);
}

}  // namespace

std::string EncodeNcclUniqueId(const ncclUniqueId& id) {
  return absl::BytesToHexString(absl::string_view(id.internal, sizeof(id.internal)));
}

absl::StatusOr<ncclUniqueId> DecodeNcclUniqueId(absl::string_view text) {
  ncclUniqueId id;
  if (text.size() != 2 * sizeof(id.internal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL id encoding has ", text.size(), " characters, want ", 2 * sizeof(id.internal)));
  }
  for (char c : text) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError("NCCL id encoding is not hex");
    }
  }
  const std::string bytes = absl::HexStringToBytes(text);
  std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  return id;
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateNcclCommunicator(const NcclOptions& options,
                                                                         RendezvousStore* store) {
  MUONSHARD_RETURN_IF_ERROR(CheckOptions(options, store));
  MUONSHARD_RETURN_IF_ERROR(
      CudaToStatus(cudaSetDevice(options.device), absl::StrCat("cudaSetDevice(", options.device, ")")));
  MUONSHARD_ASSIGN_OR_RETURN(const ncclUniqueId id, ExchangeUniqueId(options, store));
  std::unique_ptr<CudaStream> stream;
  if (options.stream != nullptr) {
    stream = CudaStream::Borrow(options.stream);
  } else {
    MUONSHARD_ASSIGN_OR_RETURN(stream, CudaStream::Create());
  }
  MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> scratch, DeviceBuffer::Allocate(sizeof(float)));
  MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<NcclComm> comm,
                             NcclComm::Create(options.size, id, options.rank, options.timeout));
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(options, std::move(stream), std::move(scratch), std::move(comm)));
}

NcclCommunicator::NcclCommunicator(const NcclOptions& options, std::unique_ptr<CudaStream> stream,
                                   std::unique_ptr<DeviceBuffer> barrier_scratch, std::unique_ptr<NcclComm> comm)
    : rank_(options.rank),
      size_(options.size),
      device_(options.device),
      timeout_(options.timeout),
      stream_(std::move(stream)),
      barrier_scratch_(std::move(barrier_scratch)),
      comm_(std::move(comm)) {}

NcclCommunicator::~NcclCommunicator() {
  // The members' destructors call CUDA/NCCL on the current device.
  (void)cudaSetDevice(device_);
}

absl::Status NcclCommunicator::Enter() {
  MUONSHARD_RETURN_IF_ERROR(CheckAbort());
  MUONSHARD_RETURN_IF_ERROR(sticky_.Check());
  return CudaToStatus(cudaSetDevice(device_), "cudaSetDevice");
}

void NcclCommunicator::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&abort_mu_);
  if (abort_reason_.ok()) {
    abort_reason_ =
        absl::AbortedError(absl::StrCat("aborted (", absl::StatusCodeToString(reason.code()), "): ", reason.message()));
  }
  abort_requested_.store(true);
}

absl::Status NcclCommunicator::CheckAbort() {
  if (!abort_requested_.load()) return absl::OkStatus();
  comm_->Abort();  // the op thread's own: NcclComm is not shared across threads
  absl::MutexLock lock(&abort_mu_);
  return sticky_.Record(abort_reason_);
}

absl::Status NcclCommunicator::Finish(ncclResult_t result, absl::string_view what) {
  return sticky_.Record(comm_->Complete(result, absl::Now() + timeout_, what));
}

template <typename Call>
absl::Status NcclCommunicator::Grouped(int n, Call call, absl::string_view what) {
  ncclResult_t result = ncclGroupStart();
  if (result != ncclSuccess) return Finish(result, "ncclGroupStart");
  ncclResult_t first_error = ncclSuccess;
  for (int i = 0; i < n && first_error == ncclSuccess; ++i) {
    first_error = call(i);
  }
  // Always close the group so NCCL's group state stays balanced.
  result = ncclGroupEnd();
  if (first_error != ncclSuccess) return Finish(first_error, what);
  return Finish(result, absl::StrCat(what, " (ncclGroupEnd)"));
}

absl::Status NcclCommunicator::Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) {
  MUONSHARD_RETURN_IF_ERROR(internal::CheckBuffer(buf, count, dtype, "Reduce").status());
  MUONSHARD_RETURN_IF_ERROR(internal::CheckReduceOp(op));
  MUONSHARD_RETURN_IF_ERROR(internal::CheckRoot(root, size_));
  MUONSHARD_RETURN_IF_ERROR(Enter());
  if (count == 0) return absl::OkStatus();
  return Finish(
      ncclReduce(buf, buf, static_cast<size_t>(count), ToNccl(dtype), ToNccl(op), root, comm_->get(), stream()),
      "ncclReduce");
}

absl::Status NcclCommunicator::Broadcast(void* buf, int64_t count, CommDType dtype, int root) {
  MUONSHARD_RETURN_IF_ERROR(internal::CheckBuffer(buf, count, dtype, "Broadcast").status());
  MUONSHARD_RETURN_IF_ERROR(internal::CheckRoot(root, size_));
  MUONSHARD_RETURN_IF_ERROR(Enter());
  if (count == 0) return absl::OkStatus();
  return Finish(ncclBroadcast(buf, buf, static_cast<size_t>(count), ToNccl(dtype), root, comm_->get(), stream()),
                "ncclBroadcast");
}

absl::Status NcclCommunicator::AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) {
  MUONSHARD_RETURN_IF_ERROR(internal::CheckBuffer(buf, count, dtype, "AllReduce").status());
  MUONSHARD_RETURN_IF_ERROR(internal::CheckReduceOp(op));
  MUONSHARD_RETURN_IF_ERROR(Enter());
  if (count == 0) return absl::OkStatus();
  return Finish(ncclAllReduce(buf, buf, static_cast<size_t>(count), ToNccl(dtype), ToNccl(op), comm_->get(), stream()),
                "ncclAllReduce");
}

absl::Status NcclCommunicator::ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts,
                                             CommDType dtype, ReduceOp op) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t total,
                             internal::CheckReduceScatterArgs(in, out, counts, dtype, op, rank_, size_));
  MUONSHARD_RETURN_IF_ERROR(Enter());
  if (total == 0) return absl::OkStatus();
  if (!internal::AllEqual(counts)) {
    return ReduceScatterUneven(static_cast<const char*>(in), out, counts, dtype, op);
  }
  return Finish(
      ncclReduceScatter(in, out, static_cast<size_t>(counts[0]), ToNccl(dtype), ToNccl(op), comm_->get(), stream()),
      "ncclReduceScatter");
}

absl::Status NcclCommunicator::ReduceScatterUneven(const char* in, void* out, absl::Span<const int64_t> counts,
                                                   CommDType dtype, ReduceOp op) {
  const int64_t esize = CommDTypeSize(dtype).value_or(0);
  const std::vector<int64_t> offsets = internal::Offsets(counts);
  return Grouped(
      size_,
      [&](int owner) {
        if (counts[owner] == 0) return ncclSuccess;
        // recvbuff is only used on the root (nccl.h), so others pass null.
        return ncclReduce(in + offsets[owner] * esize, owner == rank_ ? out : nullptr,
                          static_cast<size_t>(counts[owner]), ToNccl(dtype), ToNccl(op), owner, comm_->get(), stream());
      },
      "ReduceScatter (grouped ncclReduce)");
}

absl::Status NcclCommunicator::AllGather(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t total, internal::CheckCounts(counts, size_));
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t in_bytes,
                             internal::CheckBuffer(in, counts[rank_], dtype, "AllGather input"));
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t out_bytes, internal::CheckBuffer(out, total, dtype, "AllGather output"));
  // In place (`in` is this rank's segment of `out`) is NCCL's own in-place
  // case: ncclAllGather's sendbuff at recvbuff + rank * count, and
  // ncclBroadcast's sendbuff == recvbuff on the root.
  const int64_t esize = CommDTypeSize(dtype).value_or(0);  // checked above
  MUONSHARD_RETURN_IF_ERROR(
      internal::CheckAllGatherBuffers(in, in_bytes, out, out_bytes, internal::Offsets(counts)[rank_] * esize).status());
  MUONSHARD_RETURN_IF_ERROR(Enter());
  if (total == 0) return absl::OkStatus();
  if (!internal::AllEqual(counts)) {
    return AllGatherUneven(in, static_cast<char*>(out), counts, dtype);
  }
  return Finish(ncclAllGather(in, out, static_cast<size_t>(counts[0]), ToNccl(dtype), comm_->get(), stream()),
                "ncclAllGather");
}

absl::Status NcclCommunicator::AllGatherUneven(const void* in, char* out, absl::Span<const int64_t> counts,
                                               CommDType dtype) {
  const int64_t esize = CommDTypeSize(dtype).value_or(0);
  const std::vector<int64_t> offsets = internal::Offsets(counts);
  return Grouped(
      size_,
      [&](int owner) {
        if (counts[owner] == 0) return ncclSuccess;
        // sendbuff is only read on the root.
        return ncclBroadcast(in, out + offsets[owner] * esize, static_cast<size_t>(counts[owner]), ToNccl(dtype), owner,
                             comm_->get(), stream());
      },
      "AllGather (grouped ncclBroadcast)");
}

absl::Status NcclCommunicator::Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t bytes,
                             internal::CheckRootedBuffers(in, out, count, dtype, root, rank_, size_, "Gather"));
  return Rooted(/*to_root=*/true, const_cast<void*>(in), static_cast<char*>(out), bytes, count, dtype, root);
}

absl::Status NcclCommunicator::Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t bytes,
                             internal::CheckRootedBuffers(out, in, count, dtype, root, rank_, size_, "Scatter"));
  return Rooted(/*to_root=*/false, out, static_cast<char*>(const_cast<void*>(in)), bytes, count, dtype, root);
}

// Every rank exchanges its `single` segment with the root, which exchanges
// segment r of `all` with rank r -- itself included: NCCL supports
// send/recv to self inside a group. ncclSend only reads its buffer.
absl::Status NcclCommunicator::Rooted(bool to_root, void* single, char* all, int64_t bytes, int64_t count,
                                      CommDType dtype, int root) {
  MUONSHARD_RETURN_IF_ERROR(Enter());
  if (bytes == 0) return absl::OkStatus();
  const auto n = static_cast<size_t>(count);
  const ncclDataType_t type = ToNccl(dtype);
  return Grouped(
      size_,
      [&](int peer) {
        if (peer == root) {
          const ncclResult_t r = to_root ? ncclSend(single, n, type, root, comm_->get(), stream())
                                         : ncclRecv(single, n, type, root, comm_->get(), stream());
          if (r != ncclSuccess || rank_ != root) return r;
        }
        if (rank_ != root) return ncclSuccess;
        char* segment = all + peer * bytes;
        return to_root ? ncclRecv(segment, n, type, peer, comm_->get(), stream())
                       : ncclSend(segment, n, type, peer, comm_->get(), stream());
      },
      to_root ? "Gather (grouped ncclSend/ncclRecv)" : "Scatter (grouped ncclSend/ncclRecv)");
}

absl::Status NcclCommunicator::Barrier() {
  MUONSHARD_RETURN_IF_ERROR(group_.CheckNotInGroup("Barrier()"));
  MUONSHARD_RETURN_IF_ERROR(Enter());
  void* scratch = barrier_scratch_->get();
  MUONSHARD_RETURN_IF_ERROR(Finish(ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, comm_->get(), stream()),
                                   "barrier ncclAllReduce"));
  return Synchronize();
}

absl::Status NcclCommunicator::GroupStart() {
  MUONSHARD_RETURN_IF_ERROR(Enter());
  MUONSHARD_RETURN_IF_ERROR(Finish(ncclGroupStart(), "ncclGroupStart"));
  group_.Start();
  return absl::OkStatus();
}

absl::Status NcclCommunicator::GroupEnd() {
  MUONSHARD_RETURN_IF_ERROR(group_.End());
  // Close NCCL's (thread-local) group even on a broken communicator, so the
  // thread's later NCCL calls are not swallowed by a dangling group.
  (void)cudaSetDevice(device_);
  const ncclResult_t result = ncclGroupEnd();
  MUONSHARD_RETURN_IF_ERROR(sticky_.Check());
  return Finish(result, "ncclGroupEnd");
}

absl::Status NcclCommunicator::Synchronize() {
  MUONSHARD_RETURN_IF_ERROR(group_.CheckNotInGroup("Synchronize()"));
  MUONSHARD_RETURN_IF_ERROR(Enter());
  const absl::Time deadline = absl::Now() + timeout_;
  Backoff pause({absl::Microseconds(50), 2.0, absl::Milliseconds(1)});
  // cudaStreamSynchronize cannot time out and would hang on a dead peer, so
  // poll the stream and the communicator's async error instead (NOTE
  // [Bounded NCCL waits] in nccl_comm.h).
  for (;;) {
    const cudaError_t state = cudaStreamQuery(stream());
    if (state != cudaSuccess && state != cudaErrorNotReady) {
      return sticky_.Record(CudaToStatus(state, "cudaStreamQuery"));
    }
    MUONSHARD_RETURN_IF_ERROR(CheckAbort());
    MUONSHARD_RETURN_IF_ERROR(sticky_.Record(comm_->CheckAsyncError("Synchronize")));
    if (state == cudaSuccess) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      comm_->Abort();
      return sticky_.Record(absl::DeadlineExceededError(absl::StrCat(
          "Synchronize: stream not drained within ", absl::FormatDuration(timeout_), "; communicator aborted")));
    }
    absl::SleepFor(pause.Next());
  }
}

}  // namespace muonshard::worker
