#ifndef MUONSHARD_CHECKPOINT_INTERNAL_CHECKSUMS_H_
#define MUONSHARD_CHECKPOINT_INTERNAL_CHECKSUMS_H_

// The checksums of a checkpoint: zlib's crc32 of the rank files' bytes (per
// chunk and per file, kept in the index) and checksums.sha256 of a step
// directory: the SHA-256 of each metadata file
// (index.json, plan.pb, request.pb) in sha256sum's text format, one
// "<64 lowercase hex>  <name>\n" per file, so `sha256sum -c checksums.sha256`
// in the step directory checks them without muonshard. The rank files are
// covered by the index's crc32s, so these sums cover every byte of a step.
// See NOTE [Metadata checksums] in writer.cc.

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace muonshard::checkpoint::internal {

uint32_t Crc32(uint32_t crc, const void* data, int64_t n);
// crc32 of A followed by B, from crc32(A), crc32(B) and B's length.
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, int64_t length_b);

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
