#include "worker/workload/synthetic_workload.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/workload/internal/counter_rng.h"

namespace muonshard::worker {
namespace {

// Stream tags, so init and gradient streams of one tensor never coincide.
constexpr uint64_t kInitStream = 0x696e6974;  // "init"
constexpr uint64_t kGradStream = 0x67726164;  // "grad"

}  // namespace

absl::Status SyntheticWorkload::InitialValues(const v1::PlannedTensor& tensor, int64_t element_begin,
                                              absl::Span<float> out) const {
  MUONSHARD_RETURN_IF_ERROR(CheckPartRange(tensor, element_begin, static_cast<int64_t>(out.size())));
  const uint64_t key = internal::MakeKey({options_.seed, internal::HashName(tensor.name()), kInitStream});
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = options_.init_scale * internal::UniformSigned(key, element_begin + i);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> SyntheticWorkload::Gradient(const v1::PlannedTensor& tensor, int64_t element_begin,
                                                   absl::Span<const float> params, int64_t step, int rank,
                                                   absl::Span<float> grad) const {
  MUONSHARD_RETURN_IF_ERROR(CheckPartRange(tensor, element_begin, static_cast<int64_t>(grad.size())));
  if (params.size() != grad.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", tensor.name(), "\": ", params.size(),
                                                   " parameters for ", grad.size(), " gradient values"));
  }
  const uint64_t key = internal::MakeKey({options_.seed, internal::HashName(tensor.name()), kGradStream,
                                          static_cast<uint64_t>(step), static_cast<uint64_t>(rank)});
  for (size_t i = 0; i < grad.size(); ++i) {
    grad[i] = options_.grad_scale * internal::UniformSigned(key, element_begin + i);
  }
  return 0.0;
}

}  // namespace muonshard::worker
