#include "common/safetensors_header.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/ordered_json.h"
#include "common/status_macros.h"

namespace muonshard {
namespace {

constexpr absl::string_view kMetadataKey = "__metadata__";
// Tensor names may be long ("model.layers.60.mlp.experts.255.gate_proj.weight");
// show more of them than of other input.
constexpr size_t kMaxQuotedName = 160;

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

absl::Status Corrupt(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors header: ", what));
}

std::string Tensor(absl::string_view key) { return absl::StrCat("tensor ", QuoteForMessage(key, kMaxQuotedName)); }

absl::StatusOr<int64_t> ToNonNegative(const JsonValue& v, absl::string_view what) {
  std::optional<int64_t> n = v.AsInt64();
  if (!n.has_value() || *n < 0) {
    const std::string shown =
        v.kind() == JsonValue::Kind::kNumber ? QuoteForMessage(v.text()) : JsonValue::KindName(v.kind());
    return Corrupt(absl::StrCat(what, ": ", shown, " is not a non-negative integer"));
  }
  return *n;
}

absl::StatusOr<std::vector<int64_t>> ToNonNegatives(const JsonValue& v, absl::string_view what) {
  if (!v.is_array()) return Corrupt(absl::StrCat(what, " is not a list"));
  std::vector<int64_t> out;
  out.reserve(v.elements().size());
  for (const JsonValue& item : v.elements()) {
    MUONSHARD_ASSIGN_OR_RETURN(int64_t n, ToNonNegative(item, what));
    out.push_back(n);
  }
  return out;
}

absl::StatusOr<std::map<std::string, std::string>> ParseMetadata(const JsonValue& v) {
  if (!v.is_object()) return Corrupt("__metadata__ is not an object");
  std::map<std::string, std::string> out;
  for (const JsonMember& m : v.members()) {
    if (!m.value.is_string()) {
      return Corrupt(absl::StrCat("__metadata__ ", QuoteForMessage(m.key), " is not a string"));
    }
    out[m.key] = m.value.text();
  }
  return out;
}

// Bytes of `shape` x `dtype`, refusing products that would overflow and
// sub-byte dtypes that end mid-byte.
absl::StatusOr<int64_t> ByteSize(const SafetensorsEntry& e) {
  int64_t bits = SafetensorsDTypeBits(e.dtype);
  for (int64_t d : e.shape) {
    if (d != 0 && bits > (int64_t{1} << 62) / d) return Corrupt(absl::StrCat(Tensor(e.key), ": shape too large"));
    bits *= d;
  }
  if (bits % 8 != 0) {
    return Corrupt(absl::StrCat(Tensor(e.key), ": shape x ", e.dtype, " is not a whole number of bytes"));
  }
  return bits / 8;
}

absl::Status CheckOffsets(const SafetensorsEntry& e) {
  if (e.begin > e.end) return Corrupt(absl::StrCat(Tensor(e.key), ": data_offsets is not [begin, end]"));
  MUONSHARD_ASSIGN_OR_RETURN(int64_t bytes, ByteSize(e));
  if (bytes != e.end - e.begin) {
    return Corrupt(
        absl::StrCat(Tensor(e.key), ": data_offsets span ", e.end - e.begin, " bytes, shape and dtype ", bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& key, const JsonValue& v) {
  if (key.empty()) return Corrupt("a tensor has an empty name");
  if (!v.is_object()) return Corrupt(absl::StrCat(Tensor(key), " is not an object"));
  const JsonValue* dtype = v.Find("dtype");
  const JsonValue* shape = v.Find("shape");
  const JsonValue* offsets = v.Find("data_offsets");
  if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
    return Corrupt(absl::StrCat(Tensor(key), " lacks dtype, shape or data_offsets"));
  }
  SafetensorsEntry e;
  e.key = key;
  if (!dtype->is_string() || SafetensorsDTypeBits(dtype->text()) == 0) {
    const std::string shown = dtype->is_string() ? QuoteForMessage(dtype->text()) : JsonValue::KindName(dtype->kind());
    return Corrupt(absl::StrCat(Tensor(key), ": unknown dtype ", shown));
  }
  e.dtype = dtype->text();
  MUONSHARD_ASSIGN_OR_RETURN(e.shape, ToNonNegatives(*shape, absl::StrCat(Tensor(key), " shape")));
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<int64_t> range,
                             ToNonNegatives(*offsets, absl::StrCat(Tensor(key), " data_offsets")));
  if (range.size() != 2) return Corrupt(absl::StrCat(Tensor(key), ": data_offsets is not [begin, end]"));
  e.begin = range[0];
  e.end = range[1];
  MUONSHARD_RETURN_IF_ERROR(CheckOffsets(e));
  return e;
}

// The entries' extents, in data order, must tile [0, end of the last): no
// overlap, no hole. Returns that end.
absl::StatusOr<int64_t> CheckTiling(const std::vector<SafetensorsEntry>& entries) {
  std::vector<size_t> order(entries.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&entries](size_t a, size_t b) {
    return std::tie(entries[a].begin, entries[a].end, entries[a].key) <
           std::tie(entries[b].begin, entries[b].end, entries[b].key);
  });
  int64_t at = 0;
  const SafetensorsEntry* previous = nullptr;
  for (size_t i : order) {
    const SafetensorsEntry& e = entries[i];
    if (e.begin < at) {
      return Corrupt(absl::StrCat("overlapping data_offsets: ", Tensor(previous->key), " ends at ", at, ", ",
                                  Tensor(e.key), " begins at ", e.begin));
    }
    if (e.begin > at) return Corrupt(absl::StrCat("hole before ", Tensor(e.key), ": bytes [", at, ", ", e.begin, ")"));
    at = e.end;
    previous = &e;
  }
  return at;
}

}  // namespace

int SafetensorsDTypeBits(absl::string_view dtype) {
  static constexpr std::pair<absl::string_view, int> kBits[] = {
      {"BOOL", 8},    {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},   {"I8", 8},    {"F8_E5M2", 8},
      {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"I16", 16},    {"U16", 16},    {"F16", 16}, {"BF16", 16}, {"I32", 32},
      {"U32", 32},    {"F32", 32},    {"C64", 64},    {"F64", 64},    {"I64", 64}, {"U64", 64}};
  for (const auto& [name, bits] : kBits) {
    if (name == dtype) return bits;
  }
  return 0;
}

int SafetensorsDTypeBytes(absl::string_view dtype) {
  const int bits = SafetensorsDTypeBits(dtype);
  return bits % 8 == 0 ? bits / 8 : 0;
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
    return Corrupt(absl::StrCat("header length ", n, " is out of range (2 to ", kMaxSafetensorsHeaderBytes, ")"));
  }
  if (static_cast<int64_t>(n) > file_size - 8) {
    return Corrupt(absl::StrCat("truncated: header of ", n, " bytes in a file of ", file_size));
  }
  return static_cast<int64_t>(n);
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json) {
  absl::StatusOr<JsonValue> root = ParseJson(json);
  if (!root.ok()) return Corrupt(absl::StrCat("not a JSON object: ", root.status().message()));
  if (!root->is_object()) {
    return Corrupt(absl::StrCat("not a JSON object: the header is ", JsonValue::KindName(root->kind())));
  }
  SafetensorsHeader header;
  header.data_start = 8 + static_cast<int64_t>(json.size());
  header.entries.reserve(root->members().size());
  for (const JsonMember& m : root->members()) {
    if (m.key == kMetadataKey) {
      MUONSHARD_ASSIGN_OR_RETURN(header.metadata, ParseMetadata(m.value));
      continue;
    }
    MUONSHARD_ASSIGN_OR_RETURN(SafetensorsEntry entry, ParseEntry(m.key, m.value));
    header.entries.push_back(std::move(entry));
  }
  MUONSHARD_ASSIGN_OR_RETURN(header.data_size, CheckTiling(header.entries));
  return header;
}

absl::Status CheckSafetensorsDataSize(const SafetensorsHeader& header, int64_t file_size) {
  const int64_t available = file_size - header.data_start;
  if (available < 0) {
    return Corrupt(absl::StrCat("truncated: header ends at byte ", header.data_start, " of a file of ", file_size));
  }
  if (header.data_size > available) {
    const SafetensorsEntry* first_past = nullptr;
    for (const SafetensorsEntry& e : header.entries) {
      if (e.end > available && (first_past == nullptr || e.begin < first_past->begin)) first_past = &e;
    }
    return Corrupt(
        absl::StrCat(Tensor(first_past->key), " ends at ", first_past->end, ", past the data's ", available, " bytes"));
  }
  if (header.data_size < available) {
    return Corrupt(absl::StrCat(available - header.data_size, " bytes of data belong to no key"));
  }
  return absl::OkStatus();
}

}  // namespace muonshard
