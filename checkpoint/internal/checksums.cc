#include "checkpoint/internal/checksums.h"

#include <openssl/evp.h>
#include <zlib.h>

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace muonshard::checkpoint::internal {
namespace {

// zlib takes at most this many bytes per call here (1 GiB).
constexpr int64_t kMaxCrcBytes = int64_t{1} << 30;
constexpr size_t kHexDigits = 64;
// sha256sum's separator for a file hashed in text mode (the default).
constexpr absl::string_view kSeparator = "  ";

bool IsLowerHex(absl::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// A name of a file inside the step directory: no path, no control bytes.
bool IsPlainName(absl::string_view name) {
  if (name.empty() || name == "." || name == ".." || absl::StrContains(name, '/')) return false;
  for (char c : name) {
    if (static_cast<unsigned char>(c) < 0x20) return false;
  }
  return true;
}

}  // namespace

uint32_t Crc32(uint32_t crc, const void* data, int64_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const int64_t len = std::min<int64_t>(n, kMaxCrcBytes);
    crc = static_cast<uint32_t>(::crc32_z(crc, p, static_cast<z_size_t>(len)));
    p += len;
    n -= len;
  }
  return crc;
}

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, int64_t length_b) {
  return static_cast<uint32_t>(::crc32_combine(crc_a, crc_b, static_cast<z_off_t>(length_b)));
}

std::string Sha256Hex(absl::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  // One-shot EVP_Digest cannot fail for SHA-256 short of an allocation
  // failure, which the rest of the process would not survive either.
  EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), size));
}

std::string EncodeChecksums(absl::Span<const NamedBytes> files) {
  std::string out;
  for (const NamedBytes& f : files) absl::StrAppend(&out, Sha256Hex(f.bytes), kSeparator, f.name, "\n");
  return out;
}

absl::StatusOr<Checksums> Checksums::Parse(absl::string_view text, const std::string& path) {
  Checksums sums;
  sums.path_ = path;
  if (!absl::ConsumeSuffix(&text, "\n") || text.empty()) {
    return absl::DataLossError(absl::StrCat(path, ": empty or not ending in a newline (truncated?)"));
  }
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    absl::string_view hex = line.substr(0, kHexDigits);
    absl::string_view rest = line.substr(hex.size());
    if (hex.size() != kHexDigits || !IsLowerHex(hex) || !absl::ConsumePrefix(&rest, kSeparator) || !IsPlainName(rest)) {
      return absl::DataLossError(absl::StrCat(path, ": line ", line_number, " is not \"<sha256 hex>  <file name>\""));
    }
    if (!sums.by_name_.emplace(std::string(rest), std::string(hex)).second) {
      return absl::DataLossError(absl::StrCat(path, ": \"", rest, "\" is listed twice"));
    }
  }
  return sums;
}

absl::Status Checksums::Check(absl::string_view name, absl::string_view bytes, const std::string& file_path) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::DataLossError(absl::StrCat(file_path, ": not listed in ", path_, " (damaged checksums)"));
  }
  const std::string actual = Sha256Hex(bytes);
  if (actual != it->second) {
    return absl::DataLossError(
        absl::StrCat(file_path, ": sha256 ", actual, ", ", path_, " says ", it->second, " (corrupt or edited)"));
  }
  return absl::OkStatus();
}

}  // namespace muonshard::checkpoint::internal
