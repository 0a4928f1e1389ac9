// ShardedOptimizer::Step: reduce, Muon, AdamW, sync (see the header).

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optimizer/internal/typed_buffer.h"
#include "worker/optimizer/sharded_optimizer.h"

namespace muonshard::worker {
namespace {

using internal::BackendBuffer;
using internal::EntryRef;
using internal::PartLayout;

class Stopwatch {
 public:
  double Lap() {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return seconds;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// Zeroes the parts of `buffer` no entry covers (alignment padding, gaps), so
// scratch left by a previous collective never travels as data.
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

absl::Status ShardedOptimizer::CheckNoOpenStep() const {
  if (!in_step_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("rank ", rank(), ": a step is open (BeginStep without FinishStep)"));
}

absl::Status ShardedOptimizer::CheckUsable() const {
  if (!broken_.ok()) return broken_;
  MUONSHARD_RETURN_IF_ERROR(CheckNoOpenStep());
  for (size_t p = 0; p < layout_.parts.size(); ++p) {
    if (!initialised_[p]) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank(), ": tensor \"", held_[p].spec->name(), "\" was never set (SetParameter)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> ShardedOptimizer::Step(GradientSource& grads) {
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  // Every gradient is fetched and checked before any is handed over, so a
  // bad one changes nothing.
  std::vector<absl::Span<const float>> spans(layout_.parts.size());
  for (size_t p = 0; p < layout_.parts.size(); ++p) {
    MUONSHARD_ASSIGN_OR_RETURN(spans[p], grads.PartGradient(layout_.parts[p].tensor));
    MUONSHARD_RETURN_IF_ERROR(CheckGradientSize(layout_.parts[p], static_cast<int64_t>(spans[p].size()), true));
  }
  return HandOverAll([&](size_t p) { return GradReady(layout_.parts[p].tensor, spans[p]); });
}

absl::StatusOr<StepStats> ShardedOptimizer::Step(BackendGradientSource& grads) {
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  std::vector<BackendGradient> all(layout_.parts.size());
  for (size_t p = 0; p < layout_.parts.size(); ++p) {
    MUONSHARD_ASSIGN_OR_RETURN(all[p], grads.PartGradient(layout_.parts[p].tensor));
    MUONSHARD_RETURN_IF_ERROR(CheckGradientSize(layout_.parts[p], all[p].numel, all[p].data != nullptr));
  }
  return HandOverAll([&](size_t p) { return GradReady(layout_.parts[p].tensor, all[p]); });
}

absl::StatusOr<StepStats> ShardedOptimizer::HandOverAll(absl::FunctionRef<absl::Status(size_t part)> hand_over) {
  MUONSHARD_RETURN_IF_ERROR(BeginStep());
  // Last tensors first: the hand-off order of NOTE [Pipelined step].
  for (size_t p = layout_.parts.size(); p-- > 0;) {
    absl::Status s = hand_over(p);
    if (!s.ok()) return Broken(s);  // checked above: a device error
  }
  return FinishStep();
}

absl::Status ShardedOptimizer::CheckGradientSize(const PartLayout& part, int64_t numel, bool non_null) const {
  const int64_t want = part.element_end - part.element_begin;
  if (numel == want && (non_null || want == 0)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", Spec(part).name(), "\": gradient has ", numel, " values",
                                                 non_null ? "" : " at a null address", " for a part of ", want));
}

absl::Status ShardedOptimizer::PackBackendPart(const PartLayout& part, const BackendGradient& grad) {
  const int elem = kernels::ElementBytes(grad.type);
  for (const EntryRef& ref : part.entries) {
    const v1::BucketEntry& e = Entry(ref);
    BackendBuffer& buffer = ref.muon ? muon_[ref.bucket].grads : adamw_[ref.bucket].grads;
    const void* src = static_cast<const char*>(grad.data) + (e.element_begin() - part.element_begin) * elem;
    const kernels::ElementType dst_type = internal::ToElementType(buffer.dtype());
    // Already in place (NOTE [Part storage]): nothing to copy.
    if (src == buffer.At(e.offset()) && grad.type == dst_type) continue;
    MUONSHARD_RETURN_IF_ERROR(backend_->Convert(src, grad.type, buffer.At(e.offset()), dst_type, e.numel()));
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::ZeroBucketGaps() {
  for (int b = 0; b < view_.muon_buckets_size(); ++b) {
    MUONSHARD_RETURN_IF_ERROR(ZeroUncovered(view_.muon_buckets(b).entries(), muon_[b].grads));
  }
  for (int b = 0; b < view_.adamw_buckets_size(); ++b) {
    MUONSHARD_RETURN_IF_ERROR(ZeroUncovered(view_.adamw_buckets(b).entries(), adamw_[b].grads));
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::PackPart(const PartLayout& part, absl::Span<const float> grad) {
  for (const EntryRef& ref : part.entries) {
    const v1::BucketEntry& e = Entry(ref);
    BackendBuffer& buffer = ref.muon ? muon_[ref.bucket].grads : adamw_[ref.bucket].grads;
    absl::Span<const float> values = grad.subspan(e.element_begin() - part.element_begin, e.numel());
    // Already in place (NOTE [Part storage]): nothing to copy.
    if (host_memory() && buffer.dtype() == v1::FP32 && values.data() == buffer.At(e.offset())) continue;
    MUONSHARD_RETURN_IF_ERROR(buffer.Write(e.offset(), values));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> ShardedOptimizer::FinishSequential() {
  in_step_ = false;
  const StepPhases phases = step_options_.phases;
  StepStats stats;
  Stopwatch phase;
  // The collectives run on the communicators' streams: the packed gradients
  // must have landed first.
  absl::Status s = backend_->Synchronize();
  if (s.ok() && phases != StepPhases::kComputeOnly) s = ReduceGradients();
  if (!s.ok()) return Broken(s);
  stats.reduce_seconds = phase.Lap();
  if (phases != StepPhases::kCommunicationOnly) {
    s = RunMuon();
    if (!s.ok()) return Broken(s);
    stats.muon_seconds = phase.Lap();
    s = RunAdamw();
    if (!s.ok()) return Broken(s);
    stats.adamw_seconds = phase.Lap();
  }
  if (phases != StepPhases::kComputeOnly) s = SyncParameters();
  if (!s.ok()) return Broken(s);
  stats.sync_seconds = phase.Lap();
  return CloseStep(stats);
}

absl::Status ShardedOptimizer::ReduceGradients() {
  return ForEachCommGroup([&](int g, Communicator& comm) -> absl::Status {
    for (const BucketKey& key : GroupBuckets(g)) {
      MUONSHARD_RETURN_IF_ERROR(
          Traced(StepSpan::Kind::kReduce, key, StepSpan::kCallerThread, [&] { return ReduceBucket(comm, key); }));
    }
    return absl::OkStatus();
  });
}

std::vector<ShardedOptimizer::BucketKey> ShardedOptimizer::GroupBuckets(int group) const {
  std::vector<BucketKey> keys;
  for (int b : layout_.groups[group].muon_buckets) keys.push_back({true, b});
  for (int b : layout_.groups[group].adamw_buckets) keys.push_back({false, b});
  return keys;
}

absl::Status ShardedOptimizer::ReduceBucket(Communicator& comm, const BucketKey& key) {
  const CommDType dtype = internal::ToCommDType(grad_dtype_);
  const int b = key.bucket;
  if (key.muon) {
    return comm.Reduce(muon_[b].grads.data(), muon_[b].grads.numel(), dtype, ReduceOp::kAvg,
                       layout_.muon_buckets[b].owner_group_rank);
  }
  return comm.ReduceScatter(adamw_[b].grads.data(), adamw_[b].shard_grads.data(), layout_.adamw_buckets[b].counts,
                            dtype, ReduceOp::kAvg);
}

absl::StatusOr<const float*> ShardedOptimizer::GradFloats(const BackendBuffer& grads, int64_t offset, int64_t n) {
  if (grads.dtype() == v1::FP32) return grads.floats() + offset;
  // Stream-ordered: the kernel that reads scratch_ runs before the next
  // conversion overwrites it.
  MUONSHARD_RETURN_IF_ERROR(scratch_.ConvertFrom(0, grads, offset, n));
  return scratch_.floats();
}

absl::Status ShardedOptimizer::RunMuon() {
  for (int b = 0; b < view_.muon_buckets_size(); ++b) {
    // Traced where the rank updates the bucket, as the pipelined schedule
    // does (elsewhere the call does nothing).
    auto update = [&] { return UpdateMuonBucket(b); };
    const BucketKey key{true, b};
    MUONSHARD_RETURN_IF_ERROR(Updates(key) ? Traced(StepSpan::Kind::kUpdate, key, StepSpan::kCallerThread, update)
                                           : update());
  }
  return backend_->Synchronize();
}

// NOTE [Batched Muon]: the owned shards of one bucket that share a shape, a
// layout and a decay flag go through one MuonUpdateBatch (one parallel loop
// over all their matrices on the CPU, one batched Newton-Schulz on CUDA),
// bit-identical to one MuonUpdate each on the CPU. 16-bit gradients are
// widened one shard at a time into scratch_, so they keep the per-shard
// path.
absl::Status ShardedOptimizer::UpdateMuonBucket(int bucket) {
  const std::vector<int>& owned = owned_in_muon_[bucket];
  // NOTE [Tensor-parallel Muon]: in owned order, the same on every TP rank.
  MUONSHARD_RETURN_IF_ERROR(UpdateTpBucket(bucket));
  if (grad_dtype_ != v1::FP32) {
    for (int shard : owned) {
      if (!IsTp(shard)) MUONSHARD_RETURN_IF_ERROR(UpdateMuonShard(shard));
    }
    return absl::OkStatus();
  }
  std::vector<bool> done(owned.size(), false);
  for (size_t i = 0; i < owned.size(); ++i) done[i] = IsTp(owned[i]);
  std::vector<kernels::MuonTensors> items;
  for (size_t i = 0; i < owned.size(); ++i) {
    if (done[i]) continue;
    const internal::MuonShardLayout& first = layout_.owned[owned[i]];
    const bool decay = shards_[owned[i]].with_decay;
    items.clear();
    for (size_t j = i; j < owned.size(); ++j) {
      const internal::MuonShardLayout& o = layout_.owned[owned[j]];
      if (done[j] || o.shape.rows != first.shape.rows || o.shape.cols != first.shape.cols ||
          o.shape.batch != first.shape.batch || o.layout != first.layout || shards_[owned[j]].with_decay != decay) {
        continue;
      }
      done[j] = true;
      MUONSHARD_ASSIGN_OR_RETURN(kernels::MuonTensors t, MuonTensorsOf(owned[j]));
      items.push_back(t);
    }
    MUONSHARD_RETURN_IF_ERROR(
        backend_->MuonUpdateBatch(items, first.shape, first.layout, MuonOptionsFor(config_, decay)));
  }
  for (int shard : owned) MUONSHARD_RETURN_IF_ERROR(CastMuonShard(shard));
  return absl::OkStatus();
}

absl::StatusOr<kernels::MuonTensors> ShardedOptimizer::MuonTensorsOf(int shard) {
  const internal::MuonShardLayout& o = layout_.owned[shard];
  const v1::BucketEntry& e = view_.muon_buckets(o.bucket).entries(o.entry);
  MuonShardState& s = shards_[shard];
  BackendBuffer& params = muon_[o.bucket].params;
  kernels::MuonTensors t;
  MUONSHARD_ASSIGN_OR_RETURN(t.grad, GradFloats(muon_[o.bucket].grads, e.offset(), e.numel()));
  t.momentum = s.momentum.floats();
  t.master = s.master.floats();
  // bf16 models are written by the kernel straight into the bucket.
  t.model = params.dtype() == v1::BF16 ? params.words() + e.offset() : nullptr;
  return t;
}

// Other model dtypes are cast from the updated master; an fp32 master is
// the model copy already (NOTE [FP32 masters]: ConvertFrom copies nothing).
absl::Status ShardedOptimizer::CastMuonShard(int shard) {
  const internal::MuonShardLayout& o = layout_.owned[shard];
  BackendBuffer& params = muon_[o.bucket].params;
  if (params.dtype() == v1::BF16) return absl::OkStatus();
  const v1::BucketEntry& e = view_.muon_buckets(o.bucket).entries(o.entry);
  return params.ConvertFrom(e.offset(), shards_[shard].master, 0, e.numel());
}

absl::Status ShardedOptimizer::UpdateMuonShard(int shard) {
  const internal::MuonShardLayout& o = layout_.owned[shard];
  MUONSHARD_ASSIGN_OR_RETURN(const kernels::MuonTensors t, MuonTensorsOf(shard));
  MUONSHARD_RETURN_IF_ERROR(
      backend_->MuonUpdate(t, o.shape, o.layout, MuonOptionsFor(config_, shards_[shard].with_decay)));
  return CastMuonShard(shard);
}

absl::Status ShardedOptimizer::RunAdamw() {
  for (int b = 0; b < view_.adamw_buckets_size(); ++b) {
    MUONSHARD_RETURN_IF_ERROR(
        Traced(StepSpan::Kind::kUpdate, {false, b}, StepSpan::kCallerThread, [&] { return UpdateAdamwBucket(b); }));
  }
  AdvanceBetaPows();
  return backend_->Synchronize();
}

absl::Status ShardedOptimizer::UpdateAdamwBucket(int bucket) {
  const kernels::AdamWBetaPows pows{&beta1_pow_, &beta2_pow_};
  const internal::AdamwBucketLayout& al = layout_.adamw_buckets[bucket];
  AdamwBucketState& s = adamw_[bucket];
  const int64_t shard = al.shard_end - al.shard_begin;
  const bool shared = groups_[al.group].comm != nullptr;
  MUONSHARD_ASSIGN_OR_RETURN(const float* grad, GradFloats(shared ? s.shard_grads : s.grads, 0, shard));
  int64_t base = 0;
  BackendBuffer& model = AdamwModel(bucket, &base);
  const bool bf16 = model.dtype() == v1::BF16;
  for (size_t k = 0; k < al.segments.size(); ++k) {
    const int64_t at = al.segments[k].shard_offset;
    const int64_t n = al.segments[k].numel;
    kernels::AdamWTensors t;
    t.grad = grad + at;
    t.master = s.master.floats() + at;
    t.moment1 = s.moment1.floats() + at;
    t.moment2 = s.moment2.floats() + at;
    t.model = bf16 ? model.words() + base + at : nullptr;
    MUONSHARD_RETURN_IF_ERROR(backend_->AdamW(t, n, pows, AdamWOptionsFor(config_, s.segment_decay[k])));
    // FP16 is cast; an fp32 master is the model copy (nothing to copy).
    if (!bf16) MUONSHARD_RETURN_IF_ERROR(model.ConvertFrom(base + at, s.master, at, n));
  }
  return absl::OkStatus();
}

BackendBuffer& ShardedOptimizer::AdamwModel(int bucket, int64_t* offset) {
  const internal::AdamwBucketLayout& al = layout_.adamw_buckets[bucket];
  AdamwBucketState& s = adamw_[bucket];
  // A group of one has no reduce-scatter/all-gather: its shard is the
  // whole bucket and the model is written in place, as is an fp32 shard's
  // (its master is its place in the bucket).
  if (groups_[al.group].comm == nullptr || !s.master.owns_memory()) {
    *offset = al.shard_begin;
    return s.params;
  }
  *offset = 0;
  return s.staging;
}

// NOTE [Beta powers]: once per step, after every shard used them.
void ShardedOptimizer::AdvanceBetaPows() {
  kernels::AdamWOptions advance = AdamWOptionsFor(config_, true);
  advance.advance_beta_pows = true;
  kernels::AdvanceBetaPows({&beta1_pow_, &beta2_pow_}, advance);
}

absl::Status ShardedOptimizer::SyncParameters() {
  return ForEachCommGroup([&](int g, Communicator& comm) -> absl::Status {
    for (const BucketKey& key : GroupBuckets(g)) {
      MUONSHARD_RETURN_IF_ERROR(
          Traced(StepSpan::Kind::kSync, key, StepSpan::kCallerThread, [&] { return SyncBucket(comm, key); }));
    }
    return absl::OkStatus();
  });
}

absl::Status ShardedOptimizer::SyncBucket(Communicator& comm, const BucketKey& key) {
  const int b = key.bucket;
  if (key.muon) {
    BackendBuffer& params = muon_[b].params;
    return comm.Broadcast(params.data(), params.numel(), params.comm_dtype(), layout_.muon_buckets[b].owner_group_rank);
  }
  // The shard's model values: in staging, or already in place in the
  // bucket (an fp32 shard), which the communicators take as an in-place
  // all-gather.
  int64_t at = 0;
  const BackendBuffer& shard = AdamwModel(b, &at);
  BackendBuffer& params = adamw_[b].params;
  return comm.AllGather(shard.At(at), params.data(), layout_.adamw_buckets[b].counts, params.comm_dtype());
}

absl::StatusOr<std::vector<checkpoint::StateShard>> ShardedOptimizer::StateShards() {
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::ShardSpec> specs, checkpoint::ExpectedShards(view_));
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::SliceLocation> slices, checkpoint::LocateSlices(view_));
  absl::flat_hash_map<int, int> adamw_position;  // AdamwBucket.id -> position in the view
  for (int b = 0; b < view_.adamw_buckets_size(); ++b) adamw_position[view_.adamw_buckets(b).id()] = b;
  std::vector<checkpoint::StateShard> shards;
  shards.reserve(specs.size());
  size_t k = 0;
  mirrors_.clear();
  auto add = [&](BackendBuffer& buffer, int64_t at, checkpoint::StateKind kind) -> absl::Status {
    if (k >= specs.size() || specs[k].kind != kind || at + specs[k].numel() > buffer.numel()) {
      return absl::InternalError(
          absl::StrCat("rank ", rank(), ": optimizer buffers do not match the view's shard ", k));
    }
    MUONSHARD_ASSIGN_OR_RETURN(absl::Span<float> host, HostState(buffer));
    shards.push_back({specs[k], host.subspan(at, specs[k].numel())});
    ++k;
    return absl::OkStatus();
  };
  using Kind = checkpoint::StateKind;
  for (MuonShardState& s : shards_) {
    MUONSHARD_RETURN_IF_ERROR(add(s.master, 0, Kind::kMaster));
    MUONSHARD_RETURN_IF_ERROR(add(s.momentum, 0, Kind::kMomentum));
  }
  for (const checkpoint::SliceLocation& slice : slices) {
    AdamwBucketState& b = adamw_[adamw_position[slice.bucket]];
    MUONSHARD_RETURN_IF_ERROR(add(b.master, slice.shard_offset, Kind::kMaster));
    MUONSHARD_RETURN_IF_ERROR(add(b.moment1, slice.shard_offset, Kind::kMoment1));
    MUONSHARD_RETURN_IF_ERROR(add(b.moment2, slice.shard_offset, Kind::kMoment2));
  }
  if (k != specs.size()) return absl::InternalError("optimizer buffers do not cover the view's shards");
  return shards;
}

absl::StatusOr<absl::Span<float>> ShardedOptimizer::HostState(BackendBuffer& buffer) {
  if (host_memory()) return absl::MakeSpan(buffer.floats(), buffer.numel());
  auto [it, inserted] = mirrors_.try_emplace(&buffer);
  if (inserted) {
    it->second.resize(buffer.numel());
    MUONSHARD_RETURN_IF_ERROR(buffer.Read(0, absl::MakeSpan(it->second)));
  }
  return absl::MakeSpan(it->second);
}

checkpoint::Scalars ShardedOptimizer::scalars() const {
  checkpoint::Scalars s;
  s.step = steps_;
  s.beta1_pow = beta1_pow_;
  s.beta2_pow = beta2_pow_;
  return s;
}

absl::Status ShardedOptimizer::RestoreFromState(const checkpoint::Scalars& scalars) {
  if (!broken_.ok()) return broken_;  // parameters need not be set: this sets them
  MUONSHARD_RETURN_IF_ERROR(CheckNoOpenStep());
  steps_ = scalars.step;
  beta1_pow_ = scalars.beta1_pow;
  beta2_pow_ = scalars.beta2_pow;
  absl::Status s = RebuildModelCopies();
  if (s.ok()) s = backend_->Synchronize();
  if (s.ok()) s = SyncParameters();
  if (!s.ok()) return Broken(s);
  initialised_.assign(initialised_.size(), true);
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::SyncModelCopies() {
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  mirrors_.clear();  // nothing to upload: the state stays as it is
  absl::Status s = RebuildModelCopies();
  if (s.ok()) s = backend_->Synchronize();
  if (s.ok()) s = SyncParameters();
  if (!s.ok()) return Broken(s);
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::RebuildModelCopies() {
  for (auto& [buffer, values] : mirrors_) {
    MUONSHARD_RETURN_IF_ERROR(buffer->Write(0, values));
  }
  // Owners write their masters into the model copy, exactly as a step does
  // (fp32 masters are the model copy: NOTE [FP32 masters]).
  for (size_t i = 0; i < layout_.owned.size(); ++i) {
    const internal::MuonShardLayout& o = layout_.owned[i];
    const v1::BucketEntry& e = view_.muon_buckets(o.bucket).entries(o.entry);
    MUONSHARD_RETURN_IF_ERROR(muon_[o.bucket].params.ConvertFrom(e.offset(), shards_[i].master, 0, e.numel()));
  }
  for (int b = 0; b < view_.adamw_buckets_size(); ++b) {
    int64_t base = 0;
    BackendBuffer& model = AdamwModel(b, &base);
    AdamwBucketState& s = adamw_[b];
    for (const internal::AdamwSegment& seg : layout_.adamw_buckets[b].segments) {
      MUONSHARD_RETURN_IF_ERROR(model.ConvertFrom(base + seg.shard_offset, s.master, seg.shard_offset, seg.numel));
    }
  }
  return absl::OkStatus();
}

StepCommBytes ShardedOptimizer::CommSnapshot() const {
  StepCommBytes bytes;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const GroupState& g = groups_[i];
    if (g.comm == nullptr) continue;
    const CommCounters c = g.comm->Snapshot();
    bytes.collectives += c.gather.calls + c.scatter.calls;
    if (view_.groups(layout_.groups[i].view_group).colour() == v1::TENSOR_PARALLEL) {
      // A ring all-gather sends and receives (n - 1) / n of its output.
      const int n = g.comm->size();
      bytes.tp += c.gather.bytes + c.scatter.bytes + c.all_gather.bytes / n * 2 * (n - 1);
      bytes.collectives += c.all_gather.calls;
      continue;
    }
    bytes.grad_reduce += c.reduce.bytes;
    bytes.grad_reduce_scatter += c.reduce_scatter.bytes;
    bytes.param_broadcast += c.broadcast.bytes;
    bytes.param_all_gather += c.all_gather.bytes;
    bytes.collectives +=
        c.reduce.calls + c.reduce_scatter.calls + c.broadcast.calls + c.all_gather.calls + c.all_reduce.calls;
  }
  return bytes;
}

}  // namespace muonshard::worker
