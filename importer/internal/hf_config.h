#ifndef MUONSHARD_IMPORTER_INTERNAL_HF_CONFIG_H_
#define MUONSHARD_IMPORTER_INTERNAL_HF_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/struct.pb.h"

namespace muonshard::importer::internal {

// Inclusive bounds of an integer field. The upper bounds keep a hostile or
// mistyped config from asking for billions of tensors.
struct IntRange {
  int64_t min = 0;
  int64_t max = 0;
};

constexpr int64_t kMaxDim = 2147483647;  // int32 max: no real config comes near it
constexpr int64_t kMaxCount = 1 << 16;   // layers, heads, experts
constexpr IntRange kDimRange{1, kMaxDim};
constexpr IntRange kCountRange{1, kMaxCount};
constexpr IntRange kOptionalCountRange{0, kMaxCount};

// Read-only, typed view of a HuggingFace `config.json`, parsed with protobuf's
// google.protobuf.Struct. Every error is INVALID_ARGUMENT and names the field
// ("config.json: missing field \"num_hidden_layers\""). A field set to JSON
// null counts as absent. A nested object (Object) names its fields with the
// path from the top ("text_config.hidden_size"). Immutable after Parse, so
// safe to share between threads.
class HfConfig {
 public:
  // INVALID_ARGUMENT when `json` is not a JSON object.
  static absl::StatusOr<HfConfig> Parse(absl::string_view json);

  // True when `key` is present and not null.
  bool Has(absl::string_view key) const;

  // A required integer within `range`.
  absl::StatusOr<int64_t> Int(absl::string_view key, IntRange range) const;
  // An optional integer within `range`; `fallback` when absent.
  absl::StatusOr<int64_t> IntOr(absl::string_view key, int64_t fallback, IntRange range) const;
  absl::StatusOr<bool> BoolOr(absl::string_view key, bool fallback) const;
  absl::StatusOr<std::string> String(absl::string_view key) const;
  absl::StatusOr<std::string> StringOr(absl::string_view key, absl::string_view fallback) const;
  // An optional list of integers within `range`; empty when absent.
  absl::StatusOr<std::vector<int64_t>> IntListOr(absl::string_view key, IntRange range) const;
  // A required nested object (Gemma 3's "text_config"), as a config of its own.
  absl::StatusOr<HfConfig> Object(absl::string_view key) const;

 private:
  HfConfig(google::protobuf::Struct root, std::string path_prefix)
      : root_(std::move(root)), path_prefix_(std::move(path_prefix)) {}

  // The value of `key`, or nullptr when absent or null.
  const google::protobuf::Value* Find(absl::string_view key) const;
  // `key` as error messages name it: with the path of the enclosing objects.
  std::string Path(absl::string_view key) const;
  static absl::StatusOr<int64_t> ToInt(absl::string_view path, const google::protobuf::Value& value, IntRange range);

  google::protobuf::Struct root_;
  std::string path_prefix_;  // "" at the top, "text_config." inside it
};

// Errors about one field, in the house wording.
absl::Status FieldError(absl::string_view key, absl::string_view problem);
absl::Status MissingField(absl::string_view key);

}  // namespace muonshard::importer::internal

#endif  // MUONSHARD_IMPORTER_INTERNAL_HF_CONFIG_H_
