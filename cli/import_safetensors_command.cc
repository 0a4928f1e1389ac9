// `muonshardctl import-safetensors DIR|FILE`: the manifest of the tensors a
// safetensors checkpoint holds, read from its headers alone (see
// importer/safetensors_files.h).
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/cli_common.h"
#include "cli/commands.h"
#include "cli/import_tp_flags.h"
#include "common/ordered_json.h"
#include "importer/manifest_summary.h"
#include "importer/safetensors_files.h"

namespace muonshard::cli {
namespace {

// How many skipped tensors or short files the notes name before they only
// count.
constexpr size_t kNamesShown = 5;

absl::StatusOr<importer::SafetensorsImport> Import(const std::string& path,
                                                   const importer::SafetensorsImportOptions& options) {
  auto imported = importer::ImportSafetensors(path, options);
  // A missing input (file, directory entry, shard) is bad usage (exit 2),
  // as for import-hf, not a runtime failure.
  if (absl::IsNotFound(imported.status())) return absl::InvalidArgumentError(imported.status().message());
  return imported;
}

// " a, b, c, ...": the first kNamesShown of `names`.
std::string FirstFew(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kNamesShown; ++i) absl::StrAppend(&out, i > 0 ? ", " : " ", names[i]);
  return names.size() > kNamesShown ? absl::StrCat(out, ", ...") : out;
}

// What was left out or is incomplete, on stderr.
void PrintNotes(const importer::SafetensorsImport& imported) {
  if (!imported.skipped.empty()) {
    std::vector<std::string> names;
    for (const importer::SkippedTensor& t : imported.skipped) {
      names.push_back(absl::StrCat(QuoteForMessage(t.name, 160), " (", t.dtype, ")"));
    }
    std::cerr << "import-safetensors: skipped " << names.size()
              << " tensor(s) of unsupported dtypes:" << FirstFew(names) << "\n";
  }
  if (!imported.short_files.empty()) {
    std::cerr << "import-safetensors: note: " << imported.short_files.size()
              << " file(s) hold less data than their header describes (header-only or truncated copies; only "
                 "headers are read):"
              << FirstFew(imported.short_files) << "\n";
  }
}

}  // namespace

int RunImportSafetensors(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl import-safetensors DIR|FILE [--name NAME] [--tp N [--tp-experts]] [--output json|table]\n"
      "                                          [--skip-unsupported] [--ns-blocks 'REGEX=BLOCKS' ...]\n"
      "  prints the manifest (JSON) of the tensors a safetensors checkpoint holds, read from its headers only;\n"
      "  DIR holds model.safetensors or model.safetensors.index.json and its shards");
  importer::SafetensorsImportOptions options;
  std::string output = "json";
  flags.String("name", &options.name, "model name (default: the directory name, else the file name)");
  flags.String("output", &output, "json (the manifest) | table (a summary)");
  flags.Bool("skip-unsupported", &options.skip_unsupported,
             "leave out tensors that are not BF16, F16 or F32 (default: fail on the first)");
  flags.StringList("ns-blocks", &options.ns_blocks, kNsBlocksFlagHelp);
  ImportTpFlags tp;
  tp.Register(flags);
  std::vector<std::string> positional;
  if (int rc = ParseFlagsOrExit(flags, args, &positional); rc >= 0) return rc;
  if (positional.size() != 1) {
    std::cerr << "error: import-safetensors takes one DIR or FILE\n\n" << flags.Usage();
    return kExitUsage;
  }
  if (absl::Status s = CheckOutputFormat(output); !s.ok()) return ReportError(s);
  auto imported = Import(positional[0], options);
  if (!imported.ok()) return ReportError(imported.status());
  if (absl::Status s = tp.Apply(&imported->manifest); !s.ok()) return ReportError(s);
  PrintNotes(*imported);
  if (output == "table") {
    std::cout << importer::FormatSummaryTable(imported->manifest);
    return kExitOk;
  }
  importer::ManifestSummary s = importer::Summarize(imported->manifest);
  std::cerr << "import-safetensors: " << imported->manifest.model() << ": " << importer::GroupDigits(s.tensors)
            << " tensors, " << importer::GroupDigits(s.parameters) << " parameters from " << imported->files
            << " header(s), " << importer::GroupDigits(imported->bytes_read) << " bytes read\n";
  return PrintJson(imported->manifest);
}

}  // namespace muonshard::cli
