#ifndef MUONSHARD_TESTS_KERNELS_FIXTURE_READER_H_
#define MUONSHARD_TESTS_KERNELS_FIXTURE_READER_H_

// Reader for the text fixtures written by tests/kernels/gen_fixtures.py:
//
//   case <name>
//   attr <key> <value>          (any number)
//   tensor <key> <count>        followed by <count> whitespace-separated numbers
//   end
//
// Lines starting with '#' are comments.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace muonshard::kernels::testing {

struct FixtureCase {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::map<std::string, std::vector<double>> tensors;

  // Accessors report a gtest failure (and return 0 / empty) when the key is
  // missing or malformed, so a broken fixture fails the test that reads it.
  std::string Str(const std::string& key) const;
  int64_t Int(const std::string& key) const;
  double Double(const std::string& key) const;
  std::vector<float> Floats(const std::string& key) const;
  std::vector<double> Doubles(const std::string& key) const;
};

// Reads tests/kernels/fixtures/<file_name> from the source tree
// ($MUONSHARD_SOURCE_DIR, else the working directory).
// Possible errors: NOT_FOUND, INVALID_ARGUMENT (malformed file).
absl::StatusOr<std::vector<FixtureCase>> ReadFixtureFile(const std::string& file_name);

}  // namespace muonshard::kernels::testing

#endif  // MUONSHARD_TESTS_KERNELS_FIXTURE_READER_H_
