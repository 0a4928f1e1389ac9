// `muonshardctl import-hf CONFIG.json`: the manifest of a HuggingFace model,
// built from its config.json (see importer/hf_import.h).
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/cli_common.h"
#include "cli/commands.h"
#include "cli/import_tp_flags.h"
#include "common/file_util.h"
#include "importer/hf_import.h"
#include "importer/manifest_summary.h"

namespace muonshard::cli {
namespace {

// The fallback model name a config file suggests: "Llama-3.1-8B" for
// ".../Llama-3.1-8B.config.json", the directory name for ".../X/config.json";
// "" when there is none (the importer then uses the model_type).
std::string NameFromPath(const std::string& path) {
  std::vector<absl::string_view> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
  if (parts.empty()) return "";
  absl::string_view base = parts.back();
  if (base == "config.json") {
    base = parts.size() >= 2 ? parts[parts.size() - 2] : "";
  } else {
    absl::ConsumeSuffix(&base, ".json");
    absl::ConsumeSuffix(&base, ".config");
  }
  if (base == "." || base == "..") return "";
  return std::string(base);
}

// 671026419200 -> "671,026,419,200".
std::string Grouped(int64_t n) {
  std::string digits = absl::StrCat(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void PrintSummaryTable(const v1::ModelManifest& manifest, std::ostream& out) {
  importer::ManifestSummary s = importer::Summarize(manifest);
  out << absl::StrFormat("%-16s %s\n", "model", manifest.model());
  out << absl::StrFormat("%-16s %s\n", "tensors", Grouped(s.tensors));
  out << absl::StrFormat("%-16s %s\n", "parameters", Grouped(s.parameters));
  out << absl::StrFormat("%-16s %s\n", "expert tensors", Grouped(s.expert_tensors));
  out << absl::StrFormat("\n%-8s %12s %20s\n", "dtype", "tensors", "parameters");
  for (const auto& [dtype, totals] : s.by_dtype) {
    out << absl::StrFormat("%-8s %12s %20s\n", v1::DType_Name(dtype), Grouped(totals.tensors),
                           Grouped(totals.parameters));
  }
}

absl::StatusOr<v1::ModelManifest> Import(const std::string& path, importer::ImportOptions options) {
  auto json = ReadFile(path);
  // An unreadable input is bad usage (exit 2), not a runtime failure.
  if (!json.ok()) return absl::InvalidArgumentError(json.status().message());
  options.default_name = NameFromPath(path);
  return importer::ImportHfConfig(*json, options);
}

}  // namespace

int RunImportHf(const std::vector<std::string>& args) {
  FlagSet flags(absl::StrCat(
      "usage: muonshardctl import-hf CONFIG.json [--mtp] [--name NAME] [--tp N [--tp-experts]] [--output json|table]\n"
      "                                 [--ns-blocks-mla] [--ns-blocks 'REGEX=BLOCKS' ...]\n"
      "  prints the model's manifest (JSON) on stdout; model types: ",
      absl::StrJoin(importer::SupportedModelTypes(), ", ")));
  importer::ImportOptions options;
  std::string output = "json";
  flags.Bool("mtp", &options.mtp, "add the next-n prediction (MTP) layers (DeepSeek-V3, Kimi-K2)");
  flags.Bool("ns-blocks-mla", &options.ns_blocks_mla,
             "orthogonalise MLA's kv_b_proj per head (DeepSeek-V3, Kimi-K2: blocks rows [k_nope, v] x heads)");
  flags.StringList("ns-blocks", &options.ns_blocks, kNsBlocksFlagHelp);
  flags.String("name", &options.name, "model name (default: _name_or_path, else the file name)");
  flags.String("output", &output, "json (the manifest) | table (a summary)");
  ImportTpFlags tp;
  tp.Register(flags);
  std::vector<std::string> positional;
  if (int rc = ParseFlagsOrExit(flags, args, &positional); rc >= 0) return rc;
  if (positional.size() != 1) {
    std::cerr << "error: import-hf takes one CONFIG.json\n\n" << flags.Usage();
    return kExitUsage;
  }
  if (absl::Status s = CheckOutputFormat(output); !s.ok()) return ReportError(s);
  auto manifest = Import(positional[0], options);
  if (!manifest.ok()) return ReportError(manifest.status());
  if (absl::Status s = tp.Apply(&*manifest); !s.ok()) return ReportError(s);
  if (output == "table") {
    PrintSummaryTable(*manifest, std::cout);
    return kExitOk;
  }
  importer::ManifestSummary s = importer::Summarize(*manifest);
  std::cerr << "import-hf: " << manifest->model() << ": " << Grouped(s.tensors) << " tensors, " << Grouped(s.parameters)
            << " parameters\n";
  return PrintJson(*manifest);
}

}  // namespace muonshard::cli
