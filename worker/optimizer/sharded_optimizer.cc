// ShardedOptimizer: the facade. It creates the parts (see "Structure" in the
// header), keeps the optimizer's usable/broken state and routes each call
// to the part that does it.

#include "worker/optimizer/sharded_optimizer.h"

#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optimizer/internal/typed_buffer.h"

namespace muonshard::worker {

using internal::BackendBuffer;
using internal::EntryRef;
using internal::PartLayout;

absl::StatusOr<std::unique_ptr<ShardedOptimizer>> ShardedOptimizer::Create(const v1::RankView& view,
                                                                           const CommGroups& comms,
                                                                           kernels::KernelBackend* backend,
                                                                           const OptimizerConfig& config,
                                                                           const StepOptions& step) {
  if (backend == nullptr) return absl::InvalidArgumentError("ShardedOptimizer: null kernel backend");
  MUONSHARD_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  auto o = absl::WrapUnique(new ShardedOptimizer(backend));
  MUONSHARD_ASSIGN_OR_RETURN(o->layout_, internal::OptimizerLayout::Create(view, step.muon_piece_bytes));
  MUONSHARD_ASSIGN_OR_RETURN(o->comms_, internal::GroupComms::Create(*o->layout_, comms));
  MUONSHARD_ASSIGN_OR_RETURN(o->params_, internal::ParameterBuffers::Create(*o->layout_, *backend, config));
  MUONSHARD_ASSIGN_OR_RETURN(o->grads_, internal::GradientBuffers::Create(*o->layout_, *backend));
  MUONSHARD_ASSIGN_OR_RETURN(
      o->tp_, internal::TpMuonExchange::Create(*o->layout_, *backend, *o->params_, *o->grads_, *o->comms_));
  MUONSHARD_ASSIGN_OR_RETURN(
      o->updater_, internal::BucketUpdater::Create(*o->layout_, *backend, config, *o->params_, *o->grads_, *o->tp_));
  o->state_io_ = std::make_unique<internal::OptimizerStateIo>(*o->layout_, *backend, *o->params_, *o->comms_);
  const internal::StepParts parts{o->layout_.get(), backend,           o->comms_.get(), o->params_.get(),
                                  o->grads_.get(),  o->updater_.get(), o->tp_.get()};
  MUONSHARD_ASSIGN_OR_RETURN(o->scheduler_, internal::StepScheduler::Create(parts, step));
  o->initialised_.assign(o->layout_->held().size(), false);
  return o;
}

// The scheduler cancels a step left open before the parts its lanes use go.
ShardedOptimizer::~ShardedOptimizer() = default;

absl::Status ShardedOptimizer::SetParameter(int tensor, absl::Span<const float> values) {
  if (!broken_.ok()) return broken_;
  MUONSHARD_RETURN_IF_ERROR(scheduler_->CheckNoOpenStep());
  MUONSHARD_ASSIGN_OR_RETURN(const PartLayout* part, layout_->HeldPart(tensor));
  const int64_t numel = part->element_end - part->element_begin;
  const v1::PlannedTensor& spec = layout_->Spec(*part);
  if (static_cast<int64_t>(values.size()) != numel) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", spec.name(), "\": got ", values.size(), " values for a part of ", numel));
  }
  std::vector<float> rounded(values.begin(), values.end());
  for (float& v : rounded) v = internal::RoundToDType(v, spec.dtype());
  // A device error here leaves the copies partly written: broken.
  absl::Status s = params_->WriteParameter(*part, rounded);
  if (!s.ok()) return Broken(s);
  initialised_[layout_->PartIndex(*part)] = true;
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::CheckUsable() const {
  if (!broken_.ok()) return broken_;
  MUONSHARD_RETURN_IF_ERROR(scheduler_->CheckNoOpenStep());
  for (size_t p = 0; p < initialised_.size(); ++p) {
    if (!initialised_[p]) {
      return absl::FailedPreconditionError(absl::StrCat("rank ", rank(), ": tensor \"", held_tensors()[p].spec->name(),
                                                        "\" was never set (SetParameter)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> ShardedOptimizer::Step(GradientSource& grads) {
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  const std::vector<PartLayout>& parts = layout_->index().parts;
  // Every gradient is fetched and checked before any is handed over, so a
  // bad one changes nothing.
  std::vector<absl::Span<const float>> spans(parts.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    MUONSHARD_ASSIGN_OR_RETURN(spans[p], grads.PartGradient(parts[p].tensor));
    MUONSHARD_RETURN_IF_ERROR(grads_->CheckSize(parts[p], static_cast<int64_t>(spans[p].size()), true));
  }
  return HandOverAll([&](size_t p) { return GradReady(parts[p].tensor, spans[p]); });
}

absl::StatusOr<StepStats> ShardedOptimizer::Step(BackendGradientSource& grads) {
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  const std::vector<PartLayout>& parts = layout_->index().parts;
  std::vector<BackendGradient> all(parts.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    MUONSHARD_ASSIGN_OR_RETURN(all[p], grads.PartGradient(parts[p].tensor));
    MUONSHARD_RETURN_IF_ERROR(grads_->CheckSize(parts[p], all[p].numel, all[p].data != nullptr));
  }
  return HandOverAll([&](size_t p) { return GradReady(parts[p].tensor, all[p]); });
}

absl::StatusOr<StepStats> ShardedOptimizer::HandOverAll(absl::FunctionRef<absl::Status(size_t part)> hand_over) {
  MUONSHARD_RETURN_IF_ERROR(BeginStep());
  // Last tensors first: the hand-off order of NOTE [Pipelined step].
  for (size_t p = layout_->index().parts.size(); p-- > 0;) {
    absl::Status s = hand_over(p);
    if (!s.ok()) return Broken(s);  // checked above: a device error
  }
  return FinishStep();
}

absl::Status ShardedOptimizer::BeginStep() {
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  absl::Status s = scheduler_->Begin();
  if (!s.ok()) return Broken(s);
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::GradReady(int tensor, absl::Span<const float> grad) {
  return HandOver(tensor, static_cast<int64_t>(grad.size()), true,
                  [&](const PartLayout& part) { return grads_->Pack(part, grad); });
}

absl::Status ShardedOptimizer::GradReady(int tensor, const BackendGradient& grad) {
  return HandOver(tensor, grad.numel, grad.data != nullptr,
                  [&](const PartLayout& part) { return grads_->PackBackend(part, grad); });
}

absl::Status ShardedOptimizer::HandOver(int tensor, int64_t numel, bool non_null,
                                        absl::FunctionRef<absl::Status(const PartLayout& part)> pack) {
  if (!broken_.ok()) return broken_;
  MUONSHARD_RETURN_IF_ERROR(scheduler_->CheckOpen());
  MUONSHARD_ASSIGN_OR_RETURN(const PartLayout* part, layout_->HeldPart(tensor));
  MUONSHARD_RETURN_IF_ERROR(scheduler_->CheckNotHanded(*part));
  MUONSHARD_RETURN_IF_ERROR(grads_->CheckSize(*part, numel, non_null));
  absl::Status s = pack(*part);
  if (!s.ok()) return Broken(s);
  scheduler_->HandedOver(*part);
  return absl::OkStatus();
}

absl::StatusOr<StepStats> ShardedOptimizer::FinishStep() {
  if (!broken_.ok()) return broken_;
  MUONSHARD_RETURN_IF_ERROR(scheduler_->CheckOpen());
  absl::Status missing = scheduler_->CheckAllHandedOver();
  // Sequential: nothing was sent yet, the step stays open.
  if (!missing.ok()) return pipelined() ? Broken(missing) : missing;
  absl::StatusOr<StepStats> stats = scheduler_->Finish();
  if (!stats.ok()) return Broken(stats.status());
  ++steps_;
  return stats;
}

absl::StatusOr<ShardedOptimizer::PartStorage> ShardedOptimizer::BackendPartStorage(int tensor) {
  MUONSHARD_ASSIGN_OR_RETURN(const PartLayout* part, layout_->HeldPart(tensor));
  if (part->entries.size() != 1) {
    return absl::FailedPreconditionError(absl::StrCat("tensor \"", layout_->Spec(*part).name(), "\": its part spans ",
                                                      part->entries.size(), " bucket entries"));
  }
  const EntryRef& ref = part->entries[0];
  const int64_t offset = layout_->Entry(ref).offset();
  BackendBuffer& params = params_->Params(ref);
  BackendBuffer& grads = grads_->Bucket(ref);
  PartStorage out;
  out.params = params.At(offset);
  out.param_dtype = params.dtype();
  out.grads = grads.At(offset);
  out.grad_dtype = grads.dtype();
  out.numel = part->element_end - part->element_begin;
  return out;
}

absl::Status ShardedOptimizer::ReadModelCopy(int tensor, absl::Span<float> out) const {
  MUONSHARD_ASSIGN_OR_RETURN(const PartLayout* part, layout_->HeldPart(tensor));
  return params_->ReadModelCopy(*part, out);
}

absl::Status ShardedOptimizer::CopyModelCopiesTo(absl::Span<const ModelCopyTarget> targets) {
  for (const ModelCopyTarget& t : targets) {
    MUONSHARD_ASSIGN_OR_RETURN(const PartLayout* part, layout_->HeldPart(t.tensor));
    MUONSHARD_RETURN_IF_ERROR(params_->CopyModelCopyTo(*part, t.data, t.type, t.numel));
  }
  return backend_->Synchronize();
}

absl::StatusOr<std::vector<float>> ShardedOptimizer::ModelCopy(int tensor) const {
  MUONSHARD_ASSIGN_OR_RETURN(const PartLayout* part, layout_->HeldPart(tensor));
  std::vector<float> out(part->element_end - part->element_begin);
  MUONSHARD_RETURN_IF_ERROR(params_->ReadModelCopy(*part, absl::MakeSpan(out)));
  return out;
}

absl::StatusOr<std::map<int, std::vector<float>>> ShardedOptimizer::GatherMasters() {
  if (!broken_.ok()) return broken_;
  MUONSHARD_RETURN_IF_ERROR(scheduler_->CheckNoOpenStep());
  return state_io_->GatherMasters();
}

int64_t ShardedOptimizer::optimizer_state_bytes() const { return params_->optimizer_state_bytes(); }

int64_t ShardedOptimizer::model_copy_bytes() const { return params_->model_copy_bytes(); }

int64_t ShardedOptimizer::gradient_buffer_bytes() const { return grads_->bytes(); }

absl::StatusOr<std::vector<checkpoint::StateShard>> ShardedOptimizer::StateShards() { return state_io_->StateShards(); }

checkpoint::Scalars ShardedOptimizer::scalars() const {
  checkpoint::Scalars s;
  s.step = steps_;
  s.beta1_pow = updater_->beta1_pow();
  s.beta2_pow = updater_->beta2_pow();
  return s;
}

absl::Status ShardedOptimizer::RestoreFromState(const checkpoint::Scalars& scalars) {
  if (!broken_.ok()) return broken_;  // parameters need not be set: this sets them
  MUONSHARD_RETURN_IF_ERROR(scheduler_->CheckNoOpenStep());
  steps_ = scalars.step;
  updater_->SetBetaPows(scalars.beta1_pow, scalars.beta2_pow);
  absl::Status s = state_io_->UploadMirrors();
  if (s.ok()) s = scheduler_->SyncFromMasters();
  if (!s.ok()) return Broken(s);
  initialised_.assign(initialised_.size(), true);
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::SyncModelCopies() {
  MUONSHARD_RETURN_IF_ERROR(CheckUsable());
  state_io_->DropMirrors();  // nothing to upload: the state stays as it is
  absl::Status s = scheduler_->SyncFromMasters();
  if (!s.ok()) return Broken(s);
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::SetLearningRate(float lr) { return updater_->SetLearningRate(lr); }

absl::Status ShardedOptimizer::Broken(absl::Status status) {
  scheduler_->Cancel(status);  // an open step's lanes
  broken_ = absl::FailedPreconditionError(
      absl::StrCat("rank ", rank(), ": optimizer is broken by a failed step: ", status.message()));
  return status;
}

}  // namespace muonshard::worker
