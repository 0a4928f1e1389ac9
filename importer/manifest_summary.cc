#include "importer/manifest_summary.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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

std::string GroupDigits(int64_t n) {
  const std::string digits = absl::StrCat(n);
  const size_t sign = n < 0 ? 1 : 0;
  std::string out = digits.substr(0, sign);
  for (size_t i = sign; i < digits.size(); ++i) {
    if (i > sign && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string FormatSummaryTable(const v1::ModelManifest& manifest) {
  const ManifestSummary s = Summarize(manifest);
  std::string out;
  absl::StrAppendFormat(&out, "%-16s %s\n", "model", manifest.model());
  absl::StrAppendFormat(&out, "%-16s %s\n", "tensors", GroupDigits(s.tensors));
  absl::StrAppendFormat(&out, "%-16s %s\n", "parameters", GroupDigits(s.parameters));
  absl::StrAppendFormat(&out, "%-16s %s\n", "expert tensors", GroupDigits(s.expert_tensors));
  absl::StrAppendFormat(&out, "\n%-8s %12s %20s\n", "dtype", "tensors", "parameters");
  for (const auto& [dtype, totals] : s.by_dtype) {
    absl::StrAppendFormat(&out, "%-8s %12s %20s\n", v1::DType_Name(dtype), GroupDigits(totals.tensors),
                          GroupDigits(totals.parameters));
  }
  return out;
}

}  // namespace muonshard::importer
