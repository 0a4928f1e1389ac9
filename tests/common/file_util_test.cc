#include "common/file_util.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace muonshard {
namespace {

using ::muonshard::testing::StatusIs;

TEST(FileUtilTest, AtomicWriteReplacesContent) {
  const testing::TempDir dir;
  const std::string path = dir.Join("file_util_test.txt");
  MUONSHARD_ASSERT_OK(WriteFileAtomic(path, "first"));
  MUONSHARD_ASSERT_OK(WriteFileAtomic(path, "second"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string got, ReadFile(path));
  EXPECT_EQ(got, "second");
}

TEST(FileUtilTest, MissingFileIsNotFound) {
  EXPECT_THAT(ReadFile("/nonexistent/dir/file"),
              StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr("/nonexistent/dir/file")));
}

}  // namespace
}  // namespace muonshard
