#ifndef MUONSHARD_IMPORTER_SAFETENSORS_IMPORT_H_
#define MUONSHARD_IMPORTER_SAFETENSORS_IMPORT_H_

// The manifest of a safetensors checkpoint, from its headers alone: the
// tensors the files hold, with their names, shapes and dtypes, in the order
// the checkpoint writes them. The pure part: headers and index as bytes in,
// manifest out (safetensors_files.h reads them from disk). No I/O, no
// globals; thread-safe.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard::importer {

struct SafetensorsImportOptions {
  // The manifest's model name. Empty: `default_name`, else "model".
  std::string name;
  std::string default_name;
  // Leave out (and list in SafetensorsImport::skipped) the tensors of dtypes
  // a manifest cannot hold, instead of failing on the first.
  bool skip_unsupported = false;
  // Per-block Newton-Schulz by tensor-name rules, REGEX=BLOCKS
  // ('.*\.qkv_proj\.weight=rows:3072,1024,1024'; ns_blocks_rules.h): applied
  // to the imported manifest, errors as ApplyNsBlocksRules gives them.
  std::vector<std::string> ns_blocks;
};

// A model.safetensors.index.json: the file that holds each tensor.
struct SafetensorsIndex {
  // (tensor, file) in the order the index writes them; tensors are unique.
  std::vector<std::pair<std::string, std::string>> weight_map;
  // Each file once, in the order of its first mention.
  std::vector<std::string> files;
};

// Parses an index (HF's sharded format): a JSON object whose "weight_map"
// maps each tensor name to the bare name of the file beside the index that
// holds it ("model-00001-of-00002.safetensors": no '/', control character,
// "." or ".."). "metadata" and any other member are ignored. Errors are
// INVALID_ARGUMENT and start with `index_name`.
absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view json, absl::string_view index_name);

// One file's header, as read by the caller.
struct SafetensorsFileHeader {
  std::string name;  // the file's name, as an index names it
  std::string path;  // for messages; empty: `name`
  int64_t file_size = 0;
  std::string json;  // the N header bytes that follow the 8-byte length
};

struct SkippedTensor {
  std::string name;
  std::string dtype;  // the safetensors dtype: "I64", "F8_E4M3", ...
  std::string file;   // path (or name) of the file that holds it
};

struct SafetensorsImport {
  v1::ModelManifest manifest;
  // Tensors left out under skip_unsupported, in checkpoint order.
  std::vector<SkippedTensor> skipped;
  // Files holding less data than their header describes (header-only or
  // truncated copies): accepted, since only headers are read.
  std::vector<std::string> short_files;
  int64_t files = 0;       // headers read
  int64_t bytes_read = 0;  // 8 + N per file (plus the index, by safetensors_files)
};

// The manifest of the tensors in `files`.
//
// Order: with `index`, its weight_map's; every tensor it lists must be in
// the file it names, and every tensor of those files must be listed
// (`files` must hold a header for each of index->files). Without, `files` in
// turn, each in its header's order (HF writes names sorted; the order is
// kept as written, never re-sorted).
//
// Each header is parsed and checked by ParseSafetensorsHeader
// (common/safetensors_header.h). Its data must not extend past what the
// entries describe; a data section shorter than that (a header-only copy) is
// accepted and listed in short_files: the data is never read.
//
// Dtypes: BF16, F16, F32 -> BF16, FP16, FP32; any other is INVALID_ARGUMENT
// naming the tensor and the dtype, or skipped under skip_unsupported.
// Experts as the HF importer marks them: a name holding "experts.N" (after
// a '.' or at the start, N followed by '.' or the end) carries `expert` N;
// fused stacks ("...experts.gate_up_proj", [E, ...]) keep their shape and
// no `expert`. Layouts are left unset (OUT_IN): a header does not say.
//
// Errors are INVALID_ARGUMENT and name the file (its path) and the tensor;
// untrusted input is quoted escaped and cut short (QuoteForMessage).
absl::StatusOr<SafetensorsImport> ImportSafetensorsHeaders(const std::vector<SafetensorsFileHeader>& files,
                                                           const SafetensorsIndex* index,
                                                           const SafetensorsImportOptions& options);

// The expert index a tensor name carries ("model.layers.0.mlp.experts.3.
// up_proj.weight" -> 3), or -1: the planner's reading of "experts.N".
int ExpertIndexFromName(absl::string_view name);

}  // namespace muonshard::importer

#endif  // MUONSHARD_IMPORTER_SAFETENSORS_IMPORT_H_
