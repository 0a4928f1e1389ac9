#ifndef MUONSHARD_IMPORTER_MANIFEST_SUMMARY_H_
#define MUONSHARD_IMPORTER_MANIFEST_SUMMARY_H_

// Counts over a manifest: what `import-hf --output table` prints and what the
// published parameter totals are checked against. Pure.

#include <cstdint>
#include <map>
#include <string>

#include "muonshard/v1/manifest.pb.h"

namespace muonshard::importer {

struct DTypeTotals {
  int64_t tensors = 0;
  int64_t parameters = 0;
};

struct ManifestSummary {
  int64_t tensors = 0;
  int64_t parameters = 0;
  // Tensors with `expert` set (fused expert stacks are not counted).
  int64_t expert_tensors = 0;
  std::map<v1::DType, DTypeTotals> by_dtype;
};

// Elements of one tensor: the product of its shape.
int64_t NumElements(const v1::TensorSpec& tensor);

ManifestSummary Summarize(const v1::ModelManifest& manifest);

// 671026419200 -> "671,026,419,200".
std::string GroupDigits(int64_t n);

// The `--output table` text of the import commands: model, tensors,
// parameters, expert tensors, then tensors and parameters per dtype.
std::string FormatSummaryTable(const v1::ModelManifest& manifest);

}  // namespace muonshard::importer

#endif  // MUONSHARD_IMPORTER_MANIFEST_SUMMARY_H_
