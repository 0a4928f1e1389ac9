// The safetensors header codec: round trip, a file built by hand byte by
// byte, and malformed headers rejected (DATA_LOSS) without crashing.
#include "checkpoint/safetensors.h"

#include <cstring>
#include <ostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::checkpoint {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

std::string LittleEndian64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// A whole file: length, `json` verbatim, then `data_bytes` zero bytes.
std::string FileWith(const std::string& json, int64_t data_bytes) {
  return LittleEndian64(json.size()) + json + std::string(static_cast<size_t>(data_bytes), '\0');
}

absl::StatusOr<SafetensorsHeader> Parse(const std::string& file) {
  auto n = SafetensorsHeaderLength(absl::string_view(file).substr(0, 8), static_cast<int64_t>(file.size()));
  if (!n.ok()) return n.status();
  return ParseSafetensorsHeader(absl::string_view(file).substr(8, static_cast<size_t>(*n)),
                                static_cast<int64_t>(file.size()));
}

TEST(SafetensorsTest, EncodeThenParse_RoundTripsEntriesAndMetadata) {
  std::vector<SafetensorsEntry> entries = {
      {"a/master/0-3", "F32", {3}, 0, 12}, {"b \"quoted\"\\", "F32", {2, 2}, 12, 28}, {"c", "BF16", {1}, 28, 30}};
  const std::string header = EncodeSafetensorsHeader(entries, {{"step", "7"}, {"plan_hash", "sha256:x"}});
  EXPECT_EQ(header.size() % 8, 0u) << "data must start 8-byte aligned";
  const std::string file = header + std::string(30, '\0');
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsHeader parsed, Parse(file));
  EXPECT_EQ(parsed.data_start, static_cast<int64_t>(header.size()));
  ASSERT_THAT(parsed.entries, SizeIs(3));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(parsed.entries[i].key, entries[i].key);
    EXPECT_EQ(parsed.entries[i].dtype, entries[i].dtype);
    EXPECT_EQ(parsed.entries[i].shape, entries[i].shape);
    EXPECT_EQ(parsed.entries[i].begin, entries[i].begin);
    EXPECT_EQ(parsed.entries[i].end, entries[i].end);
  }
  EXPECT_EQ(parsed.metadata.at("step"), "7");
  EXPECT_EQ(parsed.metadata.at("plan_hash"), "sha256:x");
}

TEST(SafetensorsTest, ParseHandBuiltFile_KnownBytes) {
  // The example of the safetensors README: one F32 [2] tensor holding 1.0, 2.0.
  const std::string json = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string file = LittleEndian64(json.size()) + json;
  const float values[2] = {1.0f, 2.0f};
  file.append(reinterpret_cast<const char*>(values), sizeof(values));
  ASSERT_EQ(file.substr(0, 8), std::string("\x36\0\0\0\0\0\0\0", 8)) << "54-byte header, little-endian";
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsHeader parsed, Parse(file));
  ASSERT_THAT(parsed.entries, SizeIs(1));
  EXPECT_EQ(parsed.data_start, 8 + 54);
  EXPECT_THAT(parsed.entries[0].shape, ElementsAre(2));
  float read[2];
  std::memcpy(read, file.data() + parsed.data_start + parsed.entries[0].begin, sizeof(read));
  EXPECT_EQ(read[0], 1.0f);
  EXPECT_EQ(read[1], 2.0f);
}

TEST(SafetensorsTest, EncodedHeader_MatchesTheSpecByteForByte) {
  const std::string header = EncodeSafetensorsHeader({{"w", "F32", {2}, 0, 8}}, {});
  const std::string json = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  // 54 bytes of JSON + 2 spaces: 8 + 56 is a multiple of 8.
  EXPECT_EQ(header, LittleEndian64(56) + json + "  ");
}

TEST(SafetensorsTest, EmptyFile_NoTensors) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsHeader parsed, Parse(EncodeSafetensorsHeader({}, {})));
  EXPECT_THAT(parsed.entries, SizeIs(0));
}

struct Malformed {
  const char* name;
  std::string file;
  const char* message;
};

void PrintTo(const Malformed& m, std::ostream* os) { *os << m.name; }

class SafetensorsMalformedTest : public ::testing::TestWithParam<Malformed> {};

TEST_P(SafetensorsMalformedTest, IsDataLoss) {
  EXPECT_THAT(Parse(GetParam().file), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(GetParam().message)));
}

const std::string kOne = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

INSTANTIATE_TEST_SUITE_P(
    Inputs, SafetensorsMalformedTest,
    ::testing::Values(
        Malformed{"Empty", "", "truncated"}, Malformed{"ShortLength", "\x05\0\0", "truncated"},
        Malformed{"LengthPastEnd", LittleEndian64(1000) + "{}", "truncated"},
        Malformed{"HugeLength", LittleEndian64(~0ull) + "{}", "out of range"},
        Malformed{"TruncatedData", FileWith(kOne, 4), "past the data"},
        Malformed{"NotJson", FileWith("{\"w\": [1,", 0), "not a JSON object"},
        Malformed{"JsonArray", FileWith("[1,2,3]", 0), "not a JSON object"},
        Malformed{"Overlap",
                  FileWith(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                           12),
                  "overlapping"},
        Malformed{"Hole",
                  FileWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                           12),
                  "hole"},
        Malformed{"OutOfBounds", FileWith(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
                  "past the data"},
        Malformed{"TrailingBytes", FileWith(kOne, 12), "belong to no key"},
        Malformed{"SizeMismatch", FileWith(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                  "shape and dtype"},
        Malformed{"ReversedOffsets", FileWith(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
                  "not [begin, end]"},
        Malformed{"NegativeDim", FileWith(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                  "non-negative integer"},
        Malformed{"FractionalOffset", FileWith(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.5]}})", 8),
                  "integer"},
        Malformed{"UnknownDtype", FileWith(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8),
                  "unknown dtype"},
        Malformed{"MissingField", FileWith(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "lacks"},
        Malformed{"EntryNotObject", FileWith(R"({"a":7})", 0), "not an object"},
        Malformed{"MetadataNotStrings", FileWith(R"({"__metadata__":{"step":7}})", 0), "not a string"},
        Malformed{"HugeShape",
                  FileWith(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
                  "too large"}),
    [](const ::testing::TestParamInfo<Malformed>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace muonshard::checkpoint
