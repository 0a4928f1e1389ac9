#ifndef MUONSHARD_TESTS_IMPORTER_IMPORT_TEST_UTIL_H_
#define MUONSHARD_TESTS_IMPORTER_IMPORT_TEST_UTIL_H_

// Helpers shared by the importer tests: where the inputs live (ctest sets
// MUONSHARD_BIN_DIR and runs in the source root), config editing, and lookups
// into a manifest.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/struct.pb.h"
#include "importer/hf_import.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard::importer::testing {

// $MUONSHARD_SOURCE_DIR/`relative`, else `relative` under the working
// directory (ctest's is the source root).
std::string SourcePath(absl::string_view relative);
// tests/importer/configs/<model>.config.json: every config a test reads
// lives in the repository.
std::string TestConfigPath(absl::string_view model);
// The text of TestConfigPath(model); NOT_FOUND naming the path when it cannot
// be read, so a test that ASSERTs on it fails once, with the path.
absl::StatusOr<std::string> ReadConfig(absl::string_view model);
// $MUONSHARD_BIN_DIR/muonshardctl.
std::string CtlPath();
// The config of `model` imported (ImportHfConfig); a config that cannot be
// read is the error, naming its path.
absl::StatusOr<v1::ModelManifest> ImportConfig(absl::string_view model, ImportOptions options = {});
// A path in the test process's temp dir unique to the running test case
// (ctest may run the cases in parallel), ending in `suffix`.
std::string TestTempPath(absl::string_view suffix);

// The file's contents, or the read error naming the path.
absl::StatusOr<std::string> ReadText(const std::string& path);

// `json` with top-level `key` set to `value` (or removed, for RemoveField).
std::string SetField(const std::string& json, const std::string& key, const google::protobuf::Value& value);
std::string RemoveField(const std::string& json, const std::string& key);
google::protobuf::Value Number(double v);
google::protobuf::Value Text(const std::string& s);
google::protobuf::Value Flag(bool b);
google::protobuf::Value Null();

// Names of the manifest's tensors that start with `prefix`, in order.
std::vector<std::string> NamesWithPrefix(const v1::ModelManifest& manifest, absl::string_view prefix);
// The tensor called `name`; fails the test and returns an empty spec when absent.
v1::TensorSpec Tensor(const v1::ModelManifest& manifest, absl::string_view name);
// Index of `name` in the manifest, -1 when absent.
int IndexOf(const v1::ModelManifest& manifest, absl::string_view name);
std::vector<int64_t> Shape(const v1::TensorSpec& tensor);

}  // namespace muonshard::importer::testing

#endif  // MUONSHARD_TESTS_IMPORTER_IMPORT_TEST_UTIL_H_
