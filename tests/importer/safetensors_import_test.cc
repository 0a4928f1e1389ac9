// The safetensors importer: manifests from headers the tests write into a
// fresh temporary directory (one file, an index with two shards), their
// order, experts, dtypes, every malformed input named clearly, and data that
// is never read. Also the shared pieces it stands on: the ordered JSON parser
// and the safetensors header parser (common/), under random damage.
#include "importer/safetensors_import.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/ordered_json.h"
#include "common/safetensors_header.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "importer/safetensors_files.h"
#include "plan/planner.h"
#include "tests/testing/fault_injection_env.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace muonshard::importer {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

// One tensor as a test writes it.
struct Spec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

int64_t ByteCount(const Spec& t) {
  int64_t n = SafetensorsDTypeBytes(t.dtype);
  for (int64_t d : t.shape) n *= d;
  return n;
}

// The 8-byte length and JSON header of `tensors`, keys in the given order,
// their data laid out in that order.
std::string HeaderOf(const std::vector<Spec>& tensors, const std::map<std::string, std::string>& metadata = {}) {
  std::vector<SafetensorsEntry> entries;
  int64_t at = 0;
  for (const Spec& t : tensors) {
    entries.push_back({t.name, t.dtype, t.shape, at, at + ByteCount(t)});
    at += ByteCount(t);
  }
  return EncodeSafetensorsHeader(entries, metadata);
}

int64_t DataBytes(const std::vector<Spec>& tensors) {
  int64_t n = 0;
  for (const Spec& t : tensors) n += ByteCount(t);
  return n;
}

// A whole, valid file: header, then zeros for the data.
std::string FileOf(const std::vector<Spec>& tensors) {
  return HeaderOf(tensors) + std::string(static_cast<size_t>(DataBytes(tensors)), '\0');
}

std::string LittleEndian64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// Length, `json` verbatim, then `data_bytes` zeros.
std::string RawFile(const std::string& json, int64_t data_bytes) {
  return LittleEndian64(json.size()) + json + std::string(static_cast<size_t>(data_bytes), '\0');
}

// An HF index: weight_map in the given order.
std::string IndexJson(const std::vector<std::pair<std::string, std::string>>& weight_map) {
  std::vector<std::string> members;
  for (const auto& [tensor, file] : weight_map) members.push_back(absl::StrCat("\"", tensor, "\": \"", file, "\""));
  return absl::StrCat("{\n  \"metadata\": {\"total_size\": 1234},\n  \"weight_map\": {\n    ",
                      absl::StrJoin(members, ",\n    "), "\n  }\n}\n");
}

std::vector<std::string> Names(const v1::ModelManifest& m) {
  std::vector<std::string> names;
  for (const v1::TensorSpec& t : m.tensors()) names.push_back(t.name());
  return names;
}

std::vector<int64_t> ShapeOf(const v1::TensorSpec& t) { return {t.shape().begin(), t.shape().end()}; }

// Printable ASCII only: what error messages may show.
bool AllPrintable(absl::string_view s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

class SafetensorsImportTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(tmp_.path().empty()) << "mkdtemp failed"; }

  // A new directory `name` under the test's own temporary directory.
  std::string Dir(const std::string& name) {
    const std::string dir = tmp_.Join(name);
    EXPECT_EQ(::mkdir(dir.c_str(), 0755), 0) << dir;
    return dir;
  }

  static void Write(const std::string& path, const std::string& bytes) {
    MUONSHARD_ASSERT_OK(WriteFileAtomic(path, bytes));
  }

  // A two-shard checkpoint in `dir`: shard 1 holds the embedding and layer
  // 0's k_proj, shard 2 layer 0's q_proj and the head; the index lists them
  // in model order, which is neither shard's.
  void WriteTwoShards(const std::string& dir) {
    Write(dir + "/model-00001-of-00002.safetensors",
          FileOf({{"model.embed_tokens.weight", "BF16", {32, 8}},
                  {"model.layers.0.self_attn.k_proj.weight", "BF16", {4, 8}}}));
    Write(dir + "/model-00002-of-00002.safetensors",
          FileOf({{"lm_head.weight", "BF16", {32, 8}}, {"model.layers.0.self_attn.q_proj.weight", "BF16", {8, 8}}}));
    Write(dir + "/model.safetensors.index.json",
          IndexJson({{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                     {"model.layers.0.self_attn.q_proj.weight", "model-00002-of-00002.safetensors"},
                     {"model.layers.0.self_attn.k_proj.weight", "model-00001-of-00002.safetensors"},
                     {"lm_head.weight", "model-00002-of-00002.safetensors"}}));
  }

  muonshard::testing::TempDir tmp_;
};

TEST_F(SafetensorsImportTest, SingleFile_NamesShapesDtypesInHeaderOrder) {
  const std::string dir = Dir("Tiny-Llama");
  const std::vector<Spec> tensors = {{"model.embed_tokens.weight", "BF16", {16, 4}},
                                     {"model.layers.0.mlp.down_proj.weight", "F16", {4, 6}},
                                     {"model.norm.weight", "F32", {4}},
                                     {"model.layers.0.input_layernorm.weight", "BF16", {4}}};
  const std::string header = HeaderOf(tensors, {{"format", "pt"}});
  Write(dir + "/model.safetensors", header + std::string(static_cast<size_t>(DataBytes(tensors)), '\0'));

  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport imported, ImportSafetensors(dir, {}));
  const v1::ModelManifest& m = imported.manifest;
  EXPECT_EQ(m.model(), "Tiny-Llama");  // the directory's name
  EXPECT_THAT(Names(m), ElementsAre("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight",
                                    "model.norm.weight", "model.layers.0.input_layernorm.weight"));
  EXPECT_THAT(ShapeOf(m.tensors(0)), ElementsAre(16, 4));
  EXPECT_THAT(ShapeOf(m.tensors(2)), ElementsAre(4));
  EXPECT_EQ(m.tensors(0).dtype(), v1::BF16);
  EXPECT_EQ(m.tensors(1).dtype(), v1::FP16);
  EXPECT_EQ(m.tensors(2).dtype(), v1::FP32);
  for (const v1::TensorSpec& t : m.tensors()) {
    EXPECT_FALSE(t.has_expert()) << t.name();
    EXPECT_EQ(t.layout(), v1::LAYOUT_UNSPECIFIED) << t.name();
  }
  EXPECT_EQ(imported.files, 1);
  EXPECT_EQ(imported.bytes_read, static_cast<int64_t>(header.size())) << "the header, not the data";
  EXPECT_THAT(imported.skipped, IsEmpty());
  EXPECT_THAT(imported.short_files, IsEmpty());
}

TEST_F(SafetensorsImportTest, ModelName_FromOptionFileStemOrDirectory) {
  const std::string dir = Dir("ckpt");
  const std::vector<Spec> one = {{"w", "F32", {2, 2}}};
  Write(dir + "/tiny-moe.safetensors", FileOf(one));
  Write(dir + "/model.safetensors", FileOf(one));

  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport stem, ImportSafetensors(dir + "/tiny-moe.safetensors", {}));
  EXPECT_EQ(stem.manifest.model(), "tiny-moe");
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport standard, ImportSafetensors(dir + "/model.safetensors", {}));
  EXPECT_EQ(standard.manifest.model(), "ckpt");  // the standard name says nothing: the directory does
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport slash, ImportSafetensors(dir + "/", {}));
  EXPECT_EQ(slash.manifest.model(), "ckpt");
  SafetensorsImportOptions named;
  named.name = "Mine";
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport option, ImportSafetensors(dir, named));
  EXPECT_EQ(option.manifest.model(), "Mine");
}

TEST_F(SafetensorsImportTest, HeaderOrder_KeptAsWrittenNotSortedNorByOffset) {
  const std::string dir = Dir("order");
  // Keys in neither name nor offset order: "b" first, its data second.
  const std::string json = R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                           R"("model.layers.10.w":{"dtype":"F32","shape":[1],"data_offsets":[16,20]},)"
                           R"("__metadata__":{"format":"pt"},)"
                           R"("model.layers.2.w":{"dtype":"F32","shape":[1],"data_offsets":[20,24]},)"
                           R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  Write(dir + "/model.safetensors", RawFile(json, 24));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport imported, ImportSafetensors(dir, {}));
  EXPECT_THAT(Names(imported.manifest), ElementsAre("b", "model.layers.10.w", "model.layers.2.w", "a"));
}

TEST_F(SafetensorsImportTest, ShardedIndex_TwoShardsInWeightMapOrder) {
  const std::string dir = Dir("Sharded-Model");
  WriteTwoShards(dir);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport imported, ImportSafetensors(dir, {}));
  EXPECT_EQ(imported.manifest.model(), "Sharded-Model");
  EXPECT_THAT(Names(imported.manifest),
              ElementsAre("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                          "model.layers.0.self_attn.k_proj.weight", "lm_head.weight"));
  EXPECT_THAT(ShapeOf(imported.manifest.tensors(1)), ElementsAre(8, 8));
  EXPECT_EQ(imported.files, 2);

  // The index file itself names the same checkpoint.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport by_index,
                                 ImportSafetensors(dir + "/model.safetensors.index.json", {}));
  EXPECT_EQ(by_index.manifest.SerializeAsString(), imported.manifest.SerializeAsString());
}

TEST_F(SafetensorsImportTest, DirectoryWithBoth_TakesModelSafetensorsAsTransformersDoes) {
  const std::string dir = Dir("both");
  WriteTwoShards(dir);
  Write(dir + "/model.safetensors", FileOf({{"only", "F32", {1}}}));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport imported, ImportSafetensors(dir, {}));
  EXPECT_THAT(Names(imported.manifest), ElementsAre("only"));
}

TEST_F(SafetensorsImportTest, Experts_FromNamesAsTheHfImporterMarksThem) {
  const std::string dir = Dir("moe");
  std::vector<Spec> tensors = {{"model.layers.0.mlp.gate.weight", "BF16", {4, 8}}};
  for (int e = 0; e < 4; ++e) {
    tensors.push_back({absl::StrCat("model.layers.0.mlp.experts.", e, ".up_proj.weight"), "BF16", {16, 8}});
  }
  tensors.push_back({"model.layers.0.mlp.shared_experts.up_proj.weight", "BF16", {16, 8}});
  tensors.push_back({"model.layers.1.mlp.experts.gate_up_proj", "BF16", {4, 8, 32}});
  tensors.push_back({"model.layers.1.mlp.experts.down_proj", "BF16", {4, 16, 8}});
  tensors.push_back({"model.layers.1.block_sparse_moe.experts.12.w1.weight", "BF16", {16, 8}});
  Write(dir + "/model.safetensors", FileOf(tensors));

  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport imported, ImportSafetensors(dir, {}));
  const v1::ModelManifest& m = imported.manifest;
  ASSERT_EQ(m.tensors_size(), 9);
  EXPECT_FALSE(m.tensors(0).has_expert()) << "the router is not an expert";
  for (int e = 0; e < 4; ++e) {
    ASSERT_TRUE(m.tensors(1 + e).has_expert()) << m.tensors(1 + e).name();
    EXPECT_EQ(m.tensors(1 + e).expert(), e);
  }
  EXPECT_FALSE(m.tensors(5).has_expert()) << "shared_experts.* is no routed expert";
  const v1::TensorSpec& fused = m.tensors(6);
  EXPECT_FALSE(fused.has_expert()) << "a fused stack holds every expert";
  EXPECT_THAT(ShapeOf(fused), ElementsAre(4, 8, 32)) << "fused stacks stay 3-D";
  EXPECT_EQ(m.tensors(8).expert(), 12);
}

TEST_F(SafetensorsImportTest, Experts_ThePlannerAgreesWithTheMarks) {
  const std::string dir = Dir("moe-plan");
  std::vector<Spec> tensors = {{"model.embed_tokens.weight", "BF16", {32, 8}}};
  for (int e = 0; e < 4; ++e) {
    tensors.push_back({absl::StrCat("model.layers.0.mlp.experts.", e, ".up_proj.weight"), "BF16", {16, 8}});
  }
  tensors.push_back({"model.layers.0.mlp.experts.gate_up_proj", "BF16", {4, 8, 32}});
  Write(dir + "/model.safetensors", FileOf(tensors));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport imported, ImportSafetensors(dir, {}));
  v1::PlanRequest request;
  *request.mutable_manifest() = imported.manifest;
  request.mutable_topology()->set_world_size(2);
  request.mutable_topology()->set_ep(2);
  MUONSHARD_EXPECT_OK(planner::ComputePlan(request).status());
}

TEST(ExpertIndexFromNameTest, ReadsExpertsNAfterADotOrAtTheStart) {
  EXPECT_EQ(ExpertIndexFromName("model.layers.0.mlp.experts.3.up_proj.weight"), 3);
  EXPECT_EQ(ExpertIndexFromName("experts.7"), 7);
  EXPECT_EQ(ExpertIndexFromName("a.experts.250.w"), 250);
  EXPECT_EQ(ExpertIndexFromName("model.layers.0.mlp.shared_experts.0.w"), -1);
  EXPECT_EQ(ExpertIndexFromName("model.layers.0.mlp.experts.3a.w"), -1);
  EXPECT_EQ(ExpertIndexFromName("model.layers.0.mlp.experts.gate_up_proj"), -1);
  EXPECT_EQ(ExpertIndexFromName("x.experts.99999999999.w"), -1) << "past int32";
}

TEST_F(SafetensorsImportTest, UnsupportedDtype_NamesTensorAndDtypeOrIsSkipped) {
  const std::string dir = Dir("fp8");
  const std::string path = dir + "/model.safetensors";
  Write(path, FileOf({{"model.embed_tokens.weight", "BF16", {8, 4}},
                      {"model.layers.0.mlp.up_proj.weight", "F8_E4M3", {8, 4}},
                      {"model.layers.0.mlp.up_proj.weight_scale_inv", "F32", {1, 1}},
                      {"position_ids", "I64", {1, 8}}}));
  EXPECT_THAT(ImportSafetensors(dir, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path), HasSubstr("\"model.layers.0.mlp.up_proj.weight\""), HasSubstr("F8_E4M3"),
                             HasSubstr("skip_unsupported"))));
  SafetensorsImportOptions skip;
  skip.skip_unsupported = true;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport imported, ImportSafetensors(dir, skip));
  EXPECT_THAT(Names(imported.manifest),
              ElementsAre("model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight_scale_inv"));
  ASSERT_THAT(imported.skipped, SizeIs(2));
  EXPECT_EQ(imported.skipped[0].name, "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(imported.skipped[0].dtype, "F8_E4M3");
  EXPECT_EQ(imported.skipped[1].dtype, "I64");
  EXPECT_EQ(imported.skipped[1].file, path);
}

TEST_F(SafetensorsImportTest, NothingSupported_IsAnErrorEvenWhenSkipping) {
  const std::string dir = Dir("ints");
  Write(dir + "/model.safetensors", FileOf({{"a", "I64", {2}}, {"b", "U8", {3}}}));
  SafetensorsImportOptions skip;
  skip.skip_unsupported = true;
  EXPECT_THAT(ImportSafetensors(dir, skip),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no BF16, F16 or F32 tensors (2 skipped)")));
  Write(dir + "/empty.safetensors", HeaderOf({}));
  EXPECT_THAT(ImportSafetensors(dir + "/empty.safetensors", {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds no tensors")));
}

// Only headers are read, so a copy without its data (or with part of it)
// imports the same; it is listed in short_files. Bytes after the last tensor
// are refused instead: they mean the header is missing tensors.
TEST_F(SafetensorsImportTest, DataSection_NeverRead_HeaderOnlyAndTruncatedCopiesImport) {
  const std::string dir = Dir("header-only");
  const std::vector<Spec> tensors = {{"w1", "BF16", {1024, 512}}, {"w2", "F32", {256}}};
  Write(dir + "/full.safetensors", FileOf(tensors));
  Write(dir + "/header.safetensors", HeaderOf(tensors));
  Write(dir + "/half.safetensors", HeaderOf(tensors) + std::string(static_cast<size_t>(DataBytes(tensors) / 2), 'x'));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport full, ImportSafetensors(dir + "/full.safetensors", {}));
  EXPECT_THAT(full.short_files, IsEmpty());
  for (const char* name : {"header", "half"}) {
    const std::string path = absl::StrCat(dir, "/", name, ".safetensors");
    MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport copy, ImportSafetensors(path, {}));
    EXPECT_THAT(Names(copy.manifest), ElementsAre("w1", "w2"));
    EXPECT_THAT(ShapeOf(copy.manifest.tensors(0)), ElementsAre(1024, 512));
    EXPECT_THAT(copy.short_files, ElementsAre(path));
  }
  Write(dir + "/longer.safetensors", FileOf(tensors) + "trailing");
  EXPECT_THAT(ImportSafetensors(dir + "/longer.safetensors", {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("longer.safetensors"), HasSubstr("8 bytes of data belong to no key"))));
}

struct Malformed {
  const char* name;
  std::string file;
  const char* message;
};

void PrintTo(const Malformed& m, std::ostream* os) { *os << m.name; }

class SafetensorsMalformedTest : public ::testing::TestWithParam<Malformed> {};

TEST_P(SafetensorsMalformedTest, InvalidArgumentNamingTheFile) {
  muonshard::testing::TempDir tmp;
  const std::string path = tmp.Join("bad.safetensors");
  MUONSHARD_ASSERT_OK(WriteFileAtomic(path, GetParam().file));
  absl::StatusOr<SafetensorsImport> imported = ImportSafetensors(path, {});
  EXPECT_THAT(imported,
              StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr(path), HasSubstr(GetParam().message))));
  EXPECT_TRUE(AllPrintable(imported.status().message())) << imported.status().message();
  EXPECT_LT(imported.status().message().size(), 400u) << imported.status().message();
}

std::string OneTensor(const std::string& entry) { return RawFile(absl::StrCat(R"({"w":)", entry, "}"), 8); }

INSTANTIATE_TEST_SUITE_P(
    Inputs, SafetensorsMalformedTest,
    ::testing::Values(
        Malformed{"Empty", "", "truncated"}, Malformed{"ShorterThanTheLength", "\x05\0\0", "truncated"},
        Malformed{"HeaderLongerThanTheFile", LittleEndian64(1000) + "{}", "truncated: header of 1000 bytes"},
        Malformed{"HeaderOver100MB", LittleEndian64(100'000'001) + "{}", "out of range"},
        Malformed{"NotJson", RawFile("{\"w\": [1,", 0), "not a JSON object"},
        Malformed{"BinaryGarbage", RawFile(std::string("\x89PNG\r\n\x1a\n\x00\x01\xff{", 12), 0), "not a JSON object"},
        Malformed{"JsonArray", RawFile("[1,2,3]", 0), "not a JSON object"},
        Malformed{"TrailingGarbage", RawFile("{} x", 0), "unexpected data after the JSON value"},
        Malformed{"EntryNotObject", RawFile(R"({"w":7})", 0), "tensor \"w\" is not an object"},
        Malformed{"NoDtype", OneTensor(R"({"shape":[2],"data_offsets":[0,8]})"), "lacks dtype, shape or data_offsets"},
        Malformed{"NoShape", OneTensor(R"({"dtype":"F32","data_offsets":[0,8]})"),
                  "lacks dtype, shape or data_offsets"},
        Malformed{"NoOffsets", OneTensor(R"({"dtype":"F32","shape":[2]})"), "lacks dtype, shape or data_offsets"},
        Malformed{"NegativeDim", OneTensor(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"),
                  "\"-2\" is not a non-negative integer"},
        Malformed{"FractionalDim", OneTensor(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})"),
                  "not a non-negative integer"},
        Malformed{"StringDim", OneTensor(R"({"dtype":"F32","shape":["2"],"data_offsets":[0,8]})"),
                  "a string is not a non-negative integer"},
        Malformed{"DimPastInt64", OneTensor(R"({"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]})"),
                  "not a non-negative integer"},
        Malformed{"ShapeNotList", OneTensor(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})"),
                  "shape is not a list"},
        Malformed{"UnknownDtype", OneTensor(R"({"dtype":"F33","shape":[2],"data_offsets":[0,8]})"),
                  "unknown dtype \"F33\""},
        Malformed{"SpanNotShapeTimesDtype", OneTensor(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"),
                  "data_offsets span 8 bytes, shape and dtype 12"},
        Malformed{"ReversedOffsets", OneTensor(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"),
                  "not [begin, end]"},
        Malformed{"ThreeOffsets", OneTensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8,8]})"),
                  "not [begin, end]"},
        Malformed{"HugeShape", OneTensor(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})"),
                  "too large"},
        Malformed{"Overlap",
                  RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          12),
                  "overlapping data_offsets"},
        Malformed{"Hole",
                  RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                          12),
                  "hole before tensor \"b\""},
        Malformed{"NotFromZero", OneTensor(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})"), "hole before"},
        Malformed{"DuplicateName",
                  RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          8),
                  "duplicate key \"a\""},
        Malformed{"EmptyName", RawFile(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4), "empty name"},
        Malformed{"MetadataNotStrings", RawFile(R"({"__metadata__":{"step":7}})", 0), "not a string"},
        Malformed{"SubByteMidByte", OneTensor(R"({"dtype":"F4","shape":[3],"data_offsets":[0,2]})"),
                  "not a whole number of bytes"},
        Malformed{"BadUtf8Name", RawFile("{\"w\xff\":{}}", 0), "invalid UTF-8"},
        Malformed{"ControlCharInName", RawFile("{\"w\x01\":{}}", 0), "control character"},
        Malformed{"LoneSurrogate", RawFile(R"({"w\ud800":{}})", 0), "surrogate"}),
    [](const ::testing::TestParamInfo<Malformed>& info) { return std::string(info.param.name); });

TEST_F(SafetensorsImportTest, BadInputIsQuotedEscapedAndCutShort) {
  const std::string dir = Dir("quoted");
  const std::string name = absl::StrCat("evil\\u001b[31m", std::string(300, 'x'));
  Write(dir + "/model.safetensors",
        RawFile(absl::StrCat(R"({")", name, R"(":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})"), 8));
  absl::StatusOr<SafetensorsImport> imported = ImportSafetensors(dir, {});
  ASSERT_THAT(imported, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"evil\\x1b[31mxxx")));
  EXPECT_TRUE(AllPrintable(imported.status().message())) << imported.status().message();
  EXPECT_THAT(imported.status().message(), HasSubstr("...")) << "a 300-byte name is cut";
  EXPECT_LT(imported.status().message().size(), 400u);

  std::string binary = "{";
  for (int i = 0; i < 256; ++i) binary.push_back(static_cast<char>(i));
  Write(dir + "/binary.safetensors", RawFile(binary, 0));
  imported = ImportSafetensors(dir + "/binary.safetensors", {});
  ASSERT_THAT(imported, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("near \"\\x00\\x01")));
  EXPECT_TRUE(AllPrintable(imported.status().message())) << imported.status().message();
}

TEST_F(SafetensorsImportTest, Index_MissingShard_NotFoundNamingIt) {
  const std::string dir = Dir("missing-shard");
  WriteTwoShards(dir);
  ASSERT_EQ(std::remove((dir + "/model-00002-of-00002.safetensors").c_str()), 0);
  EXPECT_THAT(ImportSafetensors(dir, {}),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("model.safetensors.index.json"),
                             HasSubstr("\"model-00002-of-00002.safetensors\""), HasSubstr("does not exist"))));
}

TEST_F(SafetensorsImportTest, Index_TensorNotInTheNamedShard_NamesBoth) {
  const std::string dir = Dir("wrong-shard");
  WriteTwoShards(dir);
  // lm_head lives in shard 2; say shard 1.
  Write(dir + "/model.safetensors.index.json",
        IndexJson({{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                   {"model.layers.0.self_attn.q_proj.weight", "model-00002-of-00002.safetensors"},
                   {"model.layers.0.self_attn.k_proj.weight", "model-00001-of-00002.safetensors"},
                   {"lm_head.weight", "model-00001-of-00002.safetensors"}}));
  EXPECT_THAT(ImportSafetensors(dir, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model-00001-of-00002.safetensors: holds no tensor \"lm_head.weight\""),
                             HasSubstr("it is in " + dir + "/model-00002-of-00002.safetensors"))));
  // A tensor no shard holds.
  Write(dir + "/model.safetensors.index.json",
        IndexJson({{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                   {"model.norm.weight", "model-00002-of-00002.safetensors"}}));
  EXPECT_THAT(ImportSafetensors(dir, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model-00002-of-00002.safetensors: holds no tensor \"model.norm.weight\"")));
}

TEST_F(SafetensorsImportTest, Index_ShardTensorTheIndexDoesNotList_IsAnError) {
  const std::string dir = Dir("unlisted");
  WriteTwoShards(dir);
  Write(dir + "/model.safetensors.index.json",
        IndexJson({{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                   {"model.layers.0.self_attn.q_proj.weight", "model-00002-of-00002.safetensors"},
                   {"lm_head.weight", "model-00002-of-00002.safetensors"}}));
  EXPECT_THAT(ImportSafetensors(dir, {}), StatusIs(absl::StatusCode::kInvalidArgument,
                                                   AllOf(HasSubstr("model-00001-of-00002.safetensors: holds tensor "
                                                                   "\"model.layers.0.self_attn.k_proj.weight\""),
                                                         HasSubstr("does not list"))));
}

TEST_F(SafetensorsImportTest, DuplicateAcrossShards_NamesBothFiles) {
  const std::string dir = Dir("duplicate");
  WriteTwoShards(dir);
  Write(dir + "/model-00002-of-00002.safetensors", FileOf({{"lm_head.weight", "BF16", {32, 8}},
                                                           {"model.layers.0.self_attn.q_proj.weight", "BF16", {8, 8}},
                                                           {"model.embed_tokens.weight", "BF16", {32, 8}}}));
  EXPECT_THAT(ImportSafetensors(dir, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model-00002-of-00002.safetensors: tensor \"model.embed_tokens.weight\" is "
                                       "also in "),
                             HasSubstr("model-00001-of-00002.safetensors"))));

  // Without an index too (the pure importer, files in turn).
  const std::vector<Spec> a = {{"w", "F32", {1}}};
  const std::vector<Spec> b = {{"v", "F32", {1}}, {"w", "F32", {1}}};
  std::vector<SafetensorsFileHeader> files(2);
  files[0] = {"a.safetensors", "", static_cast<int64_t>(FileOf(a).size()), HeaderOf(a).substr(8)};
  files[1] = {"b.safetensors", "", static_cast<int64_t>(FileOf(b).size()), HeaderOf(b).substr(8)};
  EXPECT_THAT(
      ImportSafetensorsHeaders(files, nullptr, {}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("b.safetensors: tensor \"w\" is also in a.safetensors")));
}

TEST_F(SafetensorsImportTest, Index_Malformed_NamesTheIndex) {
  struct Case {
    std::string json;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"{\"weight_map\": ", "not a JSON object"},
      {"[]", "not a JSON object: it is an array"},
      {R"({"metadata": {}})", "no \"weight_map\""},
      {R"({"weight_map": []})", "\"weight_map\" is an array, not an object"},
      {R"({"weight_map": {}})", "\"weight_map\" is empty"},
      {R"({"weight_map": {"w": 3}})", "tensor \"w\" maps to a number, not a file name"},
      {R"({"weight_map": {"w": "../model.safetensors"}})",
       "\"../model.safetensors\", not a file name beside the index"},
      {R"({"weight_map": {"w": ".."}})", "not a file name beside the index"},
      {R"({"weight_map": {"w": "a.safetensors", "w": "b.safetensors"}})", "duplicate key \"w\""},
  };
  const std::string dir = Dir("bad-index");
  const std::string index = dir + "/model.safetensors.index.json";
  for (const Case& c : cases) {
    Write(index, c.json);
    EXPECT_THAT(ImportSafetensors(dir, {}),
                StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr(index + ": "), HasSubstr(c.message))))
        << c.json;
  }
}

TEST_F(SafetensorsImportTest, MissingOrOddInputs) {
  EXPECT_THAT(ImportSafetensors(tmp_.Join("nope"), {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope: no such file or directory")));
  const std::string empty = Dir("empty");
  EXPECT_THAT(ImportSafetensors(empty, {}),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("holds neither model.safetensors nor model.safetensors.index.json")));
  // A FIFO is refused at once, not waited on.
  const std::string fifo = tmp_.Join("fifo.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(ImportSafetensors(fifo, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
}

// The files are read through the Env, so injected faults reach the importer:
// each error names the file it hit.
TEST_F(SafetensorsImportTest, Env_FaultsReachTheImporterNamingTheFile) {
  const std::string dir = Dir("faults");
  WriteTwoShards(dir);
  const std::string shard2 = dir + "/model-00002-of-00002.safetensors";
  muonshard::testing::FaultInjectionEnv env(Env::Default(), tmp_.Join("trash"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport clean, ImportSafetensors(&env, dir, {}));
  EXPECT_EQ(clean.files, 2);
  EXPECT_THAT(env.calls(), Contains(Field(&muonshard::testing::FsCall::path, shard2)));

  env.AddRule({muonshard::testing::FaultKind::kError, EIO, muonshard::testing::FsOp::kRead, "00002-of", 1});
  EXPECT_THAT(ImportSafetensors(&env, dir, {}),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("cannot read"), HasSubstr(shard2))));
  env.AddRule({muonshard::testing::FaultKind::kShortRead, 0, muonshard::testing::FsOp::kRead, "00002-of", 1});
  EXPECT_THAT(ImportSafetensors(&env, dir, {}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(shard2 + ": file shrank while being read")));
  env.AddRule(
      {muonshard::testing::FaultKind::kError, EACCES, muonshard::testing::FsOp::kNewRandomAccessFile, "index.json", 1});
  EXPECT_THAT(ImportSafetensors(&env, dir, {}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr(dir + "/model.safetensors.index.json")));
  MUONSHARD_EXPECT_OK(ImportSafetensors(&env, dir, {}).status());  // every rule spent
}

// ---- The shared parsers (common/), which the importer stands on. ----

TEST(OrderedJsonTest, KeepsMemberOrderAndDecodesStrings) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(
      JsonValue v, ParseJson(R"( {"z": 1, "a": [true, false, null], "m": "\u00e9\ud83d\ude00\n", "n": -12.5e3} )"));
  ASSERT_TRUE(v.is_object());
  std::vector<std::string> keys;
  for (const JsonMember& m : v.members()) keys.push_back(m.key);
  EXPECT_THAT(keys, ElementsAre("z", "a", "m", "n"));
  EXPECT_EQ(v.Find("z")->AsInt64(), 1);
  EXPECT_EQ(v.Find("m")->text(), "\xc3\xa9\xf0\x9f\x98\x80\n");
  EXPECT_FALSE(v.Find("n")->AsInt64().has_value());
  EXPECT_EQ(v.Find("n")->text(), "-12.5e3");
  EXPECT_EQ(v.Find("a")->elements().size(), 3u);
}

TEST(OrderedJsonTest, RefusesWhatIsNotStrictJson) {
  for (const char* bad : {"", "{", "{\"a\" 1}", "{\"a\":1,}", "[1,]", "01", "1.", "-", "+1", "'a'", "{a:1}", "\"\\x\"",
                          "\"\\u12\"", "tru", "nul", "[1] [2]", "\"\xc0\xaf\"", "\"\xed\xa0\x80\""}) {
    EXPECT_THAT(ParseJson(bad), StatusIs(absl::StatusCode::kInvalidArgument, Not(IsEmpty()))) << bad;
  }
}

TEST(OrderedJsonTest, DeepNestingIsAnErrorNotACrash) {
  EXPECT_THAT(ParseJson(std::string(100000, '[')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nested more than 64 levels")));
  std::string ok;
  for (int i = 0; i < 60; ++i) ok += "{\"a\":";
  ok += "1" + std::string(60, '}');
  MUONSHARD_EXPECT_OK(ParseJson(ok).status());
}

TEST(OrderedJsonTest, QuoteForMessage_EscapesAndCuts) {
  EXPECT_EQ(QuoteForMessage("a\"b\\c\n\x01\xff"), "\"a\\\"b\\\\c\\n\\x01\\xff\"");
  const std::string cut = QuoteForMessage(std::string(500, 'y'));
  EXPECT_LE(cut.size(), 84u);
  EXPECT_THAT(cut, HasSubstr("\"..."));
}

TEST(SafetensorsHeaderTest, EntriesInHeaderOrderWithDataSize) {
  const std::string json =
      R"({"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[4,12]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
      R"("f4":{"dtype":"F4","shape":[2,3],"data_offsets":[12,15]},"extra":{"dtype":"F32","shape":[],"data_offsets":[15,19],"x":1}})";
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsHeader h, ParseSafetensorsHeader(json));
  ASSERT_THAT(h.entries, SizeIs(4));
  EXPECT_EQ(h.entries[0].key, "b");
  EXPECT_EQ(h.entries[1].key, "a");
  EXPECT_EQ(h.entries[3].key, "extra") << "unknown fields ignored; a scalar is shape []";
  EXPECT_EQ(h.data_size, 19);
  EXPECT_EQ(h.data_start, 8 + static_cast<int64_t>(json.size()));
  EXPECT_EQ(SafetensorsDTypeBytes("BF16"), 2);
  EXPECT_EQ(SafetensorsDTypeBytes("F4"), 0);
  EXPECT_EQ(SafetensorsDTypeBits("F6_E3M2"), 6);
  EXPECT_EQ(SafetensorsDTypeBits("F33"), 0);
}

// Damaged headers and indexes: never a crash, always INVALID_ARGUMENT with a
// short, printable message. (A fuzzer does this at scale.)
TEST(SafetensorsHeaderTest, RandomDamage_NeverCrashesAndMessagesStayPrintable) {
  const std::string header =
      HeaderOf({{"model.layers.0.mlp.experts.3.up_proj.weight", "BF16", {4, 2}}, {"b", "F32", {3}}, {"c", "I64", {}}},
               {{"format", "pt"}})
          .substr(8);
  const std::string index = IndexJson({{"a", "model-00001-of-00002.safetensors"}, {"b", "x.safetensors"}});
  std::mt19937 rng(20240611);
  int parsed_ok = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string s = i % 2 == 0 ? header : index;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s[at] = static_cast<char>(rng() % 256);
          break;
        case 1:
          s.erase(at, 1 + rng() % 8);
          break;
        case 2:
          s.insert(at, 1, "{}[]\",:0-9e.\\u"[rng() % 14]);
          break;
        default:
          s.resize(at);
      }
    }
    absl::Status status;
    if (i % 2 == 0) {
      status = ParseSafetensorsHeader(s).status();
      // A header-only file: past the header checks, the import runs in full.
      SafetensorsFileHeader file{"m.safetensors", "", 8 + static_cast<int64_t>(s.size()), s};
      absl::Status imported = ImportSafetensorsHeaders({file}, nullptr, {}).status();
      if (!imported.ok()) {
        EXPECT_EQ(imported.code(), absl::StatusCode::kInvalidArgument) << imported;
        EXPECT_TRUE(AllPrintable(imported.message())) << imported;
      }
    } else {
      status = ParseSafetensorsIndex(s, "model.safetensors.index.json").status();
    }
    if (status.ok()) {
      ++parsed_ok;
      continue;
    }
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(AllPrintable(status.message())) << status;
    EXPECT_LT(status.message().size(), 600u) << status;
  }
  EXPECT_GT(parsed_ok, 0) << "some damage (in a value) leaves valid input";
}

}  // namespace
}  // namespace muonshard::importer
