#include "python/src/session_values.h"

#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "dlpack/dlpack.h"
#include "plan/model.h"
#include "plan/tp_mesh.h"
#include "pybind11/stl.h"
#include "python/src/status.h"

namespace muonshard::python {
namespace {

namespace py = pybind11;

DLDataType DlpackType(v1::DType dtype) {
  switch (dtype) {
    case v1::BF16:
      return DLDataType{kDLBfloat, 16, 1};
    case v1::FP16:
      return DLDataType{kDLFloat, 16, 1};
    default:
      return DLDataType{kDLFloat, 32, 1};
  }
}

// A DLManagedTensor with its shape and its owner: freed by its deleter,
// which the consumer calls when its tensor goes (on any thread, maybe
// without the GIL), or by the capsule if it was never consumed.
struct DlpackHolder {
  DLManagedTensor managed{};
  int64_t shape[1] = {0};
  PyObject* owner = nullptr;
};

void DeleteDlpackHolder(DLManagedTensor* managed) {
  auto* holder = static_cast<DlpackHolder*>(managed->manager_ctx);
  if (Py_IsInitialized()) {  // at interpreter exit the owner is gone already
    const PyGILState_STATE gil = PyGILState_Ensure();
    Py_XDECREF(holder->owner);
    PyGILState_Release(gil);
  }
  delete holder;
}

// The capsule's destructor: frees the tensor unless a consumer took it
// (and renamed the capsule "used_dltensor").
void DestroyDlpackCapsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

}  // namespace

absl::StatusOr<absl::Span<const float>> SpanGradients::PartGradient(int tensor) {
  auto it = spans_.find(tensor);
  if (it == spans_.end()) return absl::NotFoundError(absl::StrCat("no gradient for plan tensor ", tensor));
  return it->second;
}

py::capsule DlpackOver(void* data, v1::DType dtype, int64_t numel, MemoryDevice device, py::handle owner) {
  auto* holder = new DlpackHolder;
  holder->shape[0] = numel;
  holder->owner = owner.ptr();
  Py_XINCREF(holder->owner);
  DLTensor& t = holder->managed.dl_tensor;
  t.data = data;
  t.device = device.cuda ? DLDevice{kDLCUDA, device.ordinal} : DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DlpackType(dtype);
  t.shape = holder->shape;
  t.strides = nullptr;  // compact
  t.byte_offset = 0;
  holder->managed.manager_ctx = holder;
  holder->managed.deleter = &DeleteDlpackHolder;
  PyObject* capsule = PyCapsule_New(&holder->managed, "dltensor", &DestroyDlpackCapsule);
  if (capsule == nullptr) {
    DeleteDlpackHolder(&holder->managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
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
