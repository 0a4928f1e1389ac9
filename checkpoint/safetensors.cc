#include "checkpoint/safetensors.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace muonshard::checkpoint {
namespace {

// A checkpoint file whose header does not parse is corrupt: same words,
// DATA_LOSS.
absl::Status AsDataLoss(const absl::Status& s) {
  if (s.ok()) return s;
  return absl::DataLossError(s.message());
}

}  // namespace

absl::StatusOr<int64_t> SafetensorsHeaderLength(absl::string_view first8, int64_t file_size) {
  absl::StatusOr<int64_t> n = ::muonshard::SafetensorsHeaderLength(first8, file_size);
  if (!n.ok()) return AsDataLoss(n.status());
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, int64_t file_size) {
  absl::StatusOr<SafetensorsHeader> header = ::muonshard::ParseSafetensorsHeader(json);
  if (!header.ok()) return AsDataLoss(header.status());
  absl::Status sized = CheckSafetensorsDataSize(*header, file_size);
  if (!sized.ok()) return AsDataLoss(sized);
  // Offsets (then keys) give one order whatever order the header wrote.
  std::sort(header->entries.begin(), header->entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end, a.key) < std::tie(b.begin, b.end, b.key);
  });
  return header;
}

}  // namespace muonshard::checkpoint
