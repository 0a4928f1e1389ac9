#ifndef MUONSHARD_COMMON_QUOTE_H_
#define MUONSHARD_COMMON_QUOTE_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace muonshard {

// Quotes user input for an error message: at most `max` bytes of it, C-escaped
// (absl::CHexEscape) so that binary input cannot reach a terminal raw, and, when
// cut, the full length: "abc..." (100000 bytes). Error lines then stay a few
// hundred characters long whatever a user or a corrupt file hands us.
std::string QuoteBounded(absl::string_view s, size_t max = 64);

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_QUOTE_H_
