// `muonshardctl import-hf`: placeholder until the importer lands (issue 2).
#include <iostream>

#include "cli/cli_common.h"
#include "cli/commands.h"

namespace muonshard::cli {

int RunImportHf(const std::vector<std::string>& args) {
  return ReportError(absl::UnimplementedError("import-hf is being built"));
}

}  // namespace muonshard::cli
