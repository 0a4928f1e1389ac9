#include "tests/importer/import_test_util.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace muonshard::importer::testing {
namespace {

std::string EnvDir(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    ADD_FAILURE() << name << " is not set; run the test through ctest";
    return ".";
  }
  return value;
}

google::protobuf::Struct ParseStruct(const std::string& json) {
  google::protobuf::Struct root;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &root).ok()) << json;
  return root;
}

std::string ToJsonText(const google::protobuf::Struct& root) {
  std::string out;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(root, &out).ok());
  return out;
}

}  // namespace

std::string SourcePath(absl::string_view relative) {
  // ctest runs the tests in the source root, so the working directory stands
  // in when the variable did not make it through gtest_discover_tests.
  const char* root = std::getenv("MUONSHARD_SOURCE_DIR");
  return absl::StrCat(root != nullptr && *root != '\0' ? root : ".", "/", relative);
}

std::string TestConfigPath(absl::string_view model) {
  return SourcePath(absl::StrCat("tests/importer/configs/", model, ".config.json"));
}

std::string CtlPath() { return absl::StrCat(EnvDir("MUONSHARD_BIN_DIR"), "/muonshardctl"); }

absl::StatusOr<std::string> ReadConfig(absl::string_view model) { return ReadText(TestConfigPath(model)); }

absl::StatusOr<v1::ModelManifest> ImportConfig(absl::string_view model, ImportOptions options) {
  absl::StatusOr<std::string> json = ReadConfig(model);
  if (!json.ok()) return json.status();
  return ImportHfConfig(*json, options);
}

std::string TestTempPath(absl::string_view suffix) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat(muonshard::testing::ProcessTempDir(), "/", info->test_suite_name(), ".", info->name(), ".",
                      suffix);
}

absl::StatusOr<std::string> ReadText(const std::string& path) { return ReadFile(path); }

std::string SetField(const std::string& json, const std::string& key, const google::protobuf::Value& value) {
  google::protobuf::Struct root = ParseStruct(json);
  (*root.mutable_fields())[key] = value;
  return ToJsonText(root);
}

std::string RemoveField(const std::string& json, const std::string& key) {
  google::protobuf::Struct root = ParseStruct(json);
  root.mutable_fields()->erase(key);
  return ToJsonText(root);
}

google::protobuf::Value Number(double v) {
  google::protobuf::Value value;
  value.set_number_value(v);
  return value;
}

google::protobuf::Value Text(const std::string& s) {
  google::protobuf::Value value;
  value.set_string_value(s);
  return value;
}

google::protobuf::Value Flag(bool b) {
  google::protobuf::Value value;
  value.set_bool_value(b);
  return value;
}

google::protobuf::Value Null() {
  google::protobuf::Value value;
  value.set_null_value(google::protobuf::NULL_VALUE);
  return value;
}

std::vector<std::string> NamesWithPrefix(const v1::ModelManifest& manifest, absl::string_view prefix) {
  std::vector<std::string> names;
  for (const v1::TensorSpec& t : manifest.tensors()) {
    if (absl::StartsWith(t.name(), prefix)) names.push_back(t.name());
  }
  return names;
}

int IndexOf(const v1::ModelManifest& manifest, absl::string_view name) {
  for (int i = 0; i < manifest.tensors_size(); ++i) {
    if (manifest.tensors(i).name() == name) return i;
  }
  return -1;
}

v1::TensorSpec Tensor(const v1::ModelManifest& manifest, absl::string_view name) {
  int i = IndexOf(manifest, name);
  if (i < 0) {
    ADD_FAILURE() << "no tensor " << name;
    return v1::TensorSpec();
  }
  return manifest.tensors(i);
}

std::vector<int64_t> Shape(const v1::TensorSpec& tensor) {
  return std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end());
}

}  // namespace muonshard::importer::testing
