#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace muonshard::checkpoint {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

constexpr absl::string_view kMetadataKey = "__metadata__";
// Integers above 2^53 do not survive the JSON parser's doubles; no real
// offset or dimension comes near.
constexpr double kMaxJsonInteger = 9007199254740992.0;

void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned char>(c));
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

std::string EncodeLength(uint64_t n) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return bytes;
}

absl::Status Corrupt(absl::string_view what) { return absl::DataLossError(absl::StrCat("safetensors header: ", what)); }

absl::StatusOr<int64_t> ToInteger(const Value& v, absl::string_view what) {
  if (v.kind_case() != Value::kNumberValue) return Corrupt(absl::StrCat(what, " is not a number"));
  const double d = v.number_value();
  if (!std::isfinite(d) || d < 0 || d > kMaxJsonInteger || d != std::floor(d)) {
    return Corrupt(absl::StrCat(what, " is not a non-negative integer"));
  }
  return static_cast<int64_t>(d);
}

absl::StatusOr<std::vector<int64_t>> ToIntegers(const Value& v, absl::string_view what) {
  if (v.kind_case() != Value::kListValue) return Corrupt(absl::StrCat(what, " is not a list"));
  std::vector<int64_t> out;
  for (const Value& item : v.list_value().values()) {
    auto n = ToInteger(item, what);
    if (!n.ok()) return n.status();
    out.push_back(*n);
  }
  return out;
}

const Value* Field(const Struct& s, absl::string_view name) {
  auto it = s.fields().find(std::string(name));
  return it == s.fields().end() ? nullptr : &it->second;
}

absl::StatusOr<std::map<std::string, std::string>> ParseMetadata(const Value& v) {
  if (v.kind_case() != Value::kStructValue) return Corrupt("__metadata__ is not an object");
  std::map<std::string, std::string> out;
  for (const auto& [k, value] : v.struct_value().fields()) {
    if (value.kind_case() != Value::kStringValue) {
      return Corrupt(absl::StrCat("__metadata__ \"", k, "\" is not a string"));
    }
    out[k] = value.string_value();
  }
  return out;
}

// Bytes of `shape` x `dtype`, refusing products that would overflow.
absl::StatusOr<int64_t> ByteSize(const std::vector<int64_t>& shape, int elem_bytes, absl::string_view key) {
  int64_t bytes = elem_bytes;
  for (int64_t d : shape) {
    if (d != 0 && bytes > (int64_t{1} << 62) / d) return Corrupt(absl::StrCat("key \"", key, "\": shape too large"));
    bytes *= d;
  }
  return bytes;
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& key, const Value& v) {
  if (v.kind_case() != Value::kStructValue) return Corrupt(absl::StrCat("key \"", key, "\" is not an object"));
  const Struct& s = v.struct_value();
  const Value* dtype = Field(s, "dtype");
  const Value* shape = Field(s, "shape");
  const Value* offsets = Field(s, "data_offsets");
  if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
    return Corrupt(absl::StrCat("key \"", key, "\" lacks dtype, shape or data_offsets"));
  }
  SafetensorsEntry e;
  e.key = key;
  if (dtype->kind_case() != Value::kStringValue || DTypeBytes(dtype->string_value()) == 0) {
    return Corrupt(absl::StrCat("key \"", key, "\": unknown dtype"));
  }
  e.dtype = dtype->string_value();
  auto dims = ToIntegers(*shape, absl::StrCat("key \"", key, "\" shape"));
  if (!dims.ok()) return dims.status();
  e.shape = *std::move(dims);
  auto range = ToIntegers(*offsets, absl::StrCat("key \"", key, "\" data_offsets"));
  if (!range.ok()) return range.status();
  if (range->size() != 2 || (*range)[0] > (*range)[1]) {
    return Corrupt(absl::StrCat("key \"", key, "\": data_offsets is not [begin, end]"));
  }
  e.begin = (*range)[0];
  e.end = (*range)[1];
  auto bytes = ByteSize(e.shape, DTypeBytes(e.dtype), key);
  if (!bytes.ok()) return bytes.status();
  if (*bytes != e.end - e.begin) {
    return Corrupt(
        absl::StrCat("key \"", key, "\": data_offsets span ", e.end - e.begin, " bytes, shape and dtype ", *bytes));
  }
  return e;
}

// The entries, sorted by offset, must tile [0, data_bytes).
absl::Status CheckTiling(const std::vector<SafetensorsEntry>& entries, int64_t data_bytes) {
  int64_t at = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : entries) {
    if (e.begin < at) {
      return Corrupt(absl::StrCat("overlapping data_offsets: \"", previous->key, "\" ends at ", at, ", \"", e.key,
                                  "\" begins at ", e.begin));
    }
    if (e.begin > at) return Corrupt(absl::StrCat("hole before \"", e.key, "\": bytes [", at, ", ", e.begin, ")"));
    if (e.end > data_bytes) {
      return Corrupt(absl::StrCat("key \"", e.key, "\" ends at ", e.end, ", past the data's ", data_bytes, " bytes"));
    }
    at = e.end;
    previous = &e;
  }
  if (at != data_bytes) return Corrupt(absl::StrCat(data_bytes - at, " bytes of data belong to no key"));
  return absl::OkStatus();
}

}  // namespace

int DTypeBytes(absl::string_view dtype) {
  static constexpr std::pair<absl::string_view, int> kSizes[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U64", 8}, {"U32", 4},  {"U16", 2},     {"U8", 1},      {"BOOL", 1}};
  for (const auto& [name, bytes] : kSizes) {
    if (name == dtype) return bytes;
  }
  return 0;
}

std::string EncodeSafetensorsHeader(const std::vector<SafetensorsEntry>& entries,
                                    const std::map<std::string, std::string>& metadata) {
  std::string json = "{";
  if (!metadata.empty()) {
    AppendJsonString(kMetadataKey, &json);
    json += ":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) json += ",";
      first = false;
      AppendJsonString(k, &json);
      json += ":";
      AppendJsonString(v, &json);
    }
    json += "}";
  }
  for (const SafetensorsEntry& e : entries) {
    if (json.size() > 1) json += ",";
    AppendJsonString(e.key, &json);
    json += ":{\"dtype\":";
    AppendJsonString(e.dtype, &json);
    json += ",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) absl::StrAppend(&json, i ? "," : "", e.shape[i]);
    absl::StrAppend(&json, "],\"data_offsets\":[", e.begin, ",", e.end, "]}");
  }
  json += "}";
  // Pad so that 8 + N is a multiple of 8: the data (fp32) starts aligned.
  json.append((8 - json.size() % 8) % 8, ' ');
  return EncodeLength(json.size()) + json;
}

absl::StatusOr<int64_t> SafetensorsHeaderLength(absl::string_view first8, int64_t file_size) {
  if (first8.size() < 8 || file_size < 8) {
    return Corrupt(absl::StrCat("truncated: ", file_size, " bytes, fewer than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(first8[i]);
  if (n < 2 || n > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    return Corrupt(absl::StrCat("header length ", n, " is out of range"));
  }
  if (static_cast<int64_t>(n) > file_size - 8) {
    return Corrupt(absl::StrCat("truncated: header of ", n, " bytes in a file of ", file_size));
  }
  return static_cast<int64_t>(n);
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, int64_t file_size) {
  Struct root;
  google::protobuf::util::JsonParseOptions options;
  auto parsed = google::protobuf::util::JsonStringToMessage(google::protobuf::StringPiece(json.data(), json.size()),
                                                            &root, options);
  if (!parsed.ok()) return Corrupt(absl::StrCat("not a JSON object: ", std::string(parsed.message())));
  SafetensorsHeader header;
  header.data_start = 8 + static_cast<int64_t>(json.size());
  if (header.data_start > file_size) {
    return Corrupt(absl::StrCat("truncated: header of ", json.size(), " bytes in a file of ", file_size));
  }
  for (const auto& [key, value] : root.fields()) {
    if (key == kMetadataKey) {
      auto metadata = ParseMetadata(value);
      if (!metadata.ok()) return metadata.status();
      header.metadata = *std::move(metadata);
      continue;
    }
    auto entry = ParseEntry(key, value);
    if (!entry.ok()) return entry.status();
    header.entries.push_back(*std::move(entry));
  }
  // The parsed map has no order; offsets (then keys) give a deterministic one.
  std::sort(header.entries.begin(), header.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end, a.key) < std::tie(b.begin, b.end, b.key);
  });
  absl::Status tiled = CheckTiling(header.entries, file_size - header.data_start);
  if (!tiled.ok()) return tiled;
  return header;
}

}  // namespace muonshard::checkpoint
