#ifndef MUONSHARD_CHECKPOINT_INTERNAL_CHECKSUMS_H_
#define MUONSHARD_CHECKPOINT_INTERNAL_CHECKSUMS_H_

// checksums.sha256 of a step directory: the SHA-256 of each metadata file
// (index.json, plan.pb, request.pb) in sha256sum's text format, one
// "<64 lowercase hex>  <name>\n" per file, so `sha256sum -c checksums.sha256`
// in the step directory checks them without muonshard. The rank files are
// covered by the index's crc32s, so these sums cover every byte of a step.
// See NOTE [Metadata checksums] in writer.cc.

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace muonshard::checkpoint::internal {

// 64 lowercase hex digits.
std::string Sha256Hex(absl::string_view bytes);

struct NamedBytes {
  absl::string_view name;
  absl::string_view bytes;
};

// The file's content for `files`, in their order.
std::string EncodeChecksums(absl::Span<const NamedBytes> files);

// A parsed checksums file.
class Checksums {
 public:
  // DATA_LOSS naming `path` for a line that is not "<64 hex>  <name>", a
  // name listed twice or an empty file.
  static absl::StatusOr<Checksums> Parse(absl::string_view text, const std::string& path);

  // DATA_LOSS naming `file_path` and this file when `bytes` is not what the
  // file lists for `name`, or it lists nothing for it.
  absl::Status Check(absl::string_view name, absl::string_view bytes, const std::string& file_path) const;

 private:
  std::string path_;
  absl::flat_hash_map<std::string, std::string> by_name_;  // name -> hex
};

}  // namespace muonshard::checkpoint::internal

#endif  // MUONSHARD_CHECKPOINT_INTERNAL_CHECKSUMS_H_
