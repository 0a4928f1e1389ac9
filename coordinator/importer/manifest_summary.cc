#include "coordinator/importer/manifest_summary.h"

namespace muonshard::importer {

int64_t NumElements(const v1::TensorSpec& tensor) {
  int64_t n = 1;
  for (int64_t d : tensor.shape()) n *= d;
  return n;
}

ManifestSummary Summarize(const v1::ModelManifest& manifest) {
  ManifestSummary summary;
  for (const v1::TensorSpec& t : manifest.tensors()) {
    const int64_t n = NumElements(t);
    ++summary.tensors;
    summary.parameters += n;
    if (t.has_expert()) ++summary.expert_tensors;
    DTypeTotals& totals = summary.by_dtype[t.dtype()];
    ++totals.tensors;
    totals.parameters += n;
  }
  return summary;
}

}  // namespace muonshard::importer
