#ifndef MUONSHARD_WORKER_PARAMS_FILE_H_
#define MUONSHARD_WORKER_PARAMS_FILE_H_

// Parameter dumps: fp32 tensors in a safetensors file (the container codec is
// checkpoint/safetensors.h; this file adds the I/O and the comparison).
// `muonshard-worker --dump-params FILE` writes one (the gathered fp32 masters
// of every tensor, shape as in the manifest), `--reference` writes the same
// for the unsharded run, and `muonshard-compare-params` compares two.
//
// Files are written atomically (temp file, fsync, rename) and read whole:
// dumps are for comparisons of test- and demo-sized models, not checkpoints.
//
// Thread-compatible pure functions apart from the file I/O.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muonshard::worker {

struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major, product(shape) elements
};

struct ParamsFile {
  std::vector<ParamTensor> tensors;  // written in this order
  std::map<std::string, std::string> metadata;

  // The tensor named `name`, or null.
  const ParamTensor* Find(const std::string& name) const;
};

// Writes `file` to `path` (atomically). INVALID_ARGUMENT naming the tensor
// when values and shape disagree or a name repeats.
absl::Status WriteParamsFile(const std::string& path, const ParamsFile& file);

// Reads a file of F32 tensors. NOT_FOUND (missing file), DATA_LOSS (not a
// safetensors file), INVALID_ARGUMENT naming a tensor of another dtype.
absl::StatusOr<ParamsFile> ReadParamsFile(const std::string& path);

// How one tensor of `actual` compares with `expected`: max_abs = max_i
// |a_i - e_i|; scale = max_i |e_i|; rel = max_abs / scale (0 when both are
// 0), i.e. the error relative to the tensor's magnitude. Relative to each
// element's own value would be meaningless for elements near zero, whose
// summation-order error is set by the tensor's scale, not their own.
struct TensorComparison {
  std::string name;
  int64_t numel = 0;
  double max_abs = 0;
  double scale = 0;
  double rel = 0;
  bool bit_identical = false;
  bool ok = false;  // rel <= rtol (or bit-identical)
};

struct ParamsComparison {
  std::vector<TensorComparison> tensors;  // in `expected`'s order
  // Names missing from either side, shapes or run metadata that differ.
  std::vector<std::string> mismatches;
  double rtol = 0;

  bool ok() const;
  int failed() const;                     // tensors over rtol
  bool bit_identical() const;             // every tensor, and no mismatch
  const TensorComparison* worst() const;  // largest rel; null when empty
};

// Compares every tensor by name, and the metadata that identifies a run
// (model, content_hash, plan_version, steps, workload, seed, lr,
// weight_decay) where both files carry it. Pure.
ParamsComparison CompareParams(const ParamsFile& actual, const ParamsFile& expected, double rtol);

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_PARAMS_FILE_H_
