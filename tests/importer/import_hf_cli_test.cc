// Runs the real `muonshardctl import-hf` binary: exit codes, stdout/stderr.
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "importer/hf_import.h"
#include "tests/importer/import_test_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"

namespace muonshard::importer {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

using muonshard::testing::CommandResult;
using testing::TestTempPath;

// `muonshardctl import-hf <args>` (shell text).
CommandResult RunImportHf(const std::string& args) {
  return muonshard::testing::RunCtl(absl::StrCat("import-hf ", args));
}

std::string Quoted(const std::string& path) { return absl::StrCat("'", path, "'"); }

TEST(ImportHfCliTest, Fixture_ExitsZeroAndJsonParsesBackToTheManifest) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string llama, testing::ReadConfig("Llama-3.1-8B"));
  CommandResult r = RunImportHf(Quoted(testing::TestConfigPath("Llama-3.1-8B")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::ModelManifest printed;
  MUONSHARD_ASSERT_OK(FromJson(r.out, &printed, "stdout"));
  EXPECT_EQ(printed.model(), "Llama-3.1-8B");  // from the file name
  EXPECT_EQ(printed.tensors_size(), 291);
  ImportOptions options;
  options.name = "Llama-3.1-8B";
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest expected, ImportHfConfig(llama, options));
  EXPECT_EQ(SerializeDeterministic(printed), SerializeDeterministic(expected));
  // snake_case proto field names, progress on stderr only.
  EXPECT_THAT(r.out, HasSubstr("\"tensors\""));
  EXPECT_THAT(r.err, HasSubstr("291 tensors, 8,030,261,248 parameters"));
}

TEST(ImportHfCliTest, NameFlagAndTableOutput) {
  CommandResult r = RunImportHf(Quoted(testing::TestConfigPath("DeepSeek-V3")) + " --mtp --name DSV3 --output table");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("DSV3"));
  EXPECT_THAT(r.out, HasSubstr("46,183"));           // tensors with the MTP layer
  EXPECT_THAT(r.out, HasSubstr("684,489,845,504"));  // parameters with the MTP layer
  EXPECT_THAT(r.out, HasSubstr("FP32"));
}

TEST(ImportHfCliTest, MissingField_ExitsTwoNamingIt) {
  const std::string path = TestTempPath("config.json");
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string json, testing::ReadConfig("Qwen3-30B-A3B"));
  json = testing::RemoveField(json, "num_hidden_layers");
  MUONSHARD_ASSERT_OK(WriteFileAtomic(path, json));
  CommandResult r = RunImportHf(Quoted(path));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("missing field \"num_hidden_layers\""));
  EXPECT_THAT(r.out, IsEmpty());
}

TEST(ImportHfCliTest, UnknownModelType_ExitsTwoNamingIt) {
  const std::string path = TestTempPath("config.json");
  MUONSHARD_ASSERT_OK(WriteFileAtomic(path, R"({"model_type": "bert", "hidden_size": 768})"));
  CommandResult r = RunImportHf(Quoted(path));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown model_type \"bert\""));
}

TEST(ImportHfCliTest, UnreadableFileAndBadUsage_ExitTwo) {
  CommandResult missing = RunImportHf(Quoted(TestTempPath("does-not-exist.json")));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("does-not-exist.json"));

  CommandResult none = RunImportHf("");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.err, HasSubstr("usage: muonshardctl import-hf"));

  CommandResult bad_output = RunImportHf(Quoted(testing::TestConfigPath("Llama-3.1-8B")) + " --output yaml");
  EXPECT_EQ(bad_output.exit_code, 2);
  EXPECT_THAT(bad_output.err, HasSubstr("--output"));

  CommandResult mtp_llama = RunImportHf(Quoted(testing::TestConfigPath("Llama-3.1-8B")) + " --mtp");
  EXPECT_EQ(mtp_llama.exit_code, 2);
  EXPECT_THAT(mtp_llama.err, HasSubstr("--mtp"));
}

TEST(ImportHfCliTest, TpFlag_MarksSplitsAndRefusesIndivisibleDimensions) {
  const std::string llama = Quoted(testing::TestConfigPath("Llama-3.1-8B"));
  CommandResult r = RunImportHf(llama + " --tp 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::ModelManifest printed;
  MUONSHARD_ASSERT_OK(FromJson(r.out, &printed, "stdout"));
  EXPECT_EQ(printed.tensors(testing::IndexOf(printed, "model.layers.0.self_attn.o_proj.weight")).tp_split(),
            v1::TP_ROW);
  EXPECT_THAT(r.out, HasSubstr("\"TP_COLUMN\""));

  CommandResult plain = RunImportHf(llama);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  // No --tp: nothing is marked.
  EXPECT_FALSE(absl::StrContains(plain.out, "TP_COLUMN") || absl::StrContains(plain.out, "TP_ROW"));

  CommandResult three = RunImportHf(llama + " --tp 3");
  EXPECT_EQ(three.exit_code, 2);
  EXPECT_THAT(three.err, HasSubstr("is not divisible by tp 3"));
  EXPECT_THAT(three.out, IsEmpty());
  CommandResult experts_alone = RunImportHf(llama + " --tp-experts");
  EXPECT_EQ(experts_alone.exit_code, 2);
  EXPECT_THAT(experts_alone.err, HasSubstr("--tp-experts: needs --tp 2 or more"));
}

TEST(ImportHfCliTest, Help_ExitsZeroListingModelTypes) {
  CommandResult r = RunImportHf("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("ernie4_5_moe"));
  EXPECT_THAT(r.err, Not(HasSubstr("error")));
}

}  // namespace
}  // namespace muonshard::importer
