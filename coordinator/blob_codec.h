#ifndef MUONSHARD_COORDINATOR_BLOB_CODEC_H_
#define MUONSHARD_COORDINATOR_BLOB_CODEC_H_

// The on-disk form of plans and requests: "MSZ1", the raw size as 8 bytes
// little-endian, then the zlib stream of the message's deterministic
// serialization. Plans repeat tensor names and long runs of similar integers,
// so they compress several-fold; storing the plan itself (not only its
// request) keeps every stored version byte-exact even if the planner changes.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace muonshard::coordinator {

// Compresses the deterministic serialization of `message`.
std::string EncodeBlob(const google::protobuf::Message& message);

// Parses a blob into `message`. DATA_LOSS when it is truncated, corrupt or
// not a serialization of the message type; `what` names it in the error.
absl::Status DecodeBlob(absl::string_view blob, google::protobuf::Message* message, absl::string_view what);

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_BLOB_CODEC_H_
