#include "coordinator/blob_codec.h"

#include <zlib.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"

namespace muonshard::coordinator {
namespace {

constexpr absl::string_view kMagic = "MSZ1";
constexpr size_t kHeaderBytes = 12;  // magic + uint64 raw size
// No plan this coordinator accepts comes near this; a larger header is corrupt.
constexpr uint64_t kMaxRawBytes = uint64_t{8} << 30;

void AppendU64(uint64_t v, std::string* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t ReadU64(absl::string_view bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

}  // namespace

std::string EncodeBlob(const google::protobuf::Message& message) {
  const std::string raw = SerializeDeterministic(message);
  uLongf bound = compressBound(raw.size());
  std::string out(kMagic);
  AppendU64(raw.size(), &out);
  out.resize(kHeaderBytes + bound);
  // Level 1: plans are written once per version but big ones would otherwise
  // spend seconds here; the ratio difference to level 6 is small for them.
  int rc = compress2(reinterpret_cast<Bytef*>(&out[kHeaderBytes]), &bound, reinterpret_cast<const Bytef*>(raw.data()),
                     raw.size(), 1);
  // compress2 only fails on a too-small buffer or bad level, both excluded.
  if (rc != Z_OK) return std::string();
  out.resize(kHeaderBytes + bound);
  return out;
}

absl::Status DecodeBlob(absl::string_view blob, google::protobuf::Message* message, absl::string_view what) {
  if (blob.size() < kHeaderBytes || blob.substr(0, kMagic.size()) != kMagic) {
    return absl::DataLossError(absl::StrCat(what, ": not a muonshard blob"));
  }
  const uint64_t raw_size = ReadU64(blob.substr(kMagic.size(), 8));
  if (raw_size > kMaxRawBytes) {
    return absl::DataLossError(absl::StrCat(what, ": header claims ", raw_size, " bytes"));
  }
  std::string raw(raw_size, '\0');
  uLongf len = raw_size;
  blob.remove_prefix(kHeaderBytes);
  int rc =
      uncompress(reinterpret_cast<Bytef*>(raw.data()), &len, reinterpret_cast<const Bytef*>(blob.data()), blob.size());
  if (rc != Z_OK || len != raw_size) {
    return absl::DataLossError(absl::StrCat(what, ": zlib error ", rc));
  }
  if (!message->ParseFromString(raw)) {
    return absl::DataLossError(absl::StrCat(what, ": not a valid ", message->GetTypeName()));
  }
  return absl::OkStatus();
}

}  // namespace muonshard::coordinator
