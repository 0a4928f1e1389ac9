#include "common/proto_json.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/json_util.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard {

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  // Scripts read fields like ranks[].rank: print zeros and empty lists too
  // instead of proto3's default of omitting them. A manifest prints what it
  // sets (the header says why).
  options.always_print_primitive_fields = message.GetDescriptor() != v1::ModelManifest::descriptor();
  options.add_whitespace = pretty;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("encoding ", message.GetTypeName(), " as JSON: ", status.ToString()));
  }
  return out;
}

absl::Status FromJson(absl::string_view json, google::protobuf::Message* message, absl::string_view what) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(google::protobuf::StringPiece(json.data(), json.size()),
                                                            message, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not a valid ", message->GetTypeName(), " JSON: ", std::string(status.message())));
  }
  return absl::OkStatus();
}

std::string SerializeDeterministic(const google::protobuf::Message& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return out;
}

}  // namespace muonshard
