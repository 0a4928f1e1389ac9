#ifndef MUONSHARD_COMMON_BYTE_SIZE_H_
#define MUONSHARD_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonshard {

// A byte count as people write one: "80GiB", "80 GiB", "141.5GB", "512MiB",
// "1073741824". Binary units KiB, MiB, GiB, TiB (also Ki, Mi, Gi, Ti, and the
// single letters K, M, G, T as nvidia-smi and Kubernetes mean them, 2^10n);
// decimal units kB, MB, GB, TB (10^3n); B or no unit: bytes. Case of the unit
// is ignored except that a lone "b" is bytes. INVALID_ARGUMENT for anything
// else, a value <= 0, or one past 2^63 bytes.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

// Comma-separated byte sizes: "80GiB" or "80GiB,80GiB,40GiB,40GiB". Errors
// name the item's position.
absl::StatusOr<std::vector<int64_t>> ParseByteSizeList(absl::string_view text);

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_BYTE_SIZE_H_
