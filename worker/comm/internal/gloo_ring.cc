#include "worker/comm/internal/gloo_ring.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gloo/types.h"
#include "worker/comm/internal/host_float.h"

namespace muonshard::worker::internal {
namespace {

// The slot prefix of muonshard's transfers ('M'); gloo's own algorithms,
// which this communicator no longer calls, use small prefixes.
constexpr uint8_t kSlotPrefix = 0x4d;

int Mod(int a, int n) { return ((a % n) + n) % n; }

std::vector<int64_t> ByteOffsets(absl::Span<const int64_t> counts, size_t elem_bytes) {
  std::vector<int64_t> out(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) out[i + 1] = out[i] + counts[i] * static_cast<int64_t>(elem_bytes);
  return out;
}

}  // namespace

GlooPeers::GlooPeers(std::shared_ptr<::gloo::Context> context, std::chrono::milliseconds timeout)
    : context_(std::move(context)), timeout_(timeout) {}

absl::Status GlooPeers::Exchange(uint32_t tag, int to, const void* send, size_t send_bytes, int from, void* recv,
                                 size_t recv_bytes) {
  const uint64_t slot = ::gloo::Slot::build(kSlotPrefix, tag);
  std::unique_ptr<::gloo::transport::UnboundBuffer> in;
  std::unique_ptr<::gloo::transport::UnboundBuffer> out;
  if (recv_bytes > 0) {
    in = context_->createUnboundBuffer(recv, recv_bytes);
    in->recv(from, slot, 0, recv_bytes);
  }
  if (send_bytes > 0) {
    // gloo only reads a send buffer; its API takes a mutable pointer.
    out = context_->createUnboundBuffer(const_cast<void*>(send), send_bytes);
    out->send(to, slot, 0, send_bytes);
  }
  if (in != nullptr) MUONSHARD_RETURN_IF_ERROR(Wait(in.get(), /*recv=*/true));
  if (out != nullptr) MUONSHARD_RETURN_IF_ERROR(Wait(out.get(), /*recv=*/false));
  return absl::OkStatus();
}

absl::Status GlooPeers::Wait(::gloo::transport::UnboundBuffer* buffer, bool recv) {
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return aborted_;
    waiting_.push_back(buffer);
  }
  absl::Cleanup unregister = [&] {
    absl::MutexLock lock(&mu_);
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), buffer));
  };
  const bool done = recv ? buffer->waitRecv(nullptr, timeout_) : buffer->waitSend(nullptr, timeout_);
  if (done) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return aborted_.ok() ? absl::AbortedError("gloo transfer aborted") : aborted_;
}

void GlooPeers::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) {
    aborted_ =
        absl::AbortedError(absl::StrCat("aborted (", absl::StatusCodeToString(reason.code()), "): ", reason.message()));
  }
  for (::gloo::transport::UnboundBuffer* b : waiting_) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
}

absl::Status GlooPeers::aborted() const {
  absl::MutexLock lock(&mu_);
  return aborted_;
}

absl::Status RingReduceScatter(GlooPeers& peers, uint32_t tag, float* data, absl::Span<const int64_t> counts,
                               float* scratch) {
  const int n = peers.size();
  const int r = peers.rank();
  const std::vector<int64_t> at = ByteOffsets(counts, 1);  // element offsets
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = Mod(r - 1 - s, n);
    const int recv_seg = Mod(r - 2 - s, n);
    MUONSHARD_RETURN_IF_ERROR(peers.Exchange(tag, Mod(r + 1, n), data + at[send_seg], counts[send_seg] * sizeof(float),
                                             Mod(r - 1, n), scratch, counts[recv_seg] * sizeof(float)));
    float* acc = data + at[recv_seg];
    for (int64_t i = 0; i < counts[recv_seg]; ++i) acc[i] = scratch[i] + acc[i];
  }
  return absl::OkStatus();
}

absl::Status RingAllGather(GlooPeers& peers, uint32_t tag, void* data, absl::Span<const int64_t> counts,
                           size_t elem_bytes) {
  const int n = peers.size();
  const int r = peers.rank();
  const std::vector<int64_t> at = ByteOffsets(counts, elem_bytes);
  auto* bytes = static_cast<char*>(data);
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = Mod(r - s, n);
    const int recv_seg = Mod(r - s - 1, n);
    MUONSHARD_RETURN_IF_ERROR(peers.Exchange(tag, Mod(r + 1, n), bytes + at[send_seg], at[send_seg + 1] - at[send_seg],
                                             Mod(r - 1, n), bytes + at[recv_seg], at[recv_seg + 1] - at[recv_seg]));
  }
  return absl::OkStatus();
}

absl::Status ReduceOfTwo(GlooPeers& peers, uint32_t tag, float* data, int64_t count, int root, float* scratch) {
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  if (peers.rank() != root) return peers.Exchange(tag, root, data, bytes, root, nullptr, 0);
  MUONSHARD_RETURN_IF_ERROR(peers.Exchange(tag, 1 - root, nullptr, 0, 1 - root, scratch, bytes));
  AddFloats(data, scratch, count);
  return absl::OkStatus();
}

absl::Status GatherToRoot(GlooPeers& peers, uint32_t tag, void* data, absl::Span<const int64_t> counts,
                          size_t elem_bytes, int root) {
  const int r = peers.rank();
  const std::vector<int64_t> at = ByteOffsets(counts, elem_bytes);
  auto* bytes = static_cast<char*>(data);
  if (r != root) {
    return peers.Exchange(tag, root, bytes + at[r], at[r + 1] - at[r], root, nullptr, 0);
  }
  for (int k = 0; k < peers.size(); ++k) {
    if (k == root) continue;
    MUONSHARD_RETURN_IF_ERROR(peers.Exchange(tag, k, nullptr, 0, k, bytes + at[k], at[k + 1] - at[k]));
  }
  return absl::OkStatus();
}

absl::Status GatherTo(GlooPeers& peers, uint32_t tag, const void* in, void* out, size_t bytes, int root) {
  if (peers.rank() != root) return peers.Exchange(tag, root, in, bytes, root, nullptr, 0);
  auto* segments = static_cast<char*>(out);
  std::memcpy(segments + root * bytes, in, bytes);
  for (int k = 0; k < peers.size(); ++k) {
    if (k == root) continue;
    MUONSHARD_RETURN_IF_ERROR(peers.Exchange(tag, k, nullptr, 0, k, segments + k * bytes, bytes));
  }
  return absl::OkStatus();
}

absl::Status ScatterFrom(GlooPeers& peers, uint32_t tag, const void* in, void* out, size_t bytes, int root) {
  if (peers.rank() != root) return peers.Exchange(tag, root, nullptr, 0, root, out, bytes);
  const auto* segments = static_cast<const char*>(in);
  std::memcpy(out, segments + root * bytes, bytes);
  for (int k = 0; k < peers.size(); ++k) {
    if (k == root) continue;
    MUONSHARD_RETURN_IF_ERROR(peers.Exchange(tag, k, segments + k * bytes, bytes, k, nullptr, 0));
  }
  return absl::OkStatus();
}

absl::Status TreeBroadcast(GlooPeers& peers, uint32_t tag, void* data, size_t bytes, int root) {
  const int n = peers.size();
  const int me = Mod(peers.rank() - root, n);  // rank relative to the root
  // Receive from the parent: the rank that differs in my lowest set bit.
  int mask = 1;
  while (mask < n) {
    if (me & mask) {
      MUONSHARD_RETURN_IF_ERROR(peers.Exchange(tag, 0, nullptr, 0, Mod(me - mask + root, n), data, bytes));
      break;
    }
    mask <<= 1;
  }
  // Send to the children below that bit, largest subtree first.
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (me + mask < n) {
      MUONSHARD_RETURN_IF_ERROR(peers.Exchange(tag, Mod(me + mask + root, n), data, bytes, 0, nullptr, 0));
    }
  }
  return absl::OkStatus();
}

absl::Status DisseminationBarrier(GlooPeers& peers, uint32_t tag) {
  const int n = peers.size();
  const int r = peers.rank();
  char token = 0;
  char sink = 0;
  for (int k = 1; k < n; k *= 2) {
    MUONSHARD_RETURN_IF_ERROR(peers.Exchange(tag, Mod(r + k, n), &token, 1, Mod(r - k, n), &sink, 1));
  }
  return absl::OkStatus();
}

std::vector<int64_t> EvenCounts(int64_t count, int n) {
  std::vector<int64_t> out(n, count / n);
  for (int i = 0; i < count % n; ++i) ++out[i];
  return out;
}

}  // namespace muonshard::worker::internal
