#include "python/src/session_values.h"

#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "plan/model.h"
#include "plan/tp_mesh.h"
#include "pybind11/stl.h"
#include "python/src/status.h"

namespace muonshard::python {
namespace {

namespace py = pybind11;

// The numpy dtype an array over `dtype` elements uses: 16-bit floats other
// than fp16 have no numpy type, so bf16 travels as int16 words (torch views
// them as bfloat16).
py::dtype NumpyDType(v1::DType dtype) {
  switch (dtype) {
    case v1::BF16:
      return py::dtype("int16");
    case v1::FP16:
      return py::dtype("float16");
    default:
      return py::dtype::of<float>();
  }
}

}  // namespace

absl::StatusOr<absl::Span<const float>> SpanGradients::PartGradient(int tensor) {
  auto it = spans_.find(tensor);
  if (it == spans_.end()) return absl::NotFoundError(absl::StrCat("no gradient for plan tensor ", tensor));
  return it->second;
}

py::array ArrayOver(void* data, v1::DType dtype, int64_t numel, py::handle owner) {
  py::dtype type = NumpyDType(dtype);
  const py::ssize_t item = type.itemsize();
  return py::array(type, {static_cast<py::ssize_t>(numel)}, {item}, data, owner);
}

py::list HeldParts(const v1::RankView& view) {
  absl::flat_hash_set<int> my_groups;
  for (const v1::CommGroup& g : view.groups()) {
    for (int r : g.ranks()) {
      if (r == view.rank().rank()) my_groups.insert(g.id());
    }
  }
  py::list out;
  for (const v1::IndexedTensor& t : view.tensors()) {
    for (const v1::TensorPart& p : t.tensor().parts()) {
      if (!my_groups.contains(p.group())) continue;
      py::dict d;
      d["index"] = t.index();
      d["name"] = t.tensor().name();
      d["shape"] = py::tuple(py::cast(std::vector<int64_t>(t.tensor().shape().begin(), t.tensor().shape().end())));
      d["dtype"] = planner::DTypeName(t.tensor().dtype());
      d["optimizer"] = v1::Optimizer_Name(t.tensor().optimizer());
      d["layout"] = v1::Layout_Name(t.tensor().layout());
      d["expert"] = t.tensor().expert();
      d["group"] = p.group();
      d["element_begin"] = p.element_begin();
      d["element_end"] = p.element_end();
      d["numel"] = t.tensor().numel();
      // With tp > 1: how the tensor is split, and the shard a tp rank holds
      // (the whole tensor when it is not split).
      d["tp_split"] = v1::TpSplit_Name(t.tensor().tp_split());
      const bool split = t.tensor().local_shape_size() > 0;
      d["local_shape"] = split ? py::tuple(py::cast(std::vector<int64_t>(t.tensor().local_shape().begin(),
                                                                         t.tensor().local_shape().end())))
                               : d["shape"];
      d["local_numel"] = split ? t.tensor().local_numel() : t.tensor().numel();
      // Where this rank's shard (a tile on a tp mesh) lies in the whole
      // tensor (NOTE [TP mesh tiles] in plan/tp_mesh.h).
      if (planner::IsTpSplit(t.tensor())) {
        const planner::TpTile tile = planner::TpTileOf(t.tensor(), view.topology(), view.rank().tp_rank());
        d["tile_offset"] = py::tuple(py::cast(tile.offset));
      }
      out.append(std::move(d));
    }
  }
  return out;
}

py::dict StatsDict(const worker::StepStats& s) {
  py::dict d;
  d["reduce_seconds"] = s.reduce_seconds;
  d["muon_seconds"] = s.muon_seconds;
  d["adamw_seconds"] = s.adamw_seconds;
  d["sync_seconds"] = s.sync_seconds;
  d["total_seconds"] = s.total_seconds;
  d["grad_reduce_bytes"] = s.comm.grad_reduce;
  d["grad_reduce_scatter_bytes"] = s.comm.grad_reduce_scatter;
  d["param_broadcast_bytes"] = s.comm.param_broadcast;
  d["param_all_gather_bytes"] = s.comm.param_all_gather;
  d["tp_bytes"] = s.comm.tp;  // sent + received by the tensor-parallel Muon gathers and scatters
  d["collectives"] = s.comm.collectives;
  return d;
}

std::string StateKey(const checkpoint::ShardSpec& spec) {
  return absl::StrCat(spec.name, "/", checkpoint::StateKindName(spec.kind), "/", spec.begin, ":", spec.end);
}

FloatArray CheckedFloats(py::handle value, const std::string& what) {
  if (!py::isinstance<py::array>(value)) {
    RaiseStatus(absl::InvalidArgumentError(absl::StrCat(what, ": not a numpy array")));
  }
  py::array a = py::reinterpret_borrow<py::array>(value);
  if (!a.dtype().is(py::dtype::of<float>()) || !(a.flags() & py::array::c_style)) {
    RaiseStatus(absl::InvalidArgumentError(absl::StrCat(what, ": needs a C-contiguous float32 array")));
  }
  return py::reinterpret_borrow<FloatArray>(a);
}

}  // namespace muonshard::python
