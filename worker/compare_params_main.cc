// muonshard-compare-params A B [--rtol 1e-5] [--all]: compares two parameter
// dumps (muonshard-worker --dump-params, sharded or --reference) tensor by
// tensor and reports each tensor's max absolute error and its error relative
// to the tensor's scale (params_file.h). Exit 0 when every tensor of both
// files is present in the other with the same shape and within rtol, 1
// otherwise, 2 on bad usage or an unreadable file.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/flags.h"
#include "common/version.h"
#include "worker/params_file.h"

namespace muonshard::worker {
namespace {

constexpr int kShownWorst = 5;

void PrintRow(const TensorComparison& t) {
  std::cout << absl::StrFormat("  %-56s %10d  %11.3e  %11.3e  %s\n", t.name, t.numel, t.max_abs, t.rel,
                               t.bit_identical ? "identical" : (t.ok ? "ok" : "FAIL"));
}

// Every tensor with --all; otherwise the failures and the worst few (and
// nothing when every tensor is bit-identical).
void PrintTable(const ParamsComparison& c, bool all) {
  std::vector<TensorComparison> rows = c.tensors;
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.rel > b.rel; });
  std::cout << absl::StrFormat("  %-56s %10s  %11s  %11s\n", "tensor", "numel", "max_abs", "rel");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (all || !rows[i].ok || static_cast<int>(i) < kShownWorst) PrintRow(rows[i]);
  }
  if (!all && static_cast<int>(rows.size()) > kShownWorst) {
    std::cout << "  ... (" << rows.size() << " tensors; --all lists every one)\n";
  }
}

void PrintSummary(const ParamsComparison& c) {
  int64_t elements = 0;
  for (const TensorComparison& t : c.tensors) elements += t.numel;
  const TensorComparison* worst = c.worst();
  std::cout << absl::StrFormat("compared %d tensors (%d elements): %s", c.tensors.size(), elements,
                               c.bit_identical() ? "bit-identical" : "");
  if (!c.bit_identical() && worst != nullptr) {
    std::cout << absl::StrFormat("max relative error %.3e (\"%s\")", worst->rel, worst->name);
  }
  std::cout << absl::StrFormat("; rtol %.1e: %s\n", c.rtol, c.ok() ? "PASS" : "FAIL");
  for (const std::string& m : c.mismatches) std::cout << "mismatch: " << m << "\n";
  if (c.failed() > 0) std::cout << c.failed() << " tensor(s) over rtol\n";
}

int Main(int argc, char** argv) {
  FlagSet flags("usage: muonshard-compare-params ACTUAL.safetensors EXPECTED.safetensors [--rtol R] [--all]");
  double rtol = 1e-5;
  bool all = false;
  flags.Double("rtol", &rtol, "largest allowed max|a - e| / max|e| per tensor");
  flags.Bool("all", &all, "list every tensor, not only failures and the worst five");
  absl::StatusOr<std::vector<std::string>> files = flags.Parse(ArgsOf(argc, argv));
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (flags.version_requested()) {
    std::cout << VersionLine("muonshard-compare-params") << "\n";
    return 0;
  }
  if (!files.ok() || files->size() != 2 || !(rtol >= 0)) {
    std::cerr << "error: " << (files.ok() ? "expected two files and --rtol >= 0" : files.status().message()) << "\n\n"
              << flags.Usage();
    return 2;
  }
  absl::StatusOr<ParamsFile> actual = ReadParamsFile((*files)[0]);
  absl::StatusOr<ParamsFile> expected = actual.ok() ? ReadParamsFile((*files)[1]) : actual;
  if (!expected.ok()) {
    std::cerr << "error: " << expected.status() << "\n";
    return 2;
  }
  const ParamsComparison c = CompareParams(*actual, *expected, rtol);
  if (all || !c.bit_identical()) PrintTable(c, all);
  PrintSummary(c);
  return c.ok() ? 0 : 1;
}

}  // namespace
}  // namespace muonshard::worker

int main(int argc, char** argv) { return muonshard::worker::Main(argc, argv); }
