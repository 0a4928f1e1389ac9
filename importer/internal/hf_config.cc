#include "importer/internal/hf_config.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace muonshard::importer::internal {
namespace {

using google::protobuf::Value;

// "a string", "1.5", ... for error messages about a value of the wrong kind.
std::string Describe(const Value& value) {
  switch (value.kind_case()) {
    case Value::kNumberValue:
      return absl::StrCat(value.number_value());
    case Value::kStringValue:
      return absl::StrCat("\"", value.string_value(), "\"");
    case Value::kBoolValue:
      return value.bool_value() ? "true" : "false";
    case Value::kStructValue:
      return "an object";
    case Value::kListValue:
      return "a list";
    default:
      return "null";
  }
}

absl::Status WrongKind(absl::string_view key, absl::string_view wanted, const Value& value) {
  return FieldError(key, absl::StrCat("must be ", wanted, ", got ", Describe(value)));
}

}  // namespace

absl::Status FieldError(absl::string_view key, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: field \"", key, "\" ", problem));
}

absl::Status MissingField(absl::string_view key) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: missing field \"", key, "\""));
}

absl::StatusOr<HfConfig> HfConfig::Parse(absl::string_view json) {
  google::protobuf::Struct root;
  auto status =
      google::protobuf::util::JsonStringToMessage(google::protobuf::StringPiece(json.data(), json.size()), &root);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: not a JSON object: ", std::string(status.message())));
  }
  return HfConfig(std::move(root), "");
}

const Value* HfConfig::Find(absl::string_view key) const {
  auto it = root_.fields().find(std::string(key));
  if (it == root_.fields().end() || it->second.kind_case() == Value::kNullValue) return nullptr;
  return &it->second;
}

bool HfConfig::Has(absl::string_view key) const { return Find(key) != nullptr; }

std::string HfConfig::Path(absl::string_view key) const { return absl::StrCat(path_prefix_, key); }

absl::StatusOr<int64_t> HfConfig::ToInt(absl::string_view path, const Value& value, IntRange range) {
  // JSON numbers arrive as doubles; every integer a config holds is far below
  // 2^53, so the conversion is exact once the value is known to be integral.
  if (value.kind_case() != Value::kNumberValue || std::trunc(value.number_value()) != value.number_value()) {
    return WrongKind(path, "an integer", value);
  }
  double v = value.number_value();
  if (v < static_cast<double>(range.min) || v > static_cast<double>(range.max)) {
    return FieldError(path, absl::StrCat("must be in [", range.min, ", ", range.max, "], got ", Describe(value)));
  }
  return static_cast<int64_t>(v);
}

absl::StatusOr<int64_t> HfConfig::Int(absl::string_view key, IntRange range) const {
  const Value* value = Find(key);
  if (value == nullptr) return MissingField(Path(key));
  return ToInt(Path(key), *value, range);
}

absl::StatusOr<int64_t> HfConfig::IntOr(absl::string_view key, int64_t fallback, IntRange range) const {
  const Value* value = Find(key);
  if (value == nullptr) return fallback;
  return ToInt(Path(key), *value, range);
}

absl::StatusOr<bool> HfConfig::BoolOr(absl::string_view key, bool fallback) const {
  const Value* value = Find(key);
  if (value == nullptr) return fallback;
  if (value->kind_case() != Value::kBoolValue) return WrongKind(Path(key), "true or false", *value);
  return value->bool_value();
}

absl::StatusOr<std::string> HfConfig::String(absl::string_view key) const {
  const Value* value = Find(key);
  if (value == nullptr) return MissingField(Path(key));
  if (value->kind_case() != Value::kStringValue) return WrongKind(Path(key), "a string", *value);
  return value->string_value();
}

absl::StatusOr<std::string> HfConfig::StringOr(absl::string_view key, absl::string_view fallback) const {
  if (!Has(key)) return std::string(fallback);
  return String(key);
}

absl::StatusOr<std::vector<int64_t>> HfConfig::IntListOr(absl::string_view key, IntRange range) const {
  std::vector<int64_t> out;
  const Value* value = Find(key);
  if (value == nullptr) return out;
  if (value->kind_case() != Value::kListValue) return WrongKind(Path(key), "a list of integers", *value);
  for (const Value& item : value->list_value().values()) {
    auto v = ToInt(Path(key), item, range);
    if (!v.ok()) return v.status();
    out.push_back(*v);
  }
  return out;
}

absl::StatusOr<HfConfig> HfConfig::Object(absl::string_view key) const {
  const Value* value = Find(key);
  if (value == nullptr) return MissingField(Path(key));
  if (value->kind_case() != Value::kStructValue) return WrongKind(Path(key), "an object", *value);
  return HfConfig(value->struct_value(), absl::StrCat(Path(key), "."));
}

}  // namespace muonshard::importer::internal
