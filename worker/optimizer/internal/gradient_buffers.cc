#include "worker/optimizer/internal/gradient_buffers.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optimizer/internal/typed_buffer.h"

namespace muonshard::worker::internal {
namespace {

// Zeroes the parts of `buffer` no entry covers.
template <typename Entries>
absl::Status ZeroUncovered(const Entries& entries, BackendBuffer& buffer) {
  int64_t at = 0;
  for (const v1::BucketEntry& e : entries) {
    MUONSHARD_RETURN_IF_ERROR(buffer.Zero(at, e.offset() - at));
    at = e.offset() + e.numel();
  }
  return buffer.Zero(at, buffer.numel() - at);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GradientBuffers>> GradientBuffers::Create(const OptimizerLayout& layout,
                                                                         kernels::KernelBackend& backend) {
  auto buffers = absl::WrapUnique(new GradientBuffers(layout, backend));
  MUONSHARD_RETURN_IF_ERROR(buffers->Allocate());
  return buffers;
}

absl::Status GradientBuffers::Allocate() {
  const v1::DType dtype = layout_.grad_dtype();
  int64_t widest = 0;  // the most gradient elements one kernel call reads
  for (const ScatterRound& r : layout_.scatter_rounds()) {
    const int members = layout_.index().groups[r.group].size;
    MUONSHARD_ASSIGN_OR_RETURN(BackendBuffer round, BackendBuffer::Create(backend_, dtype, members * r.segment));
    MUONSHARD_ASSIGN_OR_RETURN(BackendBuffer reduced, BackendBuffer::Create(backend_, dtype, r.segment));
    round_.push_back(std::move(round));
    round_reduced_.push_back(std::move(reduced));
  }
  for (int b = 0; b < layout_.view().muon_buckets_size(); ++b) {
    const int64_t numel = layout_.view().muon_buckets(b).numel();
    const int round = layout_.ScatterRoundOf(b);
    if (round < 0) {
      MUONSHARD_ASSIGN_OR_RETURN(BackendBuffer grads, BackendBuffer::Create(backend_, dtype, numel));
      muon_.push_back(std::move(grads));
      continue;
    }
    const int64_t segment = layout_.scatter_rounds()[round].segment;
    const int owner = layout_.index().muon_buckets[b].owner_group_rank;
    MUONSHARD_ASSIGN_OR_RETURN(BackendBuffer grads, BackendBuffer::View(round_[round], owner * segment, numel));
    muon_.push_back(std::move(grads));
  }
  for (const MuonShardLayout& o : layout_.index().owned) widest = std::max(widest, o.shape.elements());
  for (int b = 0; b < layout_.view().adamw_buckets_size(); ++b) {
    const AdamwBucketLayout& al = layout_.index().adamw_buckets[b];
    const int64_t shard = al.shard_end - al.shard_begin;
    MUONSHARD_ASSIGN_OR_RETURN(BackendBuffer grads,
                               BackendBuffer::Create(backend_, dtype, layout_.view().adamw_buckets(b).numel()));
    MUONSHARD_ASSIGN_OR_RETURN(BackendBuffer shard_grads,
                               BackendBuffer::Create(backend_, dtype, layout_.Shared(al.group) ? shard : 0));
    adamw_.push_back(std::move(grads));
    adamw_shard_.push_back(std::move(shard_grads));
    widest = std::max(widest, shard);
  }
  if (dtype != v1::FP32) {
    MUONSHARD_ASSIGN_OR_RETURN(scratch_, BackendBuffer::Create(backend_, v1::FP32, widest));
  }
  return absl::OkStatus();
}

absl::Status GradientBuffers::CheckSize(const PartLayout& part, int64_t numel, bool non_null) const {
  const int64_t want = part.element_end - part.element_begin;
  if (numel == want && (non_null || want == 0)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", layout_.Spec(part).name(), "\": gradient has ", numel,
                                                 " values", non_null ? "" : " at a null address", " for a part of ",
                                                 want));
}

absl::Status GradientBuffers::Pack(const PartLayout& part, absl::Span<const float> grad) {
  const bool host_memory = backend_.device_kind() == kernels::DeviceKind::kCpu;
  for (const EntryRef& ref : part.entries) {
    const v1::BucketEntry& e = layout_.Entry(ref);
    BackendBuffer& buffer = Bucket(ref);
    absl::Span<const float> values = grad.subspan(e.element_begin() - part.element_begin, e.numel());
    // Already in place (NOTE [Part storage]): nothing to copy.
    if (host_memory && buffer.dtype() == v1::FP32 && values.data() == buffer.At(e.offset())) continue;
    MUONSHARD_RETURN_IF_ERROR(buffer.Write(e.offset(), values));
  }
  return absl::OkStatus();
}

absl::Status GradientBuffers::PackBackend(const PartLayout& part, const BackendGradient& grad) {
  const int elem = kernels::ElementBytes(grad.type);
  for (const EntryRef& ref : part.entries) {
    const v1::BucketEntry& e = layout_.Entry(ref);
    BackendBuffer& buffer = Bucket(ref);
    const void* src = static_cast<const char*>(grad.data) + (e.element_begin() - part.element_begin) * elem;
    const kernels::ElementType dst_type = ToElementType(buffer.dtype());
    // Already in place (NOTE [Part storage]): nothing to copy.
    if (src == buffer.At(e.offset()) && grad.type == dst_type) continue;
    MUONSHARD_RETURN_IF_ERROR(backend_.Convert(src, grad.type, buffer.At(e.offset()), dst_type, e.numel()));
  }
  return absl::OkStatus();
}

absl::Status GradientBuffers::ZeroGaps() {
  for (int b = 0; b < layout_.view().muon_buckets_size(); ++b) {
    MUONSHARD_RETURN_IF_ERROR(ZeroUncovered(layout_.view().muon_buckets(b).entries(), muon_[b]));
  }
  for (int b = 0; b < layout_.view().adamw_buckets_size(); ++b) {
    MUONSHARD_RETURN_IF_ERROR(ZeroUncovered(layout_.view().adamw_buckets(b).entries(), adamw_[b]));
  }
  return absl::OkStatus();
}

absl::Status GradientBuffers::ReduceBucket(Communicator& comm, const BucketKey& key) {
  const CommDType dtype = ToCommDType(layout_.grad_dtype());
  const int b = key.bucket;
  if (key.muon) {
    return comm.Reduce(muon_[b].data(), muon_[b].numel(), dtype, ReduceOp::kAvg,
                       layout_.index().muon_buckets[b].owner_group_rank);
  }
  return comm.ReduceScatter(adamw_[b].data(), adamw_shard_[b].data(), layout_.index().adamw_buckets[b].counts, dtype,
                            ReduceOp::kAvg);
}

absl::Status GradientBuffers::ReduceRound(Communicator& comm, int round) {
  const ScatterRound& r = layout_.scatter_rounds()[round];
  const std::vector<int64_t> counts(layout_.index().groups[r.group].size, r.segment);
  return comm.ReduceScatter(round_[round].data(), round_reduced_[round].data(), counts,
                            ToCommDType(layout_.grad_dtype()), ReduceOp::kAvg);
}

absl::StatusOr<const float*> GradientBuffers::MuonFloats(int bucket, int64_t offset, int64_t n) {
  const int round = layout_.ScatterRoundOf(bucket);
  return Floats(round < 0 ? muon_[bucket] : round_reduced_[round], offset, n);
}

absl::StatusOr<const float*> GradientBuffers::AdamwShardFloats(int bucket) {
  const AdamwBucketLayout& al = layout_.index().adamw_buckets[bucket];
  const bool shared = layout_.Shared(al.group);
  return Floats(shared ? adamw_shard_[bucket] : adamw_[bucket], 0, al.shard_end - al.shard_begin);
}

absl::StatusOr<const float*> GradientBuffers::Floats(const BackendBuffer& grads, int64_t offset, int64_t n) {
  if (grads.dtype() == v1::FP32) return grads.floats() + offset;
  // Stream-ordered: the kernel that reads scratch_ runs before the next
  // conversion overwrites it.
  MUONSHARD_RETURN_IF_ERROR(scratch_.ConvertFrom(0, grads, offset, n));
  return scratch_.floats();
}

int64_t GradientBuffers::bytes() const {
  int64_t bytes = 0;
  for (const BackendBuffer& grads : muon_) bytes += grads.owns_memory() ? grads.bytes() : 0;
  for (size_t r = 0; r < round_.size(); ++r) bytes += round_[r].bytes() + round_reduced_[r].bytes();
  for (size_t b = 0; b < adamw_.size(); ++b) bytes += adamw_[b].bytes() + adamw_shard_[b].bytes();
  return bytes;
}

}  // namespace muonshard::worker::internal
