#include "common/ordered_json.h"

#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace muonshard {
namespace {

// Objects up to this size are checked for duplicate keys pairwise.
constexpr size_t kSmallObject = 8;
// Bytes of input shown after "near" in a syntax error.
constexpr size_t kExcerptBytes = 24;

bool IsWhitespace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void AppendUtf8(uint32_t code_point, std::string* out) {
  if (code_point < 0x80) {
    out->push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

// The length of the well-formed UTF-8 sequence (2 to 4 bytes) at the start of
// `s`, or 0 (overlong forms, surrogates and code points past U+10FFFF are
// ill-formed; Unicode table 3-7).
size_t Utf8SequenceLength(absl::string_view s) {
  const auto byte = [&s](size_t i) { return i < s.size() ? static_cast<unsigned char>(s[i]) : 0; };
  const unsigned char lead = byte(0);
  size_t length = 0;
  unsigned char low = 0x80;
  unsigned char high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  }
  return length;
}

}  // namespace

// Recursive descent over one document; at most kMaxJsonDepth levels deep.
class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue value;
    MUONSHARD_RETURN_IF_ERROR(ParseValue(0, &value));
    SkipWhitespace();
    if (pos_ != text_.size()) return Error("unexpected data after the JSON value");
    return value;
  }

 private:
  absl::Status ParseValue(int depth, JsonValue* out) {
    SkipWhitespace();
    if (pos_ >= text_.size()) return Error("expected a value");
    switch (text_[pos_]) {
      case '{':
        return ParseObject(depth, out);
      case '[':
        return ParseArray(depth, out);
      case '"':
        out->kind_ = JsonValue::Kind::kString;
        return ParseString(&out->text_);
      case 't':
        out->bool_ = true;
        return ParseLiteral("true", JsonValue::Kind::kBool, out);
      case 'f':
        return ParseLiteral("false", JsonValue::Kind::kBool, out);
      case 'n':
        return ParseLiteral("null", JsonValue::Kind::kNull, out);
      default:
        return ParseNumber(out);
    }
  }

  absl::Status ParseObject(int depth, JsonValue* out) {
    if (depth >= kMaxJsonDepth) return Error(absl::StrCat("nested more than ", kMaxJsonDepth, " levels deep"));
    out->kind_ = JsonValue::Kind::kObject;
    ++pos_;  // '{'
    std::vector<size_t> key_positions;
    SkipWhitespace();
    if (Consume('}')) return absl::OkStatus();
    do {
      SkipWhitespace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Error("expected a string key");
      key_positions.push_back(pos_);
      JsonMember& member = out->members_.emplace_back();
      MUONSHARD_RETURN_IF_ERROR(ParseString(&member.key));
      SkipWhitespace();
      if (!Consume(':')) return Error("expected ':'");
      MUONSHARD_RETURN_IF_ERROR(ParseValue(depth + 1, &member.value));
      SkipWhitespace();
    } while (Consume(','));
    if (!Consume('}')) return Error("expected ',' or '}'");
    return CheckUniqueKeys(out->members_, key_positions);
  }

  absl::Status CheckUniqueKeys(const std::vector<JsonMember>& members, const std::vector<size_t>& positions) {
    int duplicate = -1;
    if (members.size() <= kSmallObject) {
      for (size_t i = 1; i < members.size() && duplicate < 0; ++i) {
        for (size_t j = 0; j < i; ++j) {
          if (members[i].key == members[j].key) {
            duplicate = static_cast<int>(i);
            break;
          }
        }
      }
    } else {
      absl::flat_hash_set<absl::string_view> seen;
      seen.reserve(members.size());
      for (size_t i = 0; i < members.size(); ++i) {
        if (!seen.insert(members[i].key).second) {
          duplicate = static_cast<int>(i);
          break;
        }
      }
    }
    if (duplicate < 0) return absl::OkStatus();
    pos_ = positions[duplicate];
    return Error(absl::StrCat("duplicate key ", QuoteForMessage(members[duplicate].key)));
  }

  absl::Status ParseArray(int depth, JsonValue* out) {
    if (depth >= kMaxJsonDepth) return Error(absl::StrCat("nested more than ", kMaxJsonDepth, " levels deep"));
    out->kind_ = JsonValue::Kind::kArray;
    ++pos_;  // '['
    SkipWhitespace();
    if (Consume(']')) return absl::OkStatus();
    do {
      MUONSHARD_RETURN_IF_ERROR(ParseValue(depth + 1, &out->elements_.emplace_back()));
      SkipWhitespace();
    } while (Consume(','));
    if (!Consume(']')) return Error("expected ',' or ']'");
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // '"'
    while (true) {
      const size_t run = pos_;
      while (pos_ < text_.size()) {
        const unsigned char c = static_cast<unsigned char>(text_[pos_]);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
        ++pos_;
      }
      out->append(text_.data() + run, pos_ - run);
      if (pos_ >= text_.size()) return Error("unterminated string");
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c == '\\') {
        MUONSHARD_RETURN_IF_ERROR(ParseEscape(out));
      } else if (c < 0x20) {
        return Error("control character in a string");
      } else {
        const size_t length = Utf8SequenceLength(text_.substr(pos_));
        if (length == 0) return Error("invalid UTF-8 in a string");
        out->append(text_.data() + pos_, length);
        pos_ += length;
      }
    }
  }

  absl::Status ParseEscape(std::string* out) {
    ++pos_;  // '\\'
    if (pos_ >= text_.size()) return Error("unterminated string");
    const char c = text_[pos_++];
    switch (c) {
      case '"':
      case '\\':
      case '/':
        out->push_back(c);
        return absl::OkStatus();
      case 'b':
        out->push_back('\b');
        return absl::OkStatus();
      case 'f':
        out->push_back('\f');
        return absl::OkStatus();
      case 'n':
        out->push_back('\n');
        return absl::OkStatus();
      case 'r':
        out->push_back('\r');
        return absl::OkStatus();
      case 't':
        out->push_back('\t');
        return absl::OkStatus();
      case 'u':
        return ParseUnicodeEscape(out);
      default:
        --pos_;
        return Error("invalid escape in a string");
    }
  }

  // After "\u": four hex digits, a surrogate pair as two escapes.
  absl::Status ParseUnicodeEscape(std::string* out) {
    MUONSHARD_ASSIGN_OR_RETURN(uint32_t code_point, ReadHex4());
    if (code_point >= 0xDC00 && code_point <= 0xDFFF) return Error("lone low surrogate escape");
    if (code_point >= 0xD800 && code_point <= 0xDBFF) {
      if (text_.substr(pos_, 2) != "\\u") return Error("high surrogate escape without its low half");
      pos_ += 2;
      MUONSHARD_ASSIGN_OR_RETURN(uint32_t low, ReadHex4());
      if (low < 0xDC00 || low > 0xDFFF) return Error("high surrogate escape without its low half");
      code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
    }
    AppendUtf8(code_point, out);
    return absl::OkStatus();
  }

  absl::StatusOr<uint32_t> ReadHex4() {
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const int digit = pos_ < text_.size() ? HexValue(text_[pos_]) : -1;
      if (digit < 0) return Error("\\u needs four hex digits");
      value = value * 16 + static_cast<uint32_t>(digit);
      ++pos_;
    }
    return value;
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  absl::Status ParseNumber(JsonValue* out) {
    const size_t start = pos_;
    Consume('-');
    if (Consume('0')) {
      // no further integer digits: "01" is not JSON
    } else if (pos_ < text_.size() && IsDigit(text_[pos_])) {
      SkipDigits();
    } else {
      pos_ = start;
      return Error("expected a value");
    }
    if (Consume('.') && !SkipDigits()) return Error("expected a digit after '.'");
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (!Consume('+')) Consume('-');
      if (!SkipDigits()) return Error("expected a digit in the exponent");
    }
    out->kind_ = JsonValue::Kind::kNumber;
    out->text_ = std::string(text_.substr(start, pos_ - start));
    return absl::OkStatus();
  }

  absl::Status ParseLiteral(absl::string_view word, JsonValue::Kind kind, JsonValue* out) {
    if (text_.substr(pos_, word.size()) != word) return Error("expected a value");
    pos_ += word.size();
    out->kind_ = kind;
    return absl::OkStatus();
  }

  // True when at least one digit was skipped.
  bool SkipDigits() {
    const size_t start = pos_;
    while (pos_ < text_.size() && IsDigit(text_[pos_])) ++pos_;
    return pos_ > start;
  }

  void SkipWhitespace() {
    while (pos_ < text_.size() && IsWhitespace(text_[pos_])) ++pos_;
  }

  bool Consume(char c) {
    if (pos_ >= text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }

  absl::Status Error(absl::string_view what) const {
    if (pos_ >= text_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("not JSON: ", what, " at the end of the input (byte ", pos_, ")"));
    }
    return absl::InvalidArgumentError(absl::StrCat("not JSON: ", what, " at byte ", pos_, ", near ",
                                                   QuoteForMessage(text_.substr(pos_, kExcerptBytes))));
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

std::optional<int64_t> JsonValue::AsInt64() const {
  if (kind_ != Kind::kNumber || text_.find_first_of(".eE") != std::string::npos) return std::nullopt;
  int64_t value = 0;
  if (!absl::SimpleAtoi(text_, &value)) return std::nullopt;
  return value;
}

const JsonValue* JsonValue::Find(absl::string_view key) const {
  for (const JsonMember& member : members_) {
    if (member.key == key) return &member.value;
  }
  return nullptr;
}

const char* JsonValue::KindName(Kind kind) {
  switch (kind) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return "a boolean";
    case Kind::kNumber:
      return "a number";
    case Kind::kString:
      return "a string";
    case Kind::kArray:
      return "an array";
    case Kind::kObject:
      return "an object";
  }
  return "?";
}

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) { return JsonParser(text).ParseDocument(); }

std::string QuoteForMessage(absl::string_view text, size_t max_chars) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    std::string piece;
    if (c == '"' || c == '\\') {
      piece = {'\\', static_cast<char>(c)};
    } else if (c >= 0x20 && c < 0x7F) {
      piece = std::string(1, static_cast<char>(c));
    } else if (c == '\n') {
      piece = "\\n";
    } else if (c == '\t') {
      piece = "\\t";
    } else {
      piece = absl::StrFormat("\\x%02x", c);
    }
    if (out.size() + piece.size() + 1 > max_chars) return out + "\"...";
    out += piece;
  }
  return out + "\"";
}

std::string JsonNumber(double value) {
  if (std::isnan(value)) return "\"NaN\"";
  if (std::isinf(value)) return value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  constexpr double kExactIntegers = 9007199254740992.0;  // 2^53
  if (std::trunc(value) == value && std::fabs(value) < kExactIntegers) {
    return absl::StrFormat("%.0f", value);
  }
  for (int digits = 1; digits < 17; ++digits) {
    std::string text = absl::StrFormat("%.*g", digits, value);
    double back = 0;
    if (absl::SimpleAtod(text, &back) && back == value) return text;
  }
  return absl::StrFormat("%.17g", value);  // always round-trips
}

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

JsonObjectWriter& JsonObjectWriter::Number(absl::string_view key, double value) {
  members_.push_back(absl::StrCat(JsonString(key), ": ", JsonNumber(value)));
  return *this;
}

JsonObjectWriter& JsonObjectWriter::Int64(absl::string_view key, int64_t value) {
  members_.push_back(absl::StrCat(JsonString(key), ": \"", value, "\""));
  return *this;
}

JsonObjectWriter& JsonObjectWriter::Raw(absl::string_view key, absl::string_view json) {
  while (!json.empty() && IsWhitespace(json.back())) json.remove_suffix(1);
  std::string member = absl::StrCat(JsonString(key), ": ");
  for (const char c : json) {
    member += c;
    if (c == '\n') member += ' ';  // one level down
  }
  members_.push_back(std::move(member));
  return *this;
}

std::string JsonObjectWriter::Finish() const {
  if (members_.empty()) return "{}";
  return absl::StrCat("{\n ", absl::StrJoin(members_, ",\n "), "\n}");
}

}  // namespace muonshard
