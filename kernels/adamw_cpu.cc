// CPU AdamW: one pass over the slice, split across cores for large slices.

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/adamw.h"
#include "kernels/bf16.h"
#include "kernels/internal/adamw_scalars.h"
#include "kernels/internal/elementwise_math.h"
#include "kernels/internal/parallel_for.h"

namespace muonshard::kernels {
namespace {

// Slices below this many elements are not worth a thread start.
constexpr int64_t kMinElementsPerThread = int64_t{1} << 18;

}  // namespace

absl::Status AdamWCpu(const AdamWTensors& tensors, int64_t n, const AdamWBetaPows& pows, const AdamWOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateAdamWArgs(tensors, n, pows, options));
  const internal::AdamWScalars scalars = internal::MakeAdamWScalars(options, *pows.beta1_pow, *pows.beta2_pow);
  const int threads = static_cast<int>(std::min<int64_t>(internal::DefaultCpuThreads(), n / kMinElementsPerThread + 1));
  internal::ParallelForRange(n, threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float p = tensors.master[i];
      internal::AdamWElement(tensors.grad[i], p, tensors.moment1[i], tensors.moment2[i], scalars);
      tensors.master[i] = p;
      if (tensors.model != nullptr) tensors.model[i] = FloatToBf16(p);
    }
  });
  AdvanceBetaPows(pows, options);
  return absl::OkStatus();
}

}  // namespace muonshard::kernels
