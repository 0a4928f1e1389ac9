#ifndef MUONSHARD_TESTS_TESTING_STATUS_MATCHERS_H_
#define MUONSHARD_TESTS_TESTING_STATUS_MATCHERS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonshard::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

// EXPECT_THAT(f(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("x")))
MATCHER_P2(StatusIs, code, message_matcher, "") {
  const absl::Status& s = GetStatus(arg);
  if (s.code() != code) {
    *result_listener << "status is " << s;
    return false;
  }
  return ::testing::ExplainMatchResult(message_matcher, std::string(s.message()), result_listener);
}

MATCHER(IsOk, "") {
  const absl::Status& s = GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s;
  return s.ok();
}

}  // namespace muonshard::testing

#define MUONSHARD_ASSERT_OK(expr) ASSERT_THAT(expr, ::muonshard::testing::IsOk())
#define MUONSHARD_EXPECT_OK(expr) EXPECT_THAT(expr, ::muonshard::testing::IsOk())
#define MUONSHARD_ASSERT_OK_AND_ASSIGN(lhs, rexpr)             \
  auto MUONSHARD_TEST_CONCAT_(_so_, __LINE__) = (rexpr);       \
  MUONSHARD_ASSERT_OK(MUONSHARD_TEST_CONCAT_(_so_, __LINE__)); \
  lhs = std::move(MUONSHARD_TEST_CONCAT_(_so_, __LINE__)).value()
#define MUONSHARD_TEST_CONCAT_INNER_(a, b) a##b
#define MUONSHARD_TEST_CONCAT_(a, b) MUONSHARD_TEST_CONCAT_INNER_(a, b)

#endif  // MUONSHARD_TESTS_TESTING_STATUS_MATCHERS_H_
