#ifndef MUONSHARD_COMMON_PROTO_JSON_H_
#define MUONSHARD_COMMON_PROTO_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace muonshard {

// proto3 JSON with the original (snake_case) field names, the house format for
// manifests, plans and every `--output json`. Fields at their default value
// (0, "", empty lists) are printed too, so scripts can rely on them.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message,
                                   bool pretty = true);

// Parses proto3 JSON (either field-name spelling); unknown fields are errors.
// `what` names the input in error messages.
absl::Status FromJson(absl::string_view json, google::protobuf::Message* message,
                      absl::string_view what);

// Deterministic binary serialization (stable across runs of one build).
std::string SerializeDeterministic(const google::protobuf::Message& message);

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_PROTO_JSON_H_
