#include "worker/comm/gloo_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "worker/comm/gloo_store.h"
#include "worker/comm/internal/comm_checks.h"
#include "worker/comm/internal/gloo_ring.h"
#include "worker/comm/internal/host_float.h"

namespace muonshard::worker {
namespace {

constexpr int kAllRanks = -1;

int64_t MaxCount(absl::Span<const int64_t> counts) {
  int64_t m = 0;
  for (int64_t c : counts) m = std::max(m, c);
  return m;
}

bool IsTimeoutMessage(absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  return absl::StrContains(lower, "timeout") || absl::StrContains(lower, "timed out");
}

// Translates the exception being handled into a status. Call only from a
// catch block. See the header for the mapping.
absl::Status CurrentExceptionToStatus(absl::string_view what) {
  try {
    throw;
  } catch (const ::gloo::IoException& e) {
    if (IsTimeoutMessage(e.what())) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": ", e.what()));
    }
    return absl::AbortedError(absl::StrCat(what, ": ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": unknown exception"));
  }
}

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<::gloo::Context> context, absl::Duration timeout)
      : context_(std::move(context)), peers_(context_, absl::ToChronoMilliseconds(timeout)) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  absl::Status Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) override;
  absl::Status Broadcast(void* buf, int64_t count, CommDType dtype, int root) override;
  absl::Status AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) override;
  absl::Status ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype,
                             ReduceOp op) override;
  absl::Status AllGather(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype) override;
  absl::Status Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) override;
  absl::Status Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) override;
  absl::Status Barrier() override;
  absl::Status GroupStart() override;
  absl::Status GroupEnd() override;
  absl::Status Synchronize() override;
  void Abort(const absl::Status& reason) override { peers_.Abort(reason); }

 private:
  // Runs transfers, turning gloo's exceptions into a status; failures
  // (aborts included) break the communicator (see StickyError).
  absl::Status Run(absl::string_view what, absl::FunctionRef<absl::Status()> fn);
  // OK unless broken or aborted.
  absl::Status CheckUsable();
  // Reduces `count` fp32 values in place to `root`, or to every rank for
  // kAllRanks, then applies kAvg's division where the result lands.
  absl::Status ReduceFloats(float* data, int64_t count, ReduceOp op, int root);
  // ReduceFloats for any dtype, widening to fp32 and rounding back.
  absl::Status ReduceAnyDType(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root);

  const std::shared_ptr<::gloo::Context> context_;
  internal::GlooPeers peers_;
  uint32_t next_tag_ = 0;
  internal::GroupDepth group_;
  internal::StickyError sticky_;
};

absl::Status GlooCommunicator::Run(absl::string_view what, absl::FunctionRef<absl::Status()> fn) {
  const std::string where = absl::StrCat("gloo ", what, " (rank ", rank(), "/", size(), ")");
  try {
    absl::Status s = fn();
    return s.ok() ? s : sticky_.Record(Annotate(s, where));
  } catch (...) {
    return sticky_.Record(CurrentExceptionToStatus(where));
  }
}

absl::Status GlooCommunicator::CheckUsable() {
  MUONSHARD_RETURN_IF_ERROR(sticky_.Check());
  absl::Status aborted = peers_.aborted();
  return aborted.ok() ? aborted : sticky_.Record(aborted);
}

absl::Status GlooCommunicator::ReduceFloats(float* data, int64_t count, ReduceOp op, int root) {
  if (count == 0) return absl::OkStatus();
  if (size() == 2 && root != kAllRanks) {
    std::vector<float> theirs(rank() == root ? count : 0);
    const uint32_t tag = next_tag_++;
    MUONSHARD_RETURN_IF_ERROR(
        Run("reduce", [&] { return internal::ReduceOfTwo(peers_, tag, data, count, root, theirs.data()); }));
  } else if (size() > 1) {
    // Ring reduce-scatter of near-equal segments, then the segments to the
    // root (reduce) or to every rank (all-reduce).
    const std::vector<int64_t> counts = internal::EvenCounts(count, size());
    std::vector<float> scratch(MaxCount(counts));
    const uint32_t tag = next_tag_++;
    MUONSHARD_RETURN_IF_ERROR(Run(root == kAllRanks ? "allreduce" : "reduce", [&] {
      MUONSHARD_RETURN_IF_ERROR(internal::RingReduceScatter(peers_, tag, data, counts, scratch.data()));
      if (root == kAllRanks) return internal::RingAllGather(peers_, tag, data, counts, sizeof(float));
      return internal::GatherToRoot(peers_, tag, data, counts, sizeof(float), root);
    }));
  }
  if (op == ReduceOp::kAvg && (root == kAllRanks || root == rank())) {
    internal::DivideFloats(data, count, static_cast<float>(size()));
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::ReduceAnyDType(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) {
  if (dtype == CommDType::kFloat32) {
    return ReduceFloats(static_cast<float*>(buf), count, op, root);
  }
  std::vector<float> wide(count);
  internal::WidenToFloat(buf, count, dtype, wide.data());
  MUONSHARD_RETURN_IF_ERROR(ReduceFloats(wide.data(), count, op, root));
  if (root == kAllRanks || root == rank()) {
    internal::NarrowFromFloat(wide.data(), count, dtype, buf);
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) {
  MUONSHARD_RETURN_IF_ERROR(internal::CheckBuffer(buf, count, dtype, "Reduce").status());
  MUONSHARD_RETURN_IF_ERROR(internal::CheckReduceOp(op));
  MUONSHARD_RETURN_IF_ERROR(internal::CheckRoot(root, size()));
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  return ReduceAnyDType(buf, count, dtype, op, root);
}

absl::Status GlooCommunicator::AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) {
  MUONSHARD_RETURN_IF_ERROR(internal::CheckBuffer(buf, count, dtype, "AllReduce").status());
  MUONSHARD_RETURN_IF_ERROR(internal::CheckReduceOp(op));
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  return ReduceAnyDType(buf, count, dtype, op, kAllRanks);
}

absl::Status GlooCommunicator::Broadcast(void* buf, int64_t count, CommDType dtype, int root) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t bytes, internal::CheckBuffer(buf, count, dtype, "Broadcast"));
  MUONSHARD_RETURN_IF_ERROR(internal::CheckRoot(root, size()));
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  if (bytes == 0 || size() == 1) return absl::OkStatus();
  const uint32_t tag = next_tag_++;
  return Run("broadcast", [&] { return internal::TreeBroadcast(peers_, tag, buf, static_cast<size_t>(bytes), root); });
}

absl::Status GlooCommunicator::ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts,
                                             CommDType dtype, ReduceOp op) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t total,
                             internal::CheckReduceScatterArgs(in, out, counts, dtype, op, rank(), size()));
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  if (total == 0) return absl::OkStatus();
  // A ring reduce-scatter of an fp32 copy of the input: (n-1)/n of it on the
  // wire per rank, uneven and zero counts included.
  std::vector<float> wide(total);
  internal::WidenToFloat(in, total, dtype, wide.data());
  if (size() > 1) {
    std::vector<float> scratch(MaxCount(counts));
    const uint32_t tag = next_tag_++;
    MUONSHARD_RETURN_IF_ERROR(Run("reduce-scatter", [&] {
      return internal::RingReduceScatter(peers_, tag, wide.data(), counts, scratch.data());
    }));
  }
  float* mine = wide.data() + internal::Offsets(counts)[rank()];
  if (op == ReduceOp::kAvg) internal::DivideFloats(mine, counts[rank()], static_cast<float>(size()));
  internal::NarrowFromFloat(mine, counts[rank()], dtype, out);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllGather(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t total, internal::CheckCounts(counts, size()));
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t in_bytes,
                             internal::CheckBuffer(in, counts[rank()], dtype, "AllGather input"));
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t out_bytes, internal::CheckBuffer(out, total, dtype, "AllGather output"));
  // In place when `in` is this rank's segment of `out`.
  const int64_t esize = CommDTypeSize(dtype).value_or(0);  // checked above
  MUONSHARD_ASSIGN_OR_RETURN(
      const bool in_place,
      internal::CheckAllGatherBuffers(in, in_bytes, out, out_bytes, internal::Offsets(counts)[rank()] * esize));
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  if (total == 0) return absl::OkStatus();
  if (in_bytes > 0 && !in_place) {
    std::memcpy(static_cast<char*>(out) + internal::Offsets(counts)[rank()] * esize, in, static_cast<size_t>(in_bytes));
  }
  if (size() == 1) return absl::OkStatus();
  const uint32_t tag = next_tag_++;
  return Run("allgather", [&] { return internal::RingAllGather(peers_, tag, out, counts, esize); });
}

absl::Status GlooCommunicator::Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t bytes,
                             internal::CheckRootedBuffers(in, out, count, dtype, root, rank(), size(), "Gather"));
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  if (bytes == 0) return absl::OkStatus();
  const uint32_t tag = next_tag_++;
  return Run("gather", [&] { return internal::GatherTo(peers_, tag, in, out, static_cast<size_t>(bytes), root); });
}

absl::Status GlooCommunicator::Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t bytes,
                             internal::CheckRootedBuffers(out, in, count, dtype, root, rank(), size(), "Scatter"));
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  if (bytes == 0) return absl::OkStatus();
  const uint32_t tag = next_tag_++;
  return Run("scatter", [&] { return internal::ScatterFrom(peers_, tag, in, out, static_cast<size_t>(bytes), root); });
}

absl::Status GlooCommunicator::Barrier() {
  MUONSHARD_RETURN_IF_ERROR(group_.CheckNotInGroup("Barrier()"));
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  if (size() == 1) return absl::OkStatus();
  const uint32_t tag = next_tag_++;
  return Run("barrier", [&] { return internal::DisseminationBarrier(peers_, tag); });
}

absl::Status GlooCommunicator::GroupStart() {
  group_.Start();
  return absl::OkStatus();
}

absl::Status GlooCommunicator::GroupEnd() { return group_.End(); }

absl::Status GlooCommunicator::Synchronize() {
  MUONSHARD_RETURN_IF_ERROR(group_.CheckNotInGroup("Synchronize()"));
  return CheckUsable();
}

absl::Status CheckOptions(const GlooOptions& options, const RendezvousStore* store) {
  if (store == nullptr) return absl::InvalidArgumentError("null store");
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("gloo rank ", options.rank, " of size ", options.size));
  }
  if (options.key_prefix.empty()) {
    return absl::InvalidArgumentError("gloo key_prefix must name the group");
  }
  if (options.hostname.empty() && options.interface.empty()) {
    return absl::InvalidArgumentError("gloo needs a hostname or interface");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gloo timeout must be positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> CreateTcpDevice(const GlooOptions& options) {
  ::gloo::transport::tcp::attr attr;
  if (options.interface.empty()) {
    attr.hostname = options.hostname;
  } else {
    attr.iface = options.interface;
  }
  try {
    return ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    // A bad address or interface is the usual cause; gloo does not say more.
    return absl::InvalidArgumentError(absl::StrCat(
        "gloo TCP device on \"", options.interface.empty() ? options.hostname : options.interface, "\": ", e.what()));
  }
}

// The full TCP mesh of `options` (see CreateGlooCommunicator).
absl::StatusOr<std::shared_ptr<::gloo::Context>> ConnectGlooContext(const GlooOptions& options,
                                                                    RendezvousStore* store) {
  MUONSHARD_RETURN_IF_ERROR(CheckOptions(options, store));
  MUONSHARD_ASSIGN_OR_RETURN(std::shared_ptr<::gloo::transport::Device> device, CreateTcpDevice(options));
  PrefixedRendezvousStore prefixed(store, options.key_prefix);
  GlooStoreAdapter adapter(&prefixed, options.timeout);
  auto context = std::make_shared<::gloo::rendezvous::Context>(options.rank, options.size);
  context->setTimeout(absl::ToChronoMilliseconds(options.timeout));
  try {
    context->connectFullMesh(adapter, device);
  } catch (...) {
    const std::string what = absl::StrCat("gloo rendezvous of rank ", options.rank, "/", options.size, " under \"",
                                          options.key_prefix, "\"");
    // Prefer the store's own status over one guessed from the exception.
    absl::Status store_error = adapter.last_error();
    if (!store_error.ok()) return Annotate(store_error, what);
    return CurrentExceptionToStatus(what);
  }
  return context;
}

// ByteChannel on gloo's point-to-point transfers (internal::GlooPeers).
class GlooByteChannel : public ByteChannel {
 public:
  GlooByteChannel(std::shared_ptr<::gloo::Context> context, absl::Duration timeout)
      : context_(std::move(context)), peers_(context_, absl::ToChronoMilliseconds(timeout)) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  absl::Status Exchange(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes) override {
    return Run("exchange", [&] { return peers_.Exchange(next_tag_++, to, send, send_bytes, from, recv, recv_bytes); });
  }

  absl::Status Barrier() override {
    return Run("barrier", [&] { return internal::DisseminationBarrier(peers_, next_tag_++); });
  }

  void Abort(const absl::Status& reason) override { peers_.Abort(reason); }

 private:
  absl::Status Run(absl::string_view what, absl::FunctionRef<absl::Status()> fn) {
    const std::string where = absl::StrCat("gloo byte channel ", what, " (rank ", rank(), "/", size(), ")");
    try {
      absl::Status s = fn();
      return s.ok() ? s : Annotate(s, where);
    } catch (...) {
      return CurrentExceptionToStatus(where);
    }
  }

  const std::shared_ptr<::gloo::Context> context_;
  internal::GlooPeers peers_;
  uint32_t next_tag_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options,
                                                                     RendezvousStore* store) {
  MUONSHARD_ASSIGN_OR_RETURN(std::shared_ptr<::gloo::Context> context, ConnectGlooContext(options, store));
  return std::make_unique<GlooCommunicator>(std::move(context), options.timeout);
}

absl::StatusOr<std::unique_ptr<ByteChannel>> CreateGlooByteChannel(const GlooOptions& options, RendezvousStore* store) {
  MUONSHARD_ASSIGN_OR_RETURN(std::shared_ptr<::gloo::Context> context, ConnectGlooContext(options, store));
  return std::make_unique<GlooByteChannel>(std::move(context), options.timeout);
}

}  // namespace muonshard::worker
