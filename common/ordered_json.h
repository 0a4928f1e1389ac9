#ifndef MUONSHARD_COMMON_ORDERED_JSON_H_
#define MUONSHARD_COMMON_ORDERED_JSON_H_

// A strict JSON (RFC 8259) parser that keeps object members in the order the
// document writes them, for the inputs whose order is data: safetensors
// headers and their model.safetensors.index.json, whose key order is the
// model's tensor order. (google.protobuf.Struct, the project's JSON parser
// for configs, keeps members in a map and loses that order.)
//
// Strict: one value and whitespace only, valid UTF-8 in strings (no lone
// surrogate escapes), no control characters in strings, no duplicate keys in
// an object, nesting at most kMaxJsonDepth deep. Numbers keep their text;
// AsInt64 reads an integer literal exactly (no detour through double).
//
// Pure, no globals, never crashes on any input: it is a fuzz target. Errors
// are INVALID_ARGUMENT, give the byte offset, and quote at most a short,
// escaped excerpt of the input (QuoteForMessage).
//
// And the few helpers that write JSON by hand (JsonNumber, JsonObjectWriter).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonshard {

constexpr int kMaxJsonDepth = 64;

struct JsonMember;

class JsonValue {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  Kind kind() const { return kind_; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }

  bool bool_value() const { return bool_; }
  // The decoded string (kString) or the number as written (kNumber).
  const std::string& text() const { return text_; }
  // The integer a kNumber writes without fraction or exponent, when it fits
  // an int64; nothing otherwise.
  std::optional<int64_t> AsInt64() const;
  const std::vector<JsonValue>& elements() const { return elements_; }
  // In document order; keys are unique.
  const std::vector<JsonMember>& members() const { return members_; }
  // The member called `key` (linear: for small objects), or nullptr.
  const JsonValue* Find(absl::string_view key) const;

  // "object", "string", ...: for messages.
  static const char* KindName(Kind kind);

 private:
  friend class JsonParser;

  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  std::string text_;
  std::vector<JsonValue> elements_;
  std::vector<JsonMember> members_;
};

struct JsonMember {
  std::string key;
  JsonValue value;
};

// Parses `text` as one JSON value.
absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

// ---------------------------------------------------------------- writing
//
// For the JSON the project writes by hand (muonshardctl compare), under the
// rules of its proto3 JSON (common/proto_json.h): 64-bit integers are
// strings, doubles are exact, and the pretty layout is protobuf's.

// The JSON text of a double, exact: an integral value below 2^53 in
// magnitude as an integer ("9470208"), any other finite value as the
// shortest %g text that parses back to the same double ("0.1",
// "2.1604338675732557", "1e+300"); NaN and the infinities, which JSON lacks,
// as proto3 JSON writes them: the strings "NaN", "Infinity", "-Infinity".
std::string JsonNumber(double value);

// `text` as a JSON string literal: quoted, with '"', '\\' and control
// characters escaped (UTF-8 passes through).
std::string JsonString(absl::string_view text);

// A JSON object written member by member in the order given, laid out as
// protobuf's pretty printer lays out a message (one space of indent per
// level, "key": value), so it reads like the other `--output json`.
class JsonObjectWriter {
 public:
  // A double (JsonNumber).
  JsonObjectWriter& Number(absl::string_view key, double value);
  // A 64-bit integer: a JSON string, as proto3 JSON writes int64.
  JsonObjectWriter& Int64(absl::string_view key, int64_t value);
  // A JSON value given as text (e.g. a message's ToJson), re-indented to
  // sit one level down; trailing whitespace is dropped.
  JsonObjectWriter& Raw(absl::string_view key, absl::string_view json);
  // The object: "{\n \"key\": value,\n ...\n}" ("{}" with no members).
  std::string Finish() const;

 private:
  std::vector<std::string> members_;  // "\"key\": value"
};

// `text` for an error message: in double quotes, printable ASCII kept, every
// other byte (control, non-ASCII, binary) escaped, and cut with "..." once
// the quoted form would pass `max_chars` characters. Untrusted input is only
// ever shown through this.
std::string QuoteForMessage(absl::string_view text, size_t max_chars = 80);

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_ORDERED_JSON_H_
