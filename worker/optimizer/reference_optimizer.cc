#include "worker/optimizer/reference_optimizer.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/blocked_newton_schulz.h"
#include "plan/model.h"
#include "plan/plan_validator.h"
#include "worker/optimizer/internal/ns_block_spec.h"

namespace muonshard::worker {

using internal::TypedBuffer;

ReferenceOptimizer::ReferenceOptimizer(const v1::Plan& plan, kernels::KernelBackend* backend,
                                       const OptimizerConfig& config)
    : backend_(backend), config_(config) {
  *plan_.mutable_topology() = plan.topology();
  *plan_.mutable_policy() = plan.policy();
  *plan_.mutable_tensors() = plan.tensors();
  *plan_.mutable_groups() = plan.groups();
}

absl::StatusOr<std::unique_ptr<ReferenceOptimizer>> ReferenceOptimizer::Create(const v1::Plan& plan,
                                                                               kernels::KernelBackend* backend,
                                                                               const OptimizerConfig& config) {
  if (backend == nullptr) return absl::InvalidArgumentError("ReferenceOptimizer: null kernel backend");
  if (backend->device_kind() != kernels::DeviceKind::kCpu) {
    return absl::FailedPreconditionError("ReferenceOptimizer keeps its tensors in host memory: use the cpu backend");
  }
  MUONSHARD_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  MUONSHARD_RETURN_IF_ERROR(planner::ValidatePlan(plan));
  auto optimizer = absl::WrapUnique(new ReferenceOptimizer(plan, backend, config));
  MUONSHARD_RETURN_IF_ERROR(optimizer->Init());
  return optimizer;
}

absl::Status ReferenceOptimizer::Init() {
  grad_dtype_ = planner::GradDType(plan_.policy());
  if (planner::DTypeSize(grad_dtype_) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("plan: unknown policy.grad_dtype ", grad_dtype_));
  }
  beta1_pow_ = config_.adamw_beta1;
  beta2_pow_ = config_.adamw_beta2;
  held_.resize(plan_.topology().world_size());
  for (int i = 0; i < plan_.tensors_size(); ++i) {
    const v1::PlannedTensor& t = plan_.tensors(i);
    if (t.has_ns_blocks()) {
      const int n = t.shape_size();
      absl::StatusOr<kernels::NsBlockSpec> blocks =
          internal::NsBlockSpecOf(t.ns_blocks(), t.shape(n - 2), t.shape(n - 1));
      if (!blocks.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name(), "\": ", blocks.status().message()));
      }
      blocks_[i] = *std::move(blocks);
    }
    TensorState s;
    MUONSHARD_ASSIGN_OR_RETURN(s.model, TypedBuffer::Create(t.dtype(), t.numel()));
    s.master.assign(t.numel(), 0.0f);
    if (t.optimizer() == v1::MUON) {
      s.momentum.assign(t.numel(), 0.0f);
    } else {
      s.moment1.assign(t.numel(), 0.0f);
      s.moment2.assign(t.numel(), 0.0f);
    }
    s.with_decay = WithDecay(config_, t.name());
    tensors_.push_back(std::move(s));
    for (const v1::TensorPart& p : t.parts()) {
      for (int r : plan_.groups(p.group()).ranks()) {
        held_[r].push_back(HeldTensor{i, &plan_.tensors(i), p.group(), p.element_begin(), p.element_end()});
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ReferenceOptimizer::SetParameter(int tensor, absl::Span<const float> values) {
  if (tensor < 0 || tensor >= num_tensors()) return absl::NotFoundError(absl::StrCat("no tensor ", tensor));
  TensorState& s = tensors_[tensor];
  if (static_cast<int64_t>(values.size()) != s.model.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", plan_.tensors(tensor).name(), "\": got ", values.size(),
                                                   " values for ", s.model.numel()));
  }
  s.model.Write(0, values);
  s.model.Read(0, absl::MakeSpan(s.master));
  return absl::OkStatus();
}

absl::Status ReferenceOptimizer::MeanGradient(int tensor, absl::Span<GradientSource* const> per_rank,
                                              std::vector<float>& mean) const {
  const v1::PlannedTensor& t = plan_.tensors(tensor);
  mean.assign(t.numel(), 0.0f);
  for (const v1::TensorPart& p : t.parts()) {
    const v1::CommGroup& g = plan_.groups(p.group());
    const int64_t n = p.element_end() - p.element_begin();
    float* acc = mean.data() + p.element_begin();
    for (int i = 0; i < g.ranks_size(); ++i) {
      GradientSource* source = per_rank[g.ranks(i)];
      if (source == nullptr) return absl::InvalidArgumentError(absl::StrCat("no gradients for rank ", g.ranks(i)));
      MUONSHARD_ASSIGN_OR_RETURN(absl::Span<const float> grad, source->PartGradient(tensor));
      if (static_cast<int64_t>(grad.size()) != n) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", g.ranks(i), ", tensor \"", t.name(),
                                                       "\": gradient has ", grad.size(), " values for a part of ", n));
      }
      // As the communicators: each rank's buffer holds grad_dtype values,
      // accumulated in fp32 in group rank order.
      for (int64_t k = 0; k < n; ++k) {
        const float x = internal::RoundToDType(grad[k], grad_dtype_);
        acc[k] = i == 0 ? x : acc[k] + x;
      }
    }
    const float size = static_cast<float>(g.ranks_size());
    for (int64_t k = 0; k < n; ++k) acc[k] = internal::RoundToDType(acc[k] / size, grad_dtype_);
  }
  return absl::OkStatus();
}

absl::Status ReferenceOptimizer::Update(int tensor, const std::vector<float>& grad) {
  const v1::PlannedTensor& t = plan_.tensors(tensor);
  TensorState& s = tensors_[tensor];
  const bool bf16 = t.dtype() == v1::BF16;
  if (t.optimizer() == v1::MUON) {
    const int n = t.shape_size();
    const kernels::MatrixBatchShape shape{n == 3 ? t.shape(0) : 1, t.shape(n - 2), t.shape(n - 1)};
    kernels::MuonTensors m{grad.data(), s.momentum.data(), s.master.data(), bf16 ? s.model.words() : nullptr};
    const kernels::MuonOptions options = MuonOptionsFor(config_, s.with_decay);
    auto blocks = blocks_.find(tensor);
    if (blocks != blocks_.end()) {  // per-block Newton-Schulz, in the whole tensor's coordinates
      MUONSHARD_RETURN_IF_ERROR(
          kernels::BlockedMuonUpdate(*backend_, m, shape, KernelLayout(t.layout()), blocks->second, options));
    } else {
      MUONSHARD_RETURN_IF_ERROR(backend_->MuonUpdate(m, shape, KernelLayout(t.layout()), options));
    }
  } else {
    kernels::AdamWTensors a{grad.data(), s.master.data(), s.moment1.data(), s.moment2.data(),
                            bf16 ? s.model.words() : nullptr};
    MUONSHARD_RETURN_IF_ERROR(backend_->AdamW(a, t.numel(), kernels::AdamWBetaPows{&beta1_pow_, &beta2_pow_},
                                              AdamWOptionsFor(config_, s.with_decay)));
  }
  if (!bf16) s.model.Write(0, s.master);
  return absl::OkStatus();
}

absl::Status ReferenceOptimizer::Step(absl::Span<GradientSource* const> per_rank) {
  if (static_cast<int>(per_rank.size()) != world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("got gradients of ", per_rank.size(), " ranks for a world of ", world_size()));
  }
  // Every mean first, so a bad gradient leaves the state untouched.
  std::vector<std::vector<float>> means(tensors_.size());
  for (int i = 0; i < num_tensors(); ++i) MUONSHARD_RETURN_IF_ERROR(MeanGradient(i, per_rank, means[i]));
  for (int i = 0; i < num_tensors(); ++i) MUONSHARD_RETURN_IF_ERROR(Update(i, means[i]));
  kernels::AdamWOptions advance = AdamWOptionsFor(config_, true);
  advance.advance_beta_pows = true;
  kernels::AdvanceBetaPows(kernels::AdamWBetaPows{&beta1_pow_, &beta2_pow_}, advance);
  ++steps_;
  return backend_->Synchronize();
}

absl::Status ReferenceOptimizer::ReadModelCopy(int tensor, int64_t begin, absl::Span<float> out) const {
  if (tensor < 0 || tensor >= num_tensors()) return absl::NotFoundError(absl::StrCat("no tensor ", tensor));
  const TypedBuffer& model = tensors_[tensor].model;
  if (begin < 0 || begin + static_cast<int64_t>(out.size()) > model.numel()) {
    return absl::OutOfRangeError(absl::StrCat("elements [", begin, ", ", begin + out.size(), ") of tensor \"",
                                              plan_.tensors(tensor).name(), "\" (", model.numel(), ")"));
  }
  model.Read(begin, out);
  return absl::OkStatus();
}

absl::Status ReferenceOptimizer::SetLearningRate(float lr) {
  MUONSHARD_RETURN_IF_ERROR(ValidateLearningRate(lr));
  config_.lr = lr;
  return absl::OkStatus();
}

int64_t ReferenceOptimizer::optimizer_state_bytes() const {
  int64_t bytes = 0;
  for (const TensorState& s : tensors_) {
    bytes += (s.master.size() + s.momentum.size() + s.moment1.size() + s.moment2.size()) * sizeof(float);
  }
  return bytes;
}

}  // namespace muonshard::worker
