#include "worker/optimizer/internal/parameter_buffers.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/plan_stats.h"

namespace muonshard::worker::internal {
namespace {

// The bytes `buffer` allocated (none for a view).
int64_t AllocatedBytes(const BackendBuffer& buffer) { return buffer.owns_memory() ? buffer.bytes() : 0; }

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterBuffers>> ParameterBuffers::Create(const OptimizerLayout& layout,
                                                                           kernels::KernelBackend& backend,
                                                                           const OptimizerConfig& config) {
  auto buffers = absl::WrapUnique(new ParameterBuffers(layout, backend));
  MUONSHARD_RETURN_IF_ERROR(buffers->Allocate(config));
  return buffers;
}

absl::StatusOr<BackendBuffer> ParameterBuffers::NewMaster(BackendBuffer& params, int64_t offset, int64_t numel) {
  if (planner::KeepsMaster(params.dtype())) return BackendBuffer::Create(backend_, v1::FP32, numel);
  return BackendBuffer::View(params, offset, numel);
}

absl::Status ParameterBuffers::Allocate(const OptimizerConfig& config) {
  const v1::RankView& view = layout_.view();
  const ViewLayout& index = layout_.index();
  for (const ScatterRound& r : layout_.scatter_rounds()) {  // one dtype each
    const v1::DType dtype = view.muon_buckets(r.buckets[0]).dtype();
    MUONSHARD_ASSIGN_OR_RETURN(BackendBuffer round,
                               BackendBuffer::Create(backend_, dtype, index.groups[r.group].size * r.segment));
    round_params_.push_back(std::move(round));
  }
  for (int i = 0; i < view.muon_buckets_size(); ++i) {
    const v1::MuonBucket& b = view.muon_buckets(i);
    const int round = layout_.ScatterRoundOf(i);
    absl::StatusOr<BackendBuffer> params =
        round < 0 ? BackendBuffer::Create(backend_, b.dtype(), b.numel())
                  : BackendBuffer::View(
                        round_params_[round],
                        index.muon_buckets[i].owner_group_rank * layout_.scatter_rounds()[round].segment, b.numel());
    MUONSHARD_RETURN_IF_ERROR(params.status());
    muon_params_.push_back(*std::move(params));
  }
  shards_of_part_.resize(index.parts.size());
  segments_of_part_.resize(index.parts.size());
  for (size_t i = 0; i < index.owned.size(); ++i) {
    const MuonShardLayout& o = index.owned[i];
    const v1::BucketEntry& e = layout_.OwnedEntry(static_cast<int>(i));
    MuonShardState s;
    MUONSHARD_ASSIGN_OR_RETURN(s.master, NewMaster(muon_params_[o.bucket], e.offset(), o.shape.elements()));
    MUONSHARD_ASSIGN_OR_RETURN(s.momentum, BackendBuffer::Create(backend_, v1::FP32, o.shape.elements()));
    s.with_decay = WithDecay(config, layout_.Spec(index.parts[o.part]).name());
    shards_.push_back(std::move(s));
    shards_of_part_[o.part].push_back(static_cast<int>(i));
  }
  for (int b = 0; b < view.adamw_buckets_size(); ++b) {
    const v1::AdamwBucket& bucket = view.adamw_buckets(b);
    const AdamwBucketLayout& al = index.adamw_buckets[b];
    const int64_t shard = al.shard_end - al.shard_begin;
    AdamwBucketState s;
    MUONSHARD_ASSIGN_OR_RETURN(s.params, BackendBuffer::Create(backend_, bucket.dtype(), bucket.numel()));
    MUONSHARD_ASSIGN_OR_RETURN(s.master, NewMaster(s.params, al.shard_begin, shard));
    // An fp32 shard is updated in place (its master is the model copy), and
    // the all-gather sends it from there.
    const bool staged = layout_.Shared(al.group) && s.master.owns_memory();
    MUONSHARD_ASSIGN_OR_RETURN(s.staging, BackendBuffer::Create(backend_, bucket.dtype(), staged ? shard : 0));
    MUONSHARD_ASSIGN_OR_RETURN(s.moment1, BackendBuffer::Create(backend_, v1::FP32, shard));
    MUONSHARD_ASSIGN_OR_RETURN(s.moment2, BackendBuffer::Create(backend_, v1::FP32, shard));
    for (size_t k = 0; k < al.segments.size(); ++k) {
      const int part = al.segments[k].part;
      s.segment_decay.push_back(WithDecay(config, layout_.Spec(index.parts[part]).name()));
      segments_of_part_[part].emplace_back(b, static_cast<int>(k));
    }
    adamw_.push_back(std::move(s));
  }
  return absl::OkStatus();
}

BackendBuffer& ParameterBuffers::Params(const EntryRef& ref) {
  return ref.muon ? muon_params_[ref.bucket] : adamw_[ref.bucket].params;
}

const BackendBuffer& ParameterBuffers::Params(const EntryRef& ref) const {
  return ref.muon ? muon_params_[ref.bucket] : adamw_[ref.bucket].params;
}

absl::Status ParameterBuffers::WriteParameter(const PartLayout& part, absl::Span<const float> rounded) {
  for (const EntryRef& ref : part.entries) {
    const v1::BucketEntry& e = layout_.Entry(ref);
    MUONSHARD_RETURN_IF_ERROR(
        Params(ref).Write(e.offset(), rounded.subspan(e.element_begin() - part.element_begin, e.numel())));
  }
  // fp32 masters are views of the model copy just written: nothing more.
  const int part_index = layout_.PartIndex(part);
  for (int i : shards_of_part_[part_index]) {
    if (!shards_[i].master.owns_memory()) continue;
    const v1::BucketEntry& e = layout_.OwnedEntry(i);
    MUONSHARD_RETURN_IF_ERROR(
        shards_[i].master.Write(0, rounded.subspan(e.element_begin() - part.element_begin, e.numel())));
  }
  for (const auto& [b, k] : segments_of_part_[part_index]) {
    if (!adamw_[b].master.owns_memory()) continue;
    const AdamwBucketLayout& al = layout_.index().adamw_buckets[b];
    const AdamwSegment& seg = al.segments[k];
    const v1::BucketEntry& e = layout_.view().adamw_buckets(b).entries(seg.entry);
    // The segment's buffer range, clipped to the entry's real elements (the
    // padding after them keeps a zero master).
    const int64_t begin = al.shard_begin + seg.shard_offset;
    const int64_t end = std::min(begin + seg.numel, e.offset() + e.numel());
    if (end <= begin) continue;
    MUONSHARD_RETURN_IF_ERROR(adamw_[b].master.Write(
        begin - al.shard_begin,
        rounded.subspan(e.element_begin() + (begin - e.offset()) - part.element_begin, end - begin)));
  }
  // Host sources are consumed on return; the backend may still be copying
  // into device memory, which the next step orders after.
  return absl::OkStatus();
}

absl::Status ParameterBuffers::ReadModelCopy(const PartLayout& part, absl::Span<float> out) const {
  if (static_cast<int64_t>(out.size()) != part.element_end - part.element_begin) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", layout_.Spec(part).name(), "\": output holds ",
                                                   out.size(), " values for a part of ",
                                                   part.element_end - part.element_begin));
  }
  for (const EntryRef& ref : part.entries) {
    const v1::BucketEntry& e = layout_.Entry(ref);
    MUONSHARD_RETURN_IF_ERROR(
        Params(ref).Read(e.offset(), out.subspan(e.element_begin() - part.element_begin, e.numel())));
  }
  return absl::OkStatus();
}

absl::Status ParameterBuffers::CopyModelCopyTo(const PartLayout& part, void* out, kernels::ElementType type,
                                               int64_t numel) const {
  if (numel != part.element_end - part.element_begin) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", layout_.Spec(part).name(), "\": output holds ", numel,
                                                   " values for a part of ", part.element_end - part.element_begin));
  }
  if (numel > 0 && out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", layout_.Spec(part).name(), "\": null output"));
  }
  for (const EntryRef& ref : part.entries) {
    const v1::BucketEntry& e = layout_.Entry(ref);
    void* at = static_cast<char*>(out) + (e.element_begin() - part.element_begin) * kernels::ElementBytes(type);
    MUONSHARD_RETURN_IF_ERROR(Params(ref).ConvertTo(e.offset(), e.numel(), at, type));
  }
  return absl::OkStatus();
}

BackendBuffer& ParameterBuffers::AdamwModel(int bucket, int64_t* offset) {
  const AdamwBucketLayout& al = layout_.index().adamw_buckets[bucket];
  AdamwBucketState& s = adamw_[bucket];
  // A group of one has no reduce-scatter/all-gather: its shard is the
  // whole bucket and the model is written in place, as is an fp32 shard's
  // (its master is its place in the bucket).
  if (!layout_.Shared(al.group) || !s.master.owns_memory()) {
    *offset = al.shard_begin;
    return s.params;
  }
  *offset = 0;
  return s.staging;
}

// Other model dtypes are cast from the updated master; an fp32 master is
// the model copy already (NOTE [FP32 masters]: ConvertFrom copies nothing).
absl::Status ParameterBuffers::CastMuonShard(int shard) {
  BackendBuffer& params = muon_params_[layout_.index().owned[shard].bucket];
  if (params.dtype() == v1::BF16) return absl::OkStatus();
  const v1::BucketEntry& e = layout_.OwnedEntry(shard);
  return params.ConvertFrom(e.offset(), shards_[shard].master, 0, e.numel());
}

absl::Status ParameterBuffers::CastMastersToModel() {
  // Owners write their masters into the model copy, exactly as a step does
  // (fp32 masters are the model copy: NOTE [FP32 masters]).
  const ViewLayout& index = layout_.index();
  for (size_t i = 0; i < index.owned.size(); ++i) {
    const v1::BucketEntry& e = layout_.OwnedEntry(static_cast<int>(i));
    MUONSHARD_RETURN_IF_ERROR(
        muon_params_[index.owned[i].bucket].ConvertFrom(e.offset(), shards_[i].master, 0, e.numel()));
  }
  for (int b = 0; b < static_cast<int>(adamw_.size()); ++b) {
    int64_t base = 0;
    BackendBuffer& model = AdamwModel(b, &base);
    const AdamwBucketState& s = adamw_[b];
    for (const AdamwSegment& seg : index.adamw_buckets[b].segments) {
      MUONSHARD_RETURN_IF_ERROR(model.ConvertFrom(base + seg.shard_offset, s.master, seg.shard_offset, seg.numel));
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterBuffers::SyncBucket(Communicator& comm, const BucketKey& key) {
  const int b = key.bucket;
  if (key.muon) {
    BackendBuffer& params = muon_params_[b];
    return comm.Broadcast(params.data(), params.numel(), params.comm_dtype(),
                          layout_.index().muon_buckets[b].owner_group_rank);
  }
  // The shard's model values: in staging, or already in place in the
  // bucket (an fp32 shard), which the communicators take as an in-place
  // all-gather.
  int64_t at = 0;
  const BackendBuffer& shard = AdamwModel(b, &at);
  BackendBuffer& params = adamw_[b].params;
  return comm.AllGather(shard.At(at), params.data(), layout_.index().adamw_buckets[b].counts, params.comm_dtype());
}

absl::Status ParameterBuffers::SyncRound(Communicator& comm, int round) {
  const ScatterRound& r = layout_.scatter_rounds()[round];
  const GroupLayout& group = layout_.index().groups[r.group];
  BackendBuffer& params = round_params_[round];
  // This rank's segment holds its bucket's updated values (or zeros).
  return comm.AllGather(params.At(group.group_rank * r.segment), params.data(),
                        std::vector<int64_t>(group.size, r.segment), params.comm_dtype());
}

int64_t ParameterBuffers::optimizer_state_bytes() const {
  int64_t bytes = 0;
  for (const MuonShardState& s : shards_) bytes += AllocatedBytes(s.master) + s.momentum.bytes();
  for (const AdamwBucketState& s : adamw_) {
    bytes += AllocatedBytes(s.master) + s.moment1.bytes() + s.moment2.bytes();
  }
  return bytes;
}

int64_t ParameterBuffers::model_copy_bytes() const {
  int64_t bytes = 0;
  for (const BackendBuffer& params : muon_params_) bytes += params.owns_memory() ? params.bytes() : 0;
  for (const BackendBuffer& params : round_params_) bytes += params.bytes();
  for (const AdamwBucketState& s : adamw_) bytes += s.params.bytes();
  return bytes;
}

}  // namespace muonshard::worker::internal
