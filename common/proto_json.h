#ifndef MUONSHARD_COMMON_PROTO_JSON_H_
#define MUONSHARD_COMMON_PROTO_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace muonshard {

// proto3 JSON with the original (snake_case) field names, the house format for
// manifests, plans and every `--output json`:
//  - Fields at their default value (0, "", empty lists, X_UNSPECIFIED) are
//    printed too, so scripts can rely on them; except in a ModelManifest (at
//    the top), an input written by hand as often as generated: it prints the
//    fields it sets, as the bundled examples/manifests/ are written (its
//    UNSPECIFIED optimizer, layout and tp_split mean "the rules decide").
//  - int64 / uint64 are JSON strings ("shape": ["1024", "256"]); int32,
//    double and bool are numbers. Doubles are exact: the text parses back to
//    the same value (15 significant digits when they do, else 17).
//  - Enums are their names in the .proto ("BALANCED", "OWNER_CHANGED").
// Pretty output indents one space per level and ends in a newline.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool pretty = true);

// Parses proto3 JSON (either field-name spelling); unknown fields are errors.
// `what` names the input in error messages.
absl::Status FromJson(absl::string_view json, google::protobuf::Message* message, absl::string_view what);

// Deterministic binary serialization (stable across runs of one build).
std::string SerializeDeterministic(const google::protobuf::Message& message);

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_PROTO_JSON_H_
