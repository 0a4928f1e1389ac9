#include "tests/kernels/fixture_reader.h"

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"

namespace muonshard::kernels::testing {
namespace {

std::string FixturePath(const std::string& file_name) {
  const char* root = std::getenv("MUONSHARD_SOURCE_DIR");
  return absl::StrCat(root != nullptr ? root : ".", "/tests/kernels/fixtures/", file_name);
}

absl::Status Malformed(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// Reads `count` numbers of tensor `key` from `in`.
absl::StatusOr<std::vector<double>> ReadValues(std::istream& in, int64_t count, const std::string& path,
                                               const std::string& key) {
  std::vector<double> values(count);
  for (double& v : values) {
    std::string token;
    if (!(in >> token) || !absl::SimpleAtod(token, &v)) {
      return Malformed(path, absl::StrCat("bad value in tensor ", key));
    }
  }
  return values;
}

}  // namespace

std::string FixtureCase::Str(const std::string& key) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) {
    ADD_FAILURE() << "fixture case " << name << " has no attr " << key;
    return "";
  }
  return it->second;
}

int64_t FixtureCase::Int(const std::string& key) const {
  int64_t value = 0;
  if (!absl::SimpleAtoi(Str(key), &value)) {
    ADD_FAILURE() << "fixture case " << name << ": attr " << key << " is not an integer";
  }
  return value;
}

double FixtureCase::Double(const std::string& key) const {
  double value = 0;
  if (!absl::SimpleAtod(Str(key), &value)) {
    ADD_FAILURE() << "fixture case " << name << ": attr " << key << " is not a number";
  }
  return value;
}

std::vector<double> FixtureCase::Doubles(const std::string& key) const {
  auto it = tensors.find(key);
  if (it == tensors.end()) {
    ADD_FAILURE() << "fixture case " << name << " has no tensor " << key;
    return {};
  }
  return it->second;
}

std::vector<float> FixtureCase::Floats(const std::string& key) const {
  const std::vector<double> d = Doubles(key);
  return std::vector<float>(d.begin(), d.end());
}

absl::StatusOr<std::vector<FixtureCase>> ReadFixtureFile(const std::string& file_name) {
  const std::string path = FixturePath(file_name);
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  std::istringstream in(*text);
  std::vector<FixtureCase> cases;
  FixtureCase* current = nullptr;
  std::string word;
  while (in >> word) {
    if (word[0] == '#') {
      std::getline(in, word);
    } else if (word == "case") {
      cases.emplace_back();
      current = &cases.back();
      in >> current->name;
    } else if (current == nullptr) {
      return Malformed(path, absl::StrCat("'", word, "' before any case"));
    } else if (word == "attr") {
      std::string key, value;
      in >> key >> value;
      current->attrs[key] = value;
    } else if (word == "tensor") {
      std::string key;
      int64_t count = -1;
      if (!(in >> key >> count) || count < 0) {
        return Malformed(path, "bad tensor header");
      }
      absl::StatusOr<std::vector<double>> values = ReadValues(in, count, path, key);
      if (!values.ok()) return values.status();
      current->tensors[key] = *std::move(values);
    } else if (word == "end") {
      current = nullptr;
    } else {
      return Malformed(path, absl::StrCat("unknown keyword '", word, "'"));
    }
  }
  if (cases.empty()) return Malformed(path, "no cases");
  return cases;
}

}  // namespace muonshard::kernels::testing
