#ifndef MUONSHARD_PYTHON_SRC_BINDINGS_H_
#define MUONSHARD_PYTHON_SRC_BINDINGS_H_

// The parts of the _muonshard extension, each adding its classes and
// functions to the module (module.cc calls them in order).

#include "pybind11/pybind11.h"

namespace muonshard::python {

// CoordinatorClient: submit, get_plan, list_workers, health (coordinator.cc).
void BindCoordinator(pybind11::module_& m);
// RankSession: one rank of a job with its sharded optimizer (rank_session.cc).
void BindRankSession(pybind11::module_& m);
// Manifests from checkpoints and configs (module.cc).
void BindImporters(pybind11::module_& m);
void BindKernelInfo(pybind11::module_& m);

}  // namespace muonshard::python

#endif  // MUONSHARD_PYTHON_SRC_BINDINGS_H_
