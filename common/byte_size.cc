#include "common/byte_size.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/quote.h"

namespace muonshard {
namespace {

struct Unit {
  const char* name;  // lower case
  double factor;
};

constexpr double kKi = 1024.0;
constexpr double kK = 1000.0;
constexpr Unit kUnits[] = {
    {"", 1},
    {"b", 1},
    {"k", kKi},
    {"ki", kKi},
    {"kib", kKi},
    {"kb", kK},
    {"m", kKi* kKi},
    {"mi", kKi* kKi},
    {"mib", kKi* kKi},
    {"mb", kK* kK},
    {"g", kKi* kKi* kKi},
    {"gi", kKi* kKi* kKi},
    {"gib", kKi* kKi* kKi},
    {"gb", kK* kK* kK},
    {"t", kKi* kKi* kKi* kKi},
    {"ti", kKi* kKi* kKi* kKi},
    {"tib", kKi* kKi* kKi* kKi},
    {"tb", kK* kK* kK* kK},
};

absl::Status Bad(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(QuoteBounded(text), ": ", why));
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  size_t split = 0;
  while (split < trimmed.size() && (absl::ascii_isdigit(trimmed[split]) || trimmed[split] == '.')) ++split;
  double value = 0;
  if (split == 0 || !absl::SimpleAtod(trimmed.substr(0, split), &value)) {
    return Bad(text, "not a byte size (e.g. 80GiB, 512MiB, 141GB or a number of bytes)");
  }
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(trimmed.substr(split)));
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    const double bytes = std::floor(value * u.factor);
    if (bytes < 1) return Bad(text, "must be at least 1 byte");
    if (bytes >= 9.2e18) return Bad(text, "is too large");
    return static_cast<int64_t>(bytes);
  }
  return Bad(text, "unknown unit (KiB, MiB, GiB, TiB; kB, MB, GB, TB; or B)");
}

absl::StatusOr<std::vector<int64_t>> ParseByteSizeList(absl::string_view text) {
  std::vector<int64_t> out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    absl::StatusOr<int64_t> bytes = ParseByteSize(item);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("item ", out.size(), ": ", bytes.status().message()));
    }
    out.push_back(*bytes);
  }
  return out;
}

}  // namespace muonshard
