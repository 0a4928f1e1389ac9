#include "worker/workload/regression_workload.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/workload/internal/counter_rng.h"

namespace muonshard::worker {
namespace {

constexpr uint64_t kInitStream = 0x696e6974;     // "init"
constexpr uint64_t kTeacherStream = 0x74656163;  // "teac"
constexpr uint64_t kInputStream = 0x696e7075;    // "inpu"

}  // namespace

absl::Status RegressionWorkload::InitialValues(const v1::PlannedTensor& tensor, int64_t element_begin,
                                               absl::Span<float> out) const {
  MUONSHARD_RETURN_IF_ERROR(CheckPartRange(tensor, element_begin, static_cast<int64_t>(out.size())));
  const uint64_t key = internal::MakeKey({options_.seed, internal::HashName(tensor.name()), kInitStream});
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = options_.init_scale * internal::UniformSigned(key, element_begin + i);
  }
  return absl::OkStatus();
}

double RegressionWorkload::MatrixGradient(const v1::PlannedTensor& tensor, int64_t matrix, int64_t rows, int64_t cols,
                                          const float* params, int64_t step, int rank, float* grad) const {
  const uint64_t name = internal::HashName(tensor.name());
  const uint64_t teacher = internal::MakeKey({options_.seed, name, kTeacherStream, static_cast<uint64_t>(matrix)});
  const uint64_t input = internal::MakeKey({options_.seed, name, kInputStream, static_cast<uint64_t>(step),
                                            static_cast<uint64_t>(rank), static_cast<uint64_t>(matrix)});
  const int batch = options_.batch;
  // D = W - W*, X (cols x B stored as B rows of cols), R = D X (rows x B).
  std::vector<double> diff(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    diff[i] = double{params[i]} - double{options_.teacher_scale * internal::UniformSigned(teacher, i)};
  }
  std::vector<double> x(batch * cols);
  for (int64_t i = 0; i < batch * cols; ++i) x[i] = internal::UniformSigned(input, i);
  std::vector<double> residual(rows * batch, 0.0);
  double loss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int b = 0; b < batch; ++b) {
      double sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += diff[r * cols + c] * x[b * cols + c];
      residual[r * batch + b] = sum;
      loss += sum * sum;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      double sum = 0;
      for (int b = 0; b < batch; ++b) sum += residual[r * batch + b] * x[b * cols + c];
      grad[r * cols + c] = static_cast<float>(sum / batch);
    }
  }
  return 0.5 * loss / batch;
}

double RegressionWorkload::VectorGradient(const v1::PlannedTensor& tensor, int64_t element_begin,
                                          absl::Span<const float> params, int64_t step, int rank,
                                          absl::Span<float> grad) const {
  const uint64_t name = internal::HashName(tensor.name());
  const uint64_t target = internal::MakeKey({options_.seed, name, kTeacherStream, 0});
  const uint64_t input = internal::MakeKey(
      {options_.seed, name, kInputStream, static_cast<uint64_t>(step), static_cast<uint64_t>(rank), 0});
  const int batch = options_.batch;
  const uint64_t n = static_cast<uint64_t>(tensor.numel());
  double loss = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const uint64_t element = element_begin + i;
    const double d = double{params[i]} - double{options_.teacher_scale * internal::UniformSigned(target, element)};
    double weight = 0;
    for (int b = 0; b < batch; ++b) {
      const double a = internal::UniformSigned(input, b * n + element);
      weight += a * a;
    }
    loss += d * d * weight;
    grad[i] = static_cast<float>(d * weight / batch);
  }
  return 0.5 * loss / batch;
}

absl::StatusOr<double> RegressionWorkload::Gradient(const v1::PlannedTensor& tensor, int64_t element_begin,
                                                    absl::Span<const float> params, int64_t step, int rank,
                                                    absl::Span<float> grad) const {
  const int64_t n = static_cast<int64_t>(grad.size());
  MUONSHARD_RETURN_IF_ERROR(CheckPartRange(tensor, element_begin, n));
  if (static_cast<int64_t>(params.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", tensor.name(), "\": ", params.size(), " parameters for ", n, " gradient values"));
  }
  if (options_.batch < 1) return absl::InvalidArgumentError("regression workload: batch must be >= 1");
  const int dims = tensor.shape_size();
  if (dims < 2) return VectorGradient(tensor, element_begin, params, step, rank, grad);
  const int64_t rows = tensor.shape(dims - 2);
  const int64_t cols = tensor.shape(dims - 1);
  const int64_t matrix = rows * cols;
  if (element_begin % matrix != 0 || n % matrix != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", tensor.name(), "\": elements [", element_begin, ", ",
                                                   element_begin + n, ") are not whole ", rows, "x", cols,
                                                   " matrices"));
  }
  double loss = 0;
  for (int64_t m = 0; m < n / matrix; ++m) {
    loss += MatrixGradient(tensor, element_begin / matrix + m, rows, cols, params.data() + m * matrix, step, rank,
                           grad.data() + m * matrix);
  }
  return loss;
}

}  // namespace muonshard::worker
