#ifndef MUONSHARD_CLI_IMPORT_TP_FLAGS_H_
#define MUONSHARD_CLI_IMPORT_TP_FLAGS_H_

#include "absl/status/status.h"
#include "common/flags.h"
#include "importer/tp_split.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard::cli {

// The help of the import commands' --ns-blocks (importer/ns_blocks_rules.h).
extern const char kNsBlocksFlagHelp[];

// --tp N and --tp-experts of the import commands: mark the manifest's
// tensor-parallel splits (importer::MarkTensorParallel) when N > 1.
class ImportTpFlags {
 public:
  void Register(FlagSet& flags);
  // INVALID_ARGUMENT (exit 2) for tp < 1 or a dimension tp does not divide.
  absl::Status Apply(v1::ModelManifest* manifest) const;

 private:
  importer::TpSplitOptions options_;
};

}  // namespace muonshard::cli

#endif  // MUONSHARD_CLI_IMPORT_TP_FLAGS_H_
