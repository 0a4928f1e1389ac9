#ifndef MUONSHARD_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
#define MUONSHARD_TESTS_KERNELS_KERNEL_TEST_UTIL_H_

// Deterministic inputs and error measures shared by the kernel tests.

#include <cstdint>
#include <vector>

namespace muonshard::kernels::testing {

// n samples of N(0, scale²) from a fixed seed.
std::vector<float> RandomNormal(int64_t n, uint32_t seed, float scale = 1.0f);

// ‖a - b‖_F / ‖b‖_F over the whole vectors (b is the reference).
double RelativeError(const std::vector<float>& a, const std::vector<float>& b);

// max_i |a_i - b_i|.
double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b);

// For a rows x cols row-major matrix with m = min(rows, cols): the largest
// |(Q·Qᵀ - I)_ij| for wide Q, or of Qᵀ·Q - I for tall Q (double precision).
double OrthogonalityError(const float* q, int64_t rows, int64_t cols);

// The singular values of the row-major matrix, via the eigenvalues of the
// smaller Gram matrix (Jacobi, double precision; for small test matrices).
std::vector<double> SingularValues(const float* q, int64_t rows, int64_t cols);

}  // namespace muonshard::kernels::testing

#endif  // MUONSHARD_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
