#include "common/quote.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace muonshard {

std::string QuoteBounded(absl::string_view s, size_t max) {
  if (s.size() <= max) return absl::StrCat("\"", absl::CHexEscape(s), "\"");
  // ASCII "..." rather than an ellipsis: the result must stay printable ASCII.
  return absl::StrCat("\"", absl::CHexEscape(s.substr(0, max)), "...\" (", s.size(), " bytes)");
}

}  // namespace muonshard
