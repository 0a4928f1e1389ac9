#include "tests/kernels/kernel_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace muonshard::kernels::testing {
namespace {

// G = Q·Qᵀ (wide) or Qᵀ·Q (tall), m x m, in double.
std::vector<double> SmallGram(const float* q, int64_t rows, int64_t cols) {
  const bool tall = rows > cols;
  const int64_t m = std::min(rows, cols);
  const int64_t n = std::max(rows, cols);
  auto at = [&](int64_t i, int64_t k) { return static_cast<double>(tall ? q[k * cols + i] : q[i * cols + k]); };
  std::vector<double> gram(m * m);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < n; ++k) sum += at(i, k) * at(j, k);
      gram[i * m + j] = sum;
    }
  }
  return gram;
}

// Eigenvalues of a symmetric m x m matrix by cyclic Jacobi rotations.
std::vector<double> SymmetricEigenvalues(std::vector<double> a, int64_t m) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t p = 0; p < m; ++p) {
      for (int64_t q = p + 1; q < m; ++q) off += a[p * m + q] * a[p * m + q];
    }
    if (off < 1e-26) break;
    for (int64_t p = 0; p < m; ++p) {
      for (int64_t q = p + 1; q < m; ++q) {
        const double apq = a[p * m + q];
        if (std::abs(apq) < 1e-300) continue;
        const double theta = (a[q * m + q] - a[p * m + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1);
        const double s = t * c;
        for (int64_t k = 0; k < m; ++k) {  // Rotate columns p and q.
          const double akp = a[k * m + p];
          const double akq = a[k * m + q];
          a[k * m + p] = c * akp - s * akq;
          a[k * m + q] = s * akp + c * akq;
        }
        for (int64_t k = 0; k < m; ++k) {  // Rotate rows p and q.
          const double apk = a[p * m + k];
          const double aqk = a[q * m + k];
          a[p * m + k] = c * apk - s * aqk;
          a[q * m + k] = s * apk + c * aqk;
        }
      }
    }
  }
  std::vector<double> eig(m);
  for (int64_t i = 0; i < m; ++i) eig[i] = a[i * m + i];
  return eig;
}

}  // namespace

std::vector<float> RandomNormal(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (float& v : out) v = dist(rng);
  return out;
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    ref += double{b[i]} * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double{a[i]} - b[i]));
  }
  return worst;
}

double OrthogonalityError(const float* q, int64_t rows, int64_t cols) {
  const int64_t m = std::min(rows, cols);
  const std::vector<double> gram = SmallGram(q, rows, cols);
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      worst = std::max(worst, std::abs(gram[i * m + j] - (i == j ? 1.0 : 0.0)));
    }
  }
  return worst;
}

std::vector<double> SingularValues(const float* q, int64_t rows, int64_t cols) {
  const int64_t m = std::min(rows, cols);
  std::vector<double> eig = SymmetricEigenvalues(SmallGram(q, rows, cols), m);
  for (double& e : eig) e = std::sqrt(std::max(e, 0.0));
  std::sort(eig.begin(), eig.end());
  return eig;
}

}  // namespace muonshard::kernels::testing
