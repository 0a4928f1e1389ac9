// ShardedOptimizer: creation, parameters, accessors and GatherMasters. The
// step itself is in sharded_optimizer_step.cc.

#include "worker/optimizer/sharded_optimizer.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/model.h"
#include "plan/plan_stats.h"
#include "worker/optimizer/internal/bucket_split.h"
#include "worker/optimizer/internal/typed_buffer.h"

namespace muonshard::worker {

using internal::BackendBuffer;
using internal::EntryRef;
using internal::PartLayout;

namespace {

// The view a step runs: `view` with its Muon buckets in pieces (NOTE [Step
// pieces] in internal/bucket_split.h).
absl::StatusOr<v1::RankView> ViewInPieces(const v1::RankView& view, const StepOptions& step) {
  if (step.muon_piece_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step options: muon_piece_bytes is ", step.muon_piece_bytes));
  }
  if (step.muon_piece_bytes == 0) return view;
  // Errors name the plan's buckets, not the pieces.
  MUONSHARD_RETURN_IF_ERROR(internal::BuildViewLayout(view).status());
  return internal::SplitMuonBuckets(view, step.muon_piece_bytes);
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(v1::RankView view, kernels::KernelBackend* backend, const OptimizerConfig& config,
                                   const StepOptions& step)
    : view_(std::move(view)), backend_(backend), config_(config), step_options_(step) {}

ShardedOptimizer::~ShardedOptimizer() {
  // A step left open: its lanes may wait in collectives; end them first.
  if (in_step_ && pipeline_ != nullptr) {
    pipeline_->Fail(absl::CancelledError("optimizer destroyed with a step open"));
    (void)pipeline_->Finish();
  }
  pipeline_.reset();
}

absl::StatusOr<std::unique_ptr<ShardedOptimizer>> ShardedOptimizer::Create(const v1::RankView& view,
                                                                           const CommGroups& comms,
                                                                           kernels::KernelBackend* backend,
                                                                           const OptimizerConfig& config,
                                                                           const StepOptions& step) {
  if (backend == nullptr) return absl::InvalidArgumentError("ShardedOptimizer: null kernel backend");
  MUONSHARD_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  MUONSHARD_ASSIGN_OR_RETURN(v1::RankView pieces, ViewInPieces(view, step));
  auto optimizer = absl::WrapUnique(new ShardedOptimizer(std::move(pieces), backend, config, step));
  MUONSHARD_RETURN_IF_ERROR(optimizer->Init(comms));
  return optimizer;
}

absl::Status ShardedOptimizer::Init(const CommGroups& comms) {
  grad_dtype_ = planner::GradDType(view_.policy());
  if (planner::DTypeSize(grad_dtype_) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("rank view: unknown policy.grad_dtype ", grad_dtype_));
  }
  MUONSHARD_ASSIGN_OR_RETURN(layout_, internal::BuildViewLayout(view_));
  MUONSHARD_RETURN_IF_ERROR(InitComms(comms));
  beta1_pow_ = config_.adamw_beta1;
  beta2_pow_ = config_.adamw_beta2;
  MUONSHARD_RETURN_IF_ERROR(Allocate());
  return InitPipeline();
}

absl::Status ShardedOptimizer::InitComms(const CommGroups& comms) {
  absl::flat_hash_map<int, int> group_of_id;
  for (int g = 0; g < static_cast<int>(layout_.groups.size()); ++g) group_of_id[layout_.groups[g].id] = g;
  for (const auto& [id, comm] : comms) {
    if (!group_of_id.contains(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("communicator given for group ", id, ", which is not one of rank ", rank(), "'s groups"));
    }
  }
  groups_.resize(layout_.groups.size());
  for (size_t g = 0; g < layout_.groups.size(); ++g) {
    const internal::GroupLayout& gl = layout_.groups[g];
    auto it = comms.find(gl.id);
    Communicator* comm = it == comms.end() ? nullptr : it->second;
    if (comm == nullptr) {
      if (gl.size == 1) continue;
      return absl::InvalidArgumentError(absl::StrCat("no communicator for group ", gl.id, " of ", gl.size, " ranks"));
    }
    if (comm->size() != gl.size || comm->rank() != gl.group_rank) {
      return absl::InvalidArgumentError(absl::StrCat("communicator for group ", gl.id, " is rank ", comm->rank(),
                                                     " of ", comm->size(), "; the plan says rank ", gl.group_rank,
                                                     " of ", gl.size));
    }
    if (gl.size > 1) groups_[g].comm = std::make_unique<CountingCommunicator>(comm);
  }
  return absl::OkStatus();
}

absl::StatusOr<BackendBuffer> ShardedOptimizer::NewBuffer(v1::DType dtype, int64_t numel) {
  return BackendBuffer::Create(*backend_, dtype, numel);
}

absl::StatusOr<BackendBuffer> ShardedOptimizer::NewMaster(BackendBuffer& params, int64_t offset, int64_t numel) {
  if (planner::KeepsMaster(params.dtype())) return NewBuffer(v1::FP32, numel);
  return BackendBuffer::View(params, offset, numel);
}

absl::Status ShardedOptimizer::Allocate() {
  int64_t widest_grad = 0;  // the most gradient elements one kernel call reads
  for (const v1::MuonBucket& b : view_.muon_buckets()) {
    MuonBucketState s;
    MUONSHARD_ASSIGN_OR_RETURN(s.params, NewBuffer(b.dtype(), b.numel()));
    MUONSHARD_ASSIGN_OR_RETURN(s.grads, NewBuffer(grad_dtype_, b.numel()));
    muon_.push_back(std::move(s));
  }
  shards_of_part_.resize(layout_.parts.size());
  segments_of_part_.resize(layout_.parts.size());
  for (size_t i = 0; i < layout_.owned.size(); ++i) {
    const internal::MuonShardLayout& o = layout_.owned[i];
    const v1::BucketEntry& e = view_.muon_buckets(o.bucket).entries(o.entry);
    MuonShardState s;
    MUONSHARD_ASSIGN_OR_RETURN(s.master, NewMaster(muon_[o.bucket].params, e.offset(), o.shape.elements()));
    MUONSHARD_ASSIGN_OR_RETURN(s.momentum, NewBuffer(v1::FP32, o.shape.elements()));
    widest_grad = std::max(widest_grad, o.shape.elements());
    s.with_decay = WithDecay(config_, Spec(layout_.parts[o.part]).name());
    shards_.push_back(std::move(s));
    shards_of_part_[o.part].push_back(static_cast<int>(i));
  }
  for (int b = 0; b < view_.adamw_buckets_size(); ++b) {
    const v1::AdamwBucket& bucket = view_.adamw_buckets(b);
    const internal::AdamwBucketLayout& al = layout_.adamw_buckets[b];
    const int64_t shard = al.shard_end - al.shard_begin;
    const bool shared = layout_.groups[al.group].size > 1;
    AdamwBucketState s;
    MUONSHARD_ASSIGN_OR_RETURN(s.params, NewBuffer(bucket.dtype(), bucket.numel()));
    MUONSHARD_ASSIGN_OR_RETURN(s.grads, NewBuffer(grad_dtype_, bucket.numel()));
    MUONSHARD_ASSIGN_OR_RETURN(s.shard_grads, NewBuffer(grad_dtype_, shared ? shard : 0));
    MUONSHARD_ASSIGN_OR_RETURN(s.master, NewMaster(s.params, al.shard_begin, shard));
    // An fp32 shard is updated in place (its master is the model copy), and
    // the all-gather sends it from there.
    const bool staged = shared && s.master.owns_memory();
    MUONSHARD_ASSIGN_OR_RETURN(s.staging, NewBuffer(bucket.dtype(), staged ? shard : 0));
    MUONSHARD_ASSIGN_OR_RETURN(s.moment1, NewBuffer(v1::FP32, shard));
    MUONSHARD_ASSIGN_OR_RETURN(s.moment2, NewBuffer(v1::FP32, shard));
    widest_grad = std::max(widest_grad, shard);
    for (size_t k = 0; k < al.segments.size(); ++k) {
      const int part = al.segments[k].part;
      s.segment_decay.push_back(WithDecay(config_, Spec(layout_.parts[part]).name()));
      segments_of_part_[part].emplace_back(b, static_cast<int>(k));
    }
    adamw_.push_back(std::move(s));
  }
  MUONSHARD_RETURN_IF_ERROR(AllocateTpScratch());
  if (grad_dtype_ != v1::FP32) {
    MUONSHARD_ASSIGN_OR_RETURN(scratch_, NewBuffer(v1::FP32, widest_grad));
  }
  for (const PartLayout& p : layout_.parts) {
    HeldTensor h{p.tensor, &Spec(p), layout_.groups[p.group].id, p.element_begin, p.element_end};
    if (planner::IsTpSplit(Spec(p))) {
      h.tp = view_.topology().tp();
      h.tp_rank = view_.rank().tp_rank();
    }
    held_.push_back(h);
  }
  initialised_.assign(layout_.parts.size(), false);
  return absl::OkStatus();
}

const PartLayout* ShardedOptimizer::FindPart(int tensor) const {
  auto it = layout_.part_of_tensor.find(tensor);
  return it == layout_.part_of_tensor.end() ? nullptr : &layout_.parts[it->second];
}

const v1::PlannedTensor& ShardedOptimizer::Spec(const PartLayout& part) const {
  return view_.tensors(part.view_tensor).tensor();
}

const v1::BucketEntry& ShardedOptimizer::Entry(const EntryRef& ref) const {
  return ref.muon ? view_.muon_buckets(ref.bucket).entries(ref.entry)
                  : view_.adamw_buckets(ref.bucket).entries(ref.entry);
}

BackendBuffer& ShardedOptimizer::Params(const EntryRef& ref) {
  return ref.muon ? muon_[ref.bucket].params : adamw_[ref.bucket].params;
}

const BackendBuffer& ShardedOptimizer::Params(const EntryRef& ref) const {
  return ref.muon ? muon_[ref.bucket].params : adamw_[ref.bucket].params;
}

absl::Status ShardedOptimizer::SetParameter(int tensor, absl::Span<const float> values) {
  if (!broken_.ok()) return broken_;
  MUONSHARD_RETURN_IF_ERROR(CheckNoOpenStep());
  const PartLayout* part = FindPart(tensor);
  if (part == nullptr) return absl::NotFoundError(absl::StrCat("rank ", rank(), " holds no part of tensor ", tensor));
  const int64_t numel = part->element_end - part->element_begin;
  if (static_cast<int64_t>(values.size()) != numel) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", Spec(*part).name(), "\": got ", values.size(), " values for a part of ", numel));
  }
  std::vector<float> rounded(values.begin(), values.end());
  for (float& v : rounded) v = internal::RoundToDType(v, Spec(*part).dtype());
  // A device error here leaves the copies partly written: broken.
  absl::Status s = WriteParameter(*part, rounded);
  if (!s.ok()) return Broken(s);
  initialised_[part - layout_.parts.data()] = true;
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::WriteParameter(const PartLayout& part, absl::Span<const float> rounded) {
  for (const EntryRef& ref : part.entries) {
    const v1::BucketEntry& e = Entry(ref);
    MUONSHARD_RETURN_IF_ERROR(
        Params(ref).Write(e.offset(), rounded.subspan(e.element_begin() - part.element_begin, e.numel())));
  }
  // fp32 masters are views of the model copy just written: nothing more.
  const int part_index = static_cast<int>(&part - layout_.parts.data());
  for (int i : shards_of_part_[part_index]) {
    if (!shards_[i].master.owns_memory()) continue;
    const v1::BucketEntry& e = view_.muon_buckets(layout_.owned[i].bucket).entries(layout_.owned[i].entry);
    MUONSHARD_RETURN_IF_ERROR(
        shards_[i].master.Write(0, rounded.subspan(e.element_begin() - part.element_begin, e.numel())));
  }
  for (const auto& [b, k] : segments_of_part_[part_index]) {
    if (!adamw_[b].master.owns_memory()) continue;
    const internal::AdamwSegment& seg = layout_.adamw_buckets[b].segments[k];
    const v1::BucketEntry& e = view_.adamw_buckets(b).entries(seg.entry);
    // The segment's buffer range, clipped to the entry's real elements (the
    // padding after them keeps a zero master).
    const int64_t begin = layout_.adamw_buckets[b].shard_begin + seg.shard_offset;
    const int64_t end = std::min(begin + seg.numel, e.offset() + e.numel());
    if (end <= begin) continue;
    MUONSHARD_RETURN_IF_ERROR(adamw_[b].master.Write(
        begin - layout_.adamw_buckets[b].shard_begin,
        rounded.subspan(e.element_begin() + (begin - e.offset()) - part.element_begin, end - begin)));
  }
  // Host sources are consumed on return; the backend may still be copying
  // into device memory, which the next step orders after.
  return absl::OkStatus();
}

absl::StatusOr<ShardedOptimizer::PartStorage> ShardedOptimizer::HostPartStorage(int tensor) {
  const PartLayout* part = FindPart(tensor);
  if (part == nullptr) return absl::NotFoundError(absl::StrCat("rank ", rank(), " holds no part of tensor ", tensor));
  if (!host_memory()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor \"", Spec(*part).name(), "\": the optimizer's buffers are in device memory"));
  }
  if (part->entries.size() != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor \"", Spec(*part).name(), "\": its part spans ", part->entries.size(), " bucket entries"));
  }
  const EntryRef& ref = part->entries[0];
  const int64_t offset = Entry(ref).offset();
  BackendBuffer& params = Params(ref);
  BackendBuffer& grads = ref.muon ? muon_[ref.bucket].grads : adamw_[ref.bucket].grads;
  PartStorage out;
  out.params = params.At(offset);
  out.param_dtype = params.dtype();
  out.grads = grads.At(offset);
  out.grad_dtype = grads.dtype();
  out.numel = part->element_end - part->element_begin;
  return out;
}

absl::Status ShardedOptimizer::ReadModelCopy(int tensor, absl::Span<float> out) const {
  const PartLayout* part = FindPart(tensor);
  if (part == nullptr) return absl::NotFoundError(absl::StrCat("rank ", rank(), " holds no part of tensor ", tensor));
  if (static_cast<int64_t>(out.size()) != part->element_end - part->element_begin) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", Spec(*part).name(), "\": output holds ", out.size(),
                                                   " values for a part of ", part->element_end - part->element_begin));
  }
  for (const EntryRef& ref : part->entries) {
    const v1::BucketEntry& e = Entry(ref);
    MUONSHARD_RETURN_IF_ERROR(
        Params(ref).Read(e.offset(), out.subspan(e.element_begin() - part->element_begin, e.numel())));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ShardedOptimizer::ModelCopy(int tensor) const {
  const PartLayout* part = FindPart(tensor);
  if (part == nullptr) return absl::NotFoundError(absl::StrCat("rank ", rank(), " holds no part of tensor ", tensor));
  std::vector<float> out(part->element_end - part->element_begin);
  MUONSHARD_RETURN_IF_ERROR(ReadModelCopy(tensor, absl::MakeSpan(out)));
  return out;
}

absl::Status ShardedOptimizer::ForEachCommGroup(absl::FunctionRef<absl::Status(int group, Communicator& comm)> issue) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    Communicator* comm = groups_[g].comm.get();
    if (comm == nullptr) continue;
    MUONSHARD_RETURN_IF_ERROR(comm->GroupStart());
    absl::Status s = issue(static_cast<int>(g), *comm);
    // Close the group even after a failed op, so the communicator's group
    // state stays balanced; the first error wins.
    absl::Status end = comm->GroupEnd();
    MUONSHARD_RETURN_IF_ERROR(s);
    MUONSHARD_RETURN_IF_ERROR(end);
    MUONSHARD_RETURN_IF_ERROR(comm->Synchronize());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<int, std::vector<float>>> ShardedOptimizer::GatherMasters() {
  if (!broken_.ok()) return broken_;
  MUONSHARD_RETURN_IF_ERROR(CheckNoOpenStep());
  // fp32 copies of every bucket: the owners' Muon masters, then each AdamW
  // shard's masters gathered into the whole buffer.
  std::vector<BackendBuffer> muon(view_.muon_buckets_size());
  std::vector<BackendBuffer> adamw(view_.adamw_buckets_size());
  for (int b = 0; b < view_.muon_buckets_size(); ++b) {
    MUONSHARD_ASSIGN_OR_RETURN(muon[b], NewBuffer(v1::FP32, view_.muon_buckets(b).numel()));
  }
  for (size_t i = 0; i < layout_.owned.size(); ++i) {
    const v1::BucketEntry& e = view_.muon_buckets(layout_.owned[i].bucket).entries(layout_.owned[i].entry);
    MUONSHARD_RETURN_IF_ERROR(muon[layout_.owned[i].bucket].ConvertFrom(e.offset(), shards_[i].master, 0, e.numel()));
  }
  for (int b = 0; b < view_.adamw_buckets_size(); ++b) {
    MUONSHARD_ASSIGN_OR_RETURN(adamw[b], NewBuffer(v1::FP32, view_.adamw_buckets(b).numel()));
    if (groups_[layout_.adamw_buckets[b].group].comm == nullptr) {
      MUONSHARD_RETURN_IF_ERROR(adamw[b].ConvertFrom(0, adamw_[b].master, 0, adamw_[b].master.numel()));
    }
  }
  MUONSHARD_RETURN_IF_ERROR(backend_->Synchronize());
  MUONSHARD_RETURN_IF_ERROR(ForEachCommGroup([&](int g, Communicator& comm) -> absl::Status {
    for (int b : layout_.groups[g].muon_buckets) {
      MUONSHARD_RETURN_IF_ERROR(comm.Broadcast(muon[b].data(), muon[b].numel(), CommDType::kFloat32,
                                               layout_.muon_buckets[b].owner_group_rank));
    }
    for (int b : layout_.groups[g].adamw_buckets) {
      MUONSHARD_RETURN_IF_ERROR(comm.AllGather(adamw_[b].master.data(), adamw[b].data(),
                                               layout_.adamw_buckets[b].counts, CommDType::kFloat32));
    }
    return absl::OkStatus();
  }));
  std::map<int, std::vector<float>> out;
  for (const PartLayout& part : layout_.parts) {
    std::vector<float>& values = out[part.tensor];
    values.resize(part.element_end - part.element_begin);
    for (const EntryRef& ref : part.entries) {
      const v1::BucketEntry& e = Entry(ref);
      MUONSHARD_RETURN_IF_ERROR((ref.muon ? muon : adamw)[ref.bucket].Read(
          e.offset(), absl::MakeSpan(values).subspan(e.element_begin() - part.element_begin, e.numel())));
    }
  }
  return out;
}

namespace {

// The bytes `buffer` allocated (none for a view).
int64_t AllocatedBytes(const BackendBuffer& buffer) { return buffer.owns_memory() ? buffer.bytes() : 0; }

}  // namespace

int64_t ShardedOptimizer::optimizer_state_bytes() const {
  int64_t bytes = 0;
  for (const MuonShardState& s : shards_) bytes += AllocatedBytes(s.master) + s.momentum.bytes();
  for (const AdamwBucketState& s : adamw_) {
    bytes += AllocatedBytes(s.master) + s.moment1.bytes() + s.moment2.bytes();
  }
  return bytes;
}

int64_t ShardedOptimizer::model_copy_bytes() const {
  int64_t bytes = 0;
  for (const MuonBucketState& s : muon_) bytes += s.params.bytes();
  for (const AdamwBucketState& s : adamw_) bytes += s.params.bytes();
  return bytes;
}

int64_t ShardedOptimizer::gradient_buffer_bytes() const {
  int64_t bytes = 0;
  for (const MuonBucketState& s : muon_) bytes += s.grads.bytes();
  for (const AdamwBucketState& s : adamw_) bytes += s.grads.bytes() + s.shard_grads.bytes();
  return bytes;
}

absl::Status ShardedOptimizer::SetLearningRate(float lr) {
  MUONSHARD_RETURN_IF_ERROR(ValidateLearningRate(lr));
  config_.lr = lr;
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::Broken(absl::Status status) {
  if (in_step_ && pipeline_ != nullptr) {  // cancel the open step's lanes
    pipeline_->Fail(status);
    (void)pipeline_->Finish();
  }
  in_step_ = false;
  broken_ = absl::FailedPreconditionError(
      absl::StrCat("rank ", rank(), ": optimizer is broken by a failed step: ", status.message()));
  return status;
}

}  // namespace muonshard::worker
