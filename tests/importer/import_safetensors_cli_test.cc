// Runs the real `muonshardctl import-safetensors` binary on checkpoints
// written into a fresh temporary directory: exit codes, stdout/stderr.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/proto_json.h"
#include "common/safetensors_header.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "importer/safetensors_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace muonshard::importer {
namespace {

using ::muonshard::testing::CommandResult;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

struct Spec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

// A whole, valid safetensors file of `tensors` (data zeroed), in that order.
std::string FileOf(const std::vector<Spec>& tensors) {
  std::vector<SafetensorsEntry> entries;
  int64_t at = 0;
  for (const Spec& t : tensors) {
    int64_t bytes = SafetensorsDTypeBytes(t.dtype);
    for (int64_t d : t.shape) bytes *= d;
    entries.push_back({t.name, t.dtype, t.shape, at, at + bytes});
    at += bytes;
  }
  return EncodeSafetensorsHeader(entries, {{"format", "pt"}}) + std::string(static_cast<size_t>(at), '\0');
}

class ImportSafetensorsCliTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(tmp_.path().empty()) << "mkdtemp failed"; }

  // `muonshardctl import-safetensors <args>`, output captured under the
  // test's own temporary directory.
  CommandResult Run(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {muonshard::testing::BinaryPath("muonshardctl"), "import-safetensors"};
    argv.insert(argv.end(), args.begin(), args.end());
    absl::StatusOr<CommandResult> result = muonshard::testing::RunCommand(argv, tmp_.path());
    EXPECT_TRUE(result.ok()) << result.status();
    return result.value_or(CommandResult{});
  }

  // A two-shard MoE checkpoint in <tmp>/<name>; returns its directory.
  std::string WriteCheckpoint(const std::string& name) {
    const std::string dir = tmp_.Join(name);
    EXPECT_TRUE(std::filesystem::create_directory(dir)) << dir;
    Write(dir + "/model-00001-of-00002.safetensors",
          FileOf({{"model.embed_tokens.weight", "BF16", {64, 16}},
                  {"model.layers.0.mlp.experts.0.up_proj.weight", "BF16", {32, 16}},
                  {"model.layers.0.mlp.experts.1.up_proj.weight", "BF16", {32, 16}}}));
    Write(dir + "/model-00002-of-00002.safetensors", FileOf({{"lm_head.weight", "BF16", {64, 16}},
                                                             {"model.layers.0.mlp.gate.weight", "F32", {2, 16}},
                                                             {"model.norm.weight", "F32", {16}}}));
    Write(dir + "/model.safetensors.index.json", R"({
  "metadata": {"total_size": 8384},
  "weight_map": {
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
    "model.layers.0.mlp.gate.weight": "model-00002-of-00002.safetensors",
    "model.layers.0.mlp.experts.0.up_proj.weight": "model-00001-of-00002.safetensors",
    "model.layers.0.mlp.experts.1.up_proj.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00002-of-00002.safetensors",
    "lm_head.weight": "model-00002-of-00002.safetensors"
  }
})");
    return dir;
  }

  static void Write(const std::string& path, const std::string& bytes) {
    MUONSHARD_ASSERT_OK(WriteFileAtomic(path, bytes));
  }

  muonshard::testing::TempDir tmp_;
};

TEST_F(ImportSafetensorsCliTest, ShardedDir_ExitsZeroAndJsonParsesBackToTheManifest) {
  const std::string dir = WriteCheckpoint("Tiny-MoE");
  CommandResult r = Run({dir});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::ModelManifest printed;
  MUONSHARD_ASSERT_OK(FromJson(r.out, &printed, "stdout"));
  EXPECT_EQ(printed.model(), "Tiny-MoE");  // from the directory name
  ASSERT_EQ(printed.tensors_size(), 6);
  EXPECT_EQ(printed.tensors(1).name(), "model.layers.0.mlp.gate.weight");  // the index's order
  EXPECT_EQ(printed.tensors(3).expert(), 1);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport expected, ImportSafetensors(dir, {}));
  EXPECT_EQ(SerializeDeterministic(printed), SerializeDeterministic(expected.manifest));
  // snake_case proto field names, progress on stderr only.
  EXPECT_THAT(r.out, HasSubstr("\"tensors\""));
  EXPECT_THAT(r.err, HasSubstr("Tiny-MoE: 6 tensors, 3,120 parameters from 2 header(s)"));
}

TEST_F(ImportSafetensorsCliTest, NameFlagAndTableOutput) {
  const std::string dir = WriteCheckpoint("ckpt");
  CommandResult r = Run({dir + "/model.safetensors.index.json", "--name", "MyMoE", "--output", "table"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("MyMoE"));
  EXPECT_THAT(r.out, HasSubstr("3,120"));  // parameters
  EXPECT_THAT(r.out, HasSubstr("expert tensors   2"));
  EXPECT_THAT(r.out, HasSubstr("FP32"));
}

TEST_F(ImportSafetensorsCliTest, UnsupportedDtype_ExitsTwoOrIsSkippedWithTheFlag) {
  const std::string dir = tmp_.Join("fp8");
  ASSERT_TRUE(std::filesystem::create_directory(dir));
  Write(dir + "/model.safetensors", FileOf({{"model.embed_tokens.weight", "BF16", {8, 4}},
                                            {"model.layers.0.mlp.up_proj.weight", "F8_E4M3", {8, 4}}}));
  CommandResult failed = Run({dir});
  EXPECT_EQ(failed.exit_code, 2);
  EXPECT_THAT(failed.err, AllOf(HasSubstr("\"model.layers.0.mlp.up_proj.weight\""), HasSubstr("F8_E4M3")));
  EXPECT_THAT(failed.out, IsEmpty());

  CommandResult skipped = Run({dir, "--skip-unsupported"});
  ASSERT_EQ(skipped.exit_code, 0) << skipped.err;
  EXPECT_THAT(skipped.err, HasSubstr("skipped 1 tensor(s) of unsupported dtypes: "
                                     "\"model.layers.0.mlp.up_proj.weight\" (F8_E4M3)"));
  v1::ModelManifest printed;
  MUONSHARD_ASSERT_OK(FromJson(skipped.out, &printed, "stdout"));
  EXPECT_EQ(printed.tensors_size(), 1);
}

TEST_F(ImportSafetensorsCliTest, HeaderOnlyCopy_ImportsWithANote) {
  const std::string path = tmp_.Join("headers.safetensors");
  const std::string full = FileOf({{"w", "F32", {1000}}});
  Write(path, full.substr(0, full.size() - 4000));  // the header, no data
  CommandResult r = Run({path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("note: 1 file(s) hold less data than their header describes"));
  EXPECT_THAT(r.err, HasSubstr(path));
  EXPECT_THAT(r.out, HasSubstr("\"headers\""));  // the model name: the file stem
}

TEST_F(ImportSafetensorsCliTest, BadInput_ExitsTwoNamingIt) {
  const std::string dir = WriteCheckpoint("broken");
  ASSERT_EQ(std::remove((dir + "/model-00002-of-00002.safetensors").c_str()), 0);
  CommandResult missing_shard = Run({dir});
  EXPECT_EQ(missing_shard.exit_code, 2);
  EXPECT_THAT(missing_shard.err, HasSubstr("\"model-00002-of-00002.safetensors\", which does not exist"));
  EXPECT_THAT(missing_shard.out, IsEmpty());

  const std::string garbage = tmp_.Join("garbage.safetensors");
  Write(garbage, std::string("\x10\0\0\0\0\0\0\0not json at all!", 24));
  CommandResult corrupt = Run({garbage});
  EXPECT_EQ(corrupt.exit_code, 2);
  EXPECT_THAT(corrupt.err, AllOf(HasSubstr("garbage.safetensors"), HasSubstr("not a JSON object")));
}

TEST_F(ImportSafetensorsCliTest, MissingPathAndBadUsage_ExitTwo) {
  CommandResult missing = Run({tmp_.Join("does-not-exist")});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("does-not-exist: no such file or directory"));

  CommandResult none = Run({});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.err, HasSubstr("usage: muonshardctl import-safetensors"));

  const std::string dir = WriteCheckpoint("usage");
  CommandResult two = Run({dir, dir});
  EXPECT_EQ(two.exit_code, 2);
  CommandResult bad_output = Run({dir, "--output", "yaml"});
  EXPECT_EQ(bad_output.exit_code, 2);
  EXPECT_THAT(bad_output.err, HasSubstr("--output"));
  CommandResult bad_flag = Run({dir, "--mtp"});
  EXPECT_EQ(bad_flag.exit_code, 2);
}

TEST_F(ImportSafetensorsCliTest, Help_ExitsZero) {
  CommandResult r = Run({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("--skip-unsupported")));
  EXPECT_THAT(r.err, Not(HasSubstr("error")));
}

}  // namespace
}  // namespace muonshard::importer
