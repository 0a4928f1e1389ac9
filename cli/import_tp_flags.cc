#include "cli/import_tp_flags.h"

#include "absl/strings/str_cat.h"

namespace muonshard::cli {

const char kNsBlocksFlagHelp[] =
    "per-block Newton-Schulz of fused weights, repeatable: REGEX=BLOCKS, REGEX matching whole tensor names, "
    "BLOCKS rows:SIZES[xGROUPS] or cols:strideN, e.g. '.*qkv_proj\\.weight=rows:3072,1024,1024', "
    "'.*query_key_value\\.weight=rows:64,64,64x32', '.*experts\\.gate_up_proj=cols:stride2'";

void ImportTpFlags::Register(FlagSet& flags) {
  flags.Int("tp", &options_.tp,
            "tensor-parallel degree: mark the usual column/row splits (q/k/v/gate/up and vocab column, o/down row)");
  flags.Bool("tp-experts", &options_.split_experts,
             "with --tp, split expert tensors too (default: experts stay whole, as with expert parallelism)");
}

absl::Status ImportTpFlags::Apply(v1::ModelManifest* manifest) const {
  if (options_.tp < 1) return absl::InvalidArgumentError(absl::StrCat("--tp: must be >= 1, got ", options_.tp));
  if (options_.tp == 1) {
    if (options_.split_experts) return absl::InvalidArgumentError("--tp-experts: needs --tp 2 or more");
    return absl::OkStatus();
  }
  return importer::MarkTensorParallel(options_, manifest);
}

}  // namespace muonshard::cli
