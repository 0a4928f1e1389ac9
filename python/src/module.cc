// The _muonshard extension module: the C++ libraries behind the Python
// package `muonshard` (python/muonshard/). See python/CMakeLists.txt.

#include <string>
#include <vector>

#include "common/proto_json.h"
#include "importer/hf_import.h"
#include "importer/safetensors_files.h"
#include "importer/tp_split.h"
#include "kernels/blas_core.h"
#include "pybind11/stl.h"
#include "python/src/bindings.h"
#include "python/src/status.h"

namespace muonshard::python {

namespace py = pybind11;

void BindImporters(py::module_& m) {
  m.def(
      "import_hf_config",
      [](const std::string& config_json, const std::string& name, bool mtp, bool ns_blocks_mla,
         const std::vector<std::string>& ns_blocks) {
        importer::ImportOptions options;
        options.name = name;
        options.mtp = mtp;
        options.ns_blocks_mla = ns_blocks_mla;
        options.ns_blocks = ns_blocks;
        v1::ModelManifest manifest = ValueOrThrow(importer::ImportHfConfig(config_json, options));
        return ValueOrThrow(ToJson(manifest, /*pretty=*/false));
      },
      py::arg("config_json"), py::arg("name") = "", py::arg("mtp") = false, py::arg("ns_blocks_mla") = false,
      py::arg("ns_blocks") = std::vector<std::string>(),
      "The manifest (proto3 JSON) of a HuggingFace config.json's text. ns_blocks_mla: MLA's kv_b_proj per head "
      "(DeepSeek-V3, Kimi-K2); ns_blocks: per-block Newton-Schulz rules 'REGEX=BLOCKS' (importer/ns_blocks_rules.h).");
  m.def(
      "import_safetensors",
      [](const std::string& path, const std::string& name, bool skip_unsupported,
         const std::vector<std::string>& ns_blocks) {
        importer::SafetensorsImportOptions options;
        options.name = name;
        options.skip_unsupported = skip_unsupported;
        options.ns_blocks = ns_blocks;
        absl::StatusOr<importer::SafetensorsImport> imported;
        {
          py::gil_scoped_release release;  // file I/O
          imported = importer::ImportSafetensors(path, options);
        }
        return ValueOrThrow(ToJson(ValueOrThrow(std::move(imported)).manifest, /*pretty=*/false));
      },
      py::arg("path"), py::arg("name") = "", py::arg("skip_unsupported") = false,
      py::arg("ns_blocks") = std::vector<std::string>(),
      "The manifest (proto3 JSON) of a safetensors checkpoint, from its headers only; ns_blocks: per-block "
      "Newton-Schulz rules 'REGEX=BLOCKS' (importer/ns_blocks_rules.h).");
  m.def(
      "mark_tensor_parallel",
      [](const std::string& manifest_json, int tp, bool split_experts, bool shard_shapes) {
        v1::ModelManifest manifest;
        ThrowIfError(FromJson(manifest_json, &manifest, "manifest"));
        importer::TpSplitOptions options;
        options.tp = tp;
        options.split_experts = split_experts;
        options.keep_marked = true;
        options.shard_shapes = shard_shapes;
        ThrowIfError(importer::MarkTensorParallel(options, &manifest));
        return ValueOrThrow(ToJson(manifest, /*pretty=*/false));
      },
      py::arg("manifest_json"), py::arg("tp"), py::arg("split_experts") = false, py::arg("shard_shapes") = false,
      "The manifest (proto3 JSON) with Megatron's tensor-parallel splits marked (importer/tp_split.h); tensors "
      "already marked keep their mark.");
}

// Which BLAS kernels the CPU path runs (kernels/blas_core.h).
void BindKernelInfo(py::module_& m) {
  m.def(
      "openblas_core", [] { return kernels::OpenBlasCore(); },
      "The OpenBLAS core whose kernels this process runs (\"SkylakeX\", \"Haswell\", \"Prescott\", ...).");
  m.def(
      "blas_core_advice", [] { return kernels::BlasCoreAdvice(); },
      "One line when OpenBLAS runs slower kernels than the CPU could (a CPU model it does not know, as many "
      "VMs report): which OPENBLAS_CORETYPE to start with. Empty when the choice is fine or "
      "OPENBLAS_CORETYPE is set.");
}

}  // namespace muonshard::python

PYBIND11_MODULE(_muonshard, m) {
  m.doc() = "muonshard's C++ core: coordinator client, rank sessions with the sharded optimizer, importers";
  muonshard::python::BindCoordinator(m);
  muonshard::python::BindRankSession(m);
  muonshard::python::BindImporters(m);
  muonshard::python::BindKernelInfo(m);
}
