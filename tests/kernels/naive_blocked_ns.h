#ifndef MUONSHARD_TESTS_KERNELS_NAIVE_BLOCKED_NS_H_
#define MUONSHARD_TESTS_KERNELS_NAIVE_BLOCKED_NS_H_

// An independent per-block Newton-Schulz for the tests: each block's rows
// (or columns) listed by hand, extracted into its own matrix, run through a
// naive triple-loop NS in double (Paddle's simple coefficients, 5 steps,
// eps 1e-9), multiplied by the block's own Muon scale (v1, OUT_IN or
// IN_OUT) and written back. No BLAS, no kernels code.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace muonshard::testing {

// The blocks of a "sizes x groups" structure along an axis of `length`:
// index lists.
inline std::vector<std::vector<int64_t>> NaiveSizesBlocks(const std::vector<int64_t>& sizes, int64_t length) {
  std::vector<std::vector<int64_t>> blocks;
  for (int64_t at = 0; at < length;) {
    for (int64_t s : sizes) {
      std::vector<int64_t> b;
      for (int64_t k = 0; k < s; ++k) b.push_back(at + k);
      blocks.push_back(b);
      at += s;
    }
  }
  return blocks;
}

// Block j: indices i with i % stride == j.
inline std::vector<std::vector<int64_t>> NaiveStrideBlocks(int64_t stride, int64_t length) {
  std::vector<std::vector<int64_t>> blocks(stride);
  for (int64_t i = 0; i < length; ++i) blocks[i % stride].push_back(i);
  return blocks;
}

// Naive NS of one r x c matrix (row-major), in double.
inline std::vector<double> NaiveNs(std::vector<double> g, int64_t r, int64_t c, int steps = 5) {
  const bool transpose = r > c;
  int64_t m = r, n = c;
  std::vector<double> x(g.size());
  if (transpose) {
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) x[j * r + i] = g[i * c + j];
    m = c;
    n = r;
  } else {
    x = g;
  }
  double norm = 0;
  for (double v : x) norm += v * v;
  norm = std::max(std::sqrt(norm), 1e-9);
  for (double& v : x) v /= norm;
  const double a = 3.4445, b = -4.7750, cc = 2.0315;
  for (int s = 0; s < steps; ++s) {
    std::vector<double> A(m * m, 0), B(m * m, 0), nx(m * n, 0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t k = 0; k < n; ++k) A[i * m + j] += x[i * n + k] * x[j * n + k];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double aa = 0;
        for (int64_t k = 0; k < m; ++k) aa += A[i * m + k] * A[k * m + j];
        B[i * m + j] = b * A[i * m + j] + cc * aa;
      }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double bx = 0;
        for (int64_t k = 0; k < m; ++k) bx += B[i * m + k] * x[k * n + j];
        nx[i * n + j] = a * x[i * n + j] + bx;
      }
    x = nx;
  }
  if (!transpose) return x;
  std::vector<double> out(r * c);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) out[i * c + j] = x[j * r + i];
  return out;
}

// Per-block NS of `batch` row-major rows x cols matrices; blocks along rows
// (`rows_axis`) or columns. `scale_extra` > 0 multiplies each block by
// extra · sqrt(max(1, dout/din)) of the block's shape (dout = rows when
// `out_in`, else cols).
inline std::vector<double> NaiveBlockedNs(const std::vector<double>& in, int64_t batch, int64_t rows, int64_t cols,
                                          bool rows_axis, const std::vector<std::vector<int64_t>>& blocks,
                                          double scale_extra = 0, bool out_in = true) {
  std::vector<double> out(in.size(), 0);
  for (int64_t e = 0; e < batch; ++e) {
    const double* m = in.data() + e * rows * cols;
    double* o = out.data() + e * rows * cols;
    for (const std::vector<int64_t>& b : blocks) {
      const int64_t br = rows_axis ? static_cast<int64_t>(b.size()) : rows;
      const int64_t bc = rows_axis ? cols : static_cast<int64_t>(b.size());
      std::vector<double> x(br * bc);
      for (int64_t i = 0; i < br; ++i)
        for (int64_t j = 0; j < bc; ++j) {
          const int64_t ri = rows_axis ? b[i] : i, cj = rows_axis ? j : b[j];
          x[i * bc + j] = m[ri * cols + cj];
        }
      std::vector<double> y = NaiveNs(x, br, bc);
      double s = 1;
      if (scale_extra > 0) {
        const double dout = out_in ? br : bc, din = out_in ? bc : br;
        s = scale_extra * std::sqrt(std::max(1.0, dout / din));
      }
      for (int64_t i = 0; i < br; ++i)
        for (int64_t j = 0; j < bc; ++j) {
          const int64_t ri = rows_axis ? b[i] : i, cj = rows_axis ? j : b[j];
          o[ri * cols + cj] = s * y[i * bc + j];
        }
    }
  }
  return out;
}

}  // namespace muonshard::testing

#endif  // MUONSHARD_TESTS_KERNELS_NAIVE_BLOCKED_NS_H_
