#ifndef MUONSHARD_COMMON_STATUS_MACROS_H_
#define MUONSHARD_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

// Early-return helpers for absl::Status / absl::StatusOr (abseil has none in
// the Debian 12 release).
#define MUONSHARD_RETURN_IF_ERROR(expr)                    \
  do {                                                     \
    ::absl::Status _muonshard_status = (expr);             \
    if (!_muonshard_status.ok()) return _muonshard_status; \
  } while (0)

#define MUONSHARD_CONCAT_INNER_(a, b) a##b
#define MUONSHARD_CONCAT_(a, b) MUONSHARD_CONCAT_INNER_(a, b)

#define MUONSHARD_ASSIGN_OR_RETURN(lhs, rexpr) \
  MUONSHARD_ASSIGN_OR_RETURN_IMPL_(MUONSHARD_CONCAT_(_muonshard_statusor_, __LINE__), lhs, rexpr)

// `statusor` names a variable and `lhs` may declare one: neither can be
// parenthesised.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define MUONSHARD_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                     \
  if (!statusor.ok()) return std::move(statusor).status();     \
  lhs = std::move(statusor).value()
// NOLINTEND(bugprone-macro-parentheses)

namespace muonshard {

// Prefixes `context` to a non-OK status, keeping its code (one layer of
// context per boundary, TSL style).
inline absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_STATUS_MACROS_H_
