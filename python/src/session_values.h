#ifndef MUONSHARD_PYTHON_SRC_SESSION_VALUES_H_
#define MUONSHARD_PYTHON_SRC_SESSION_VALUES_H_

// The Python values of a RankSession (rank_session.cc): DLPack tensors over
// the optimizer's own memory and checked arrays from the caller, the held
// parts and step statistics as dicts, the keys of optimizer-state shards.

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "checkpoint/state.h"
#include "muonshard/v1/plan.pb.h"
#include "pybind11/numpy.h"
#include "pybind11/pybind11.h"
#include "worker/optimizer/gradient_source.h"
#include "worker/optimizer/step_stats.h"

namespace muonshard::python {

using FloatArray = pybind11::array_t<float, pybind11::array::c_style>;

// Gradients as spans of arrays the caller keeps alive for the step.
class SpanGradients : public worker::GradientSource {
 public:
  void Set(int tensor, absl::Span<const float> values) { spans_[tensor] = values; }
  absl::StatusOr<absl::Span<const float>> PartGradient(int tensor) override;

 private:
  absl::flat_hash_map<int, absl::Span<const float>> spans_;
};

// Where memory handed to Python lives: the host (the CPU backend), or CUDA
// device `ordinal` (the CUDA backend's).
struct MemoryDevice {
  bool cuda = false;
  int ordinal = 0;
};

// A DLPack capsule ("dltensor", DLPack 0.6's DLManagedTensor) of a 1-D
// tensor of `numel` elements of `dtype` over `data`, on `device`, which
// `owner` keeps alive until the consumer (torch.from_dlpack) frees it.
// Host and device memory alike, so one code path views the optimizer's
// buffers from PyTorch on either backend.
pybind11::capsule DlpackOver(void* data, v1::DType dtype, int64_t numel, MemoryDevice device, pybind11::handle owner);

// `value` as a C-contiguous float32 array (no copy); ValueError naming
// `what` otherwise.
FloatArray CheckedFloats(pybind11::handle value, const std::string& what);

// The tensor parts `view`'s rank holds, as Python dicts (what held() returns).
pybind11::list HeldParts(const v1::RankView& view);

// A step's statistics as the dict step() returns.
pybind11::dict StatsDict(const worker::StepStats& s);

// "<tensor>/<kind>/<begin>:<end>": an optimizer-state shard's key in state().
std::string StateKey(const checkpoint::ShardSpec& spec);

}  // namespace muonshard::python

#endif  // MUONSHARD_PYTHON_SRC_SESSION_VALUES_H_
