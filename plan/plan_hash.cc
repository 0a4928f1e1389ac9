#include "plan/plan_hash.h"

#include <openssl/evp.h>

#include <array>
#include <cstdint>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace muonshard::planner {
namespace {

// SHA-256 of the deterministic serialization of a PlanRequest with all three
// fields set, streamed field by field so the manifest is never copied: the
// serializer writes into one reused chunk that is hashed whenever it fills
// (a manifest of ~70k tensors serializes to megabytes).
class Sha256Sink final : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  Sha256Sink() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  ~Sha256Sink() override { EVP_MD_CTX_free(ctx_); }
  Sha256Sink(const Sha256Sink&) = delete;
  Sha256Sink& operator=(const Sha256Sink&) = delete;

  // ZeroCopyOutputStream: hands out the chunk, hashing what it held.
  bool Next(void** data, int* size) override {
    Flush();
    *data = chunk_.data();
    *size = static_cast<int>(chunk_.size());
    used_ = chunk_.size();
    return true;
  }
  void BackUp(int count) override { used_ -= static_cast<size_t>(count); }
  int64_t ByteCount() const override { return hashed_ + static_cast<int64_t>(used_); }

  std::string HexDigest() {
    Flush();
    std::array<unsigned char, EVP_MAX_MD_SIZE> digest;
    unsigned int size = 0;
    EVP_DigestFinal_ex(ctx_, digest.data(), &size);
    return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest.data()), size));
  }

 private:
  void Flush() {
    EVP_DigestUpdate(ctx_, chunk_.data(), used_);
    hashed_ += static_cast<int64_t>(used_);
    used_ = 0;
  }

  EVP_MD_CTX* ctx_;
  std::array<char, 64 << 10> chunk_;
  size_t used_ = 0;
  int64_t hashed_ = 0;
};

// Appends field `field` (length-delimited) holding `m` to the stream, as a
// deterministic serialization of the enclosing message would.
void AddField(int field, const google::protobuf::Message& m, Sha256Sink& sink) {
  const size_t size = m.ByteSizeLong();
  google::protobuf::io::CodedOutputStream out(&sink);
  out.SetSerializationDeterministic(true);
  out.WriteTag(google::protobuf::internal::WireFormatLite::MakeTag(
      field, google::protobuf::internal::WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
  out.WriteVarint32(static_cast<uint32_t>(size));
  m.SerializeWithCachedSizes(&out);
}

}  // namespace

std::string RequestHash(const v1::ModelManifest& manifest, const v1::Topology& topology, const v1::PlanPolicy& policy) {
  // 64 KiB chunk: on the heap, not the stack.
  auto sink = std::make_unique<Sha256Sink>();
  AddField(v1::PlanRequest::kManifestFieldNumber, manifest, *sink);
  AddField(v1::PlanRequest::kTopologyFieldNumber, topology, *sink);
  AddField(v1::PlanRequest::kPolicyFieldNumber, policy, *sink);
  return absl::StrCat("sha256:", sink->HexDigest());
}

}  // namespace muonshard::planner
