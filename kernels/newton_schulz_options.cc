// Coefficient schedules, option and shape validation shared by every backend.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {
namespace {

// Tables from docs/reference/paddle_internals.md §3.3 (Paddle optimizer/muon.py, NEW).
std::vector<NsCoefficients> DeepseekV4Schedule() {
  std::vector<NsCoefficients> schedule(8, {3.4445f, -4.7750f, 2.0315f});
  schedule.insert(schedule.end(), 2, {2.0f, -1.5f, 0.5f});
  return schedule;
}

bool IsFinite(const NsCoefficients& k) { return std::isfinite(k.a) && std::isfinite(k.b) && std::isfinite(k.c); }

}  // namespace

absl::Status ValidateMatrixBatchShape(const MatrixBatchShape& shape) {
  if (shape.batch < 1 || shape.rows < 1 || shape.cols < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("matrix batch shape [", shape.batch, ", ", shape.rows, ", ", shape.cols, "] has a dimension < 1"));
  }
  constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
  if (shape.rows > kMaxDim || shape.cols > kMaxDim || shape.batch > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat("matrix batch shape [", shape.batch, ", ", shape.rows, ", ",
                                                   shape.cols, "] has a dimension above 2^31-1"));
  }
  // rows·cols < 2^62 cannot overflow; the batch factor is checked by
  // division so the full product is never formed unchecked.
  constexpr int64_t kMaxElements = int64_t{1} << 48;
  const int64_t per_matrix = shape.rows * shape.cols;
  if (per_matrix > kMaxElements || shape.batch > kMaxElements / per_matrix) {
    return absl::InvalidArgumentError(absl::StrCat("matrix batch shape [", shape.batch, ", ", shape.rows, ", ",
                                                   shape.cols, "] has more than 2^48 elements"));
  }
  return absl::OkStatus();
}

const std::vector<NsCoefficients>& BuiltinNsCoefficients(NsCoefficientSet set) {
  static const auto* simple = new std::vector<NsCoefficients>{{3.4445f, -4.7750f, 2.0315f}};
  static const auto* quintic = new std::vector<NsCoefficients>{{4.0848f, -6.8946f, 2.9270f},
                                                               {3.9505f, -6.3029f, 2.6377f},
                                                               {3.7418f, -5.5913f, 2.3037f},
                                                               {2.8769f, -3.1427f, 1.2046f},
                                                               {2.8366f, -3.0525f, 1.2012f}};
  static const auto* polar_express = new std::vector<NsCoefficients>{
      {8.2051f, -22.9019f, 16.4607f}, {4.0664f, -2.8612f, 0.5184f}, {3.9096f, -2.8234f, 0.5250f},
      {3.2856f, -2.4153f, 0.4853f},   {2.2779f, -1.6198f, 0.3985f}, {1.8726f, -1.2307f, 0.3585f},
      {1.8564f, -1.2132f, 0.3568f},   {1.8750f, -1.2500f, 0.3750f}};
  static const auto* aol = new std::vector<NsCoefficients>{{4.0098f, -7.0585f, 2.4635f},
                                                           {3.4585f, -5.5479f, 2.5959f},
                                                           {2.7573f, -3.2939f, 1.4254f},
                                                           {2.7215f, -3.0494f, 1.3169f}};
  static const auto* deepseek_v4 = new std::vector<NsCoefficients>(DeepseekV4Schedule());
  switch (set) {
    case NsCoefficientSet::kQuintic:
      return *quintic;
    case NsCoefficientSet::kPolarExpress:
      return *polar_express;
    case NsCoefficientSet::kAol:
      return *aol;
    case NsCoefficientSet::kDeepseekV4:
      return *deepseek_v4;
    case NsCoefficientSet::kSimple:
    case NsCoefficientSet::kCustom:
      break;
  }
  return *simple;
}

absl::StatusOr<std::vector<NsCoefficients>> ResolveNsCoefficients(const NewtonSchulzOptions& options) {
  if (options.steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Newton-Schulz steps must be >= 0, got ", options.steps));
  }
  if (!(options.eps > 0.0f) || !std::isfinite(options.eps)) {
    return absl::InvalidArgumentError(absl::StrCat("Newton-Schulz eps must be positive and finite, got ", options.eps));
  }
  const bool custom = options.coefficient_set == NsCoefficientSet::kCustom;
  if (custom != !options.custom_coefficients.empty()) {
    return absl::InvalidArgumentError(custom ? "coefficient set kCustom needs custom_coefficients"
                                             : "custom_coefficients given but the coefficient set is not "
                                               "kCustom");
  }
  std::vector<NsCoefficients> schedule =
      custom ? options.custom_coefficients : BuiltinNsCoefficients(options.coefficient_set);
  if (!std::all_of(schedule.begin(), schedule.end(), IsFinite)) {
    return absl::InvalidArgumentError("Newton-Schulz coefficients must be finite");
  }
  return schedule;
}

double NewtonSchulzFlops(const MatrixBatchShape& shape, int steps) {
  const double m = static_cast<double>(std::min(shape.rows, shape.cols));
  const double n = static_cast<double>(std::max(shape.rows, shape.cols));
  return static_cast<double>(shape.batch) * steps * (4.0 * m * m * n + 2.0 * m * m * m);
}

int64_t NsShardGramSide(const MatrixBatchShape& shard_shape, NsShardSplit split) {
  return split == NsShardSplit::kCols ? shard_shape.rows : shard_shape.cols;
}

double NsShardFlops(const MatrixBatchShape& shard_shape, NsShardSplit split, int steps) {
  const double m = static_cast<double>(NsShardGramSide(shard_shape, split));
  const double n = static_cast<double>(split == NsShardSplit::kCols ? shard_shape.cols : shard_shape.rows);
  return static_cast<double>(shard_shape.batch) * steps * (4.0 * m * m * n + 2.0 * m * m * m);
}

}  // namespace muonshard::kernels
