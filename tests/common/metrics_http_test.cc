#include "common/metrics_http.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "tests/testing/http_get.h"
#include "tests/testing/status_matchers.h"

namespace muonshard {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::shared_ptr<prometheus::Registry> RegistryWithCounter() {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("muonshard_test_total").Help("test").Register(*registry).Add({}).Increment(3);
  return registry;
}

TEST(MetricsHttpServerTest, ServesTheRegistryOnAFreePort) {
  const std::shared_ptr<prometheus::Registry> registry = RegistryWithCounter();  // held weakly
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<MetricsHttpServer> server,
                                 MetricsHttpServer::Start("127.0.0.1", 0, registry, 1));
  ASSERT_GT(server->port(), 0);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string body,
                                 ::muonshard::testing::HttpGet("127.0.0.1", server->port(), "/metrics"));
  EXPECT_THAT(body, HasSubstr("muonshard_test_total 3"));
}

// A port in use: UNAVAILABLE naming the address, and no static-TLS hint
// (threads start fine in this process).
TEST(MetricsHttpServerTest, PortInUse_UnavailableNamingTheAddress) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<MetricsHttpServer> first,
                                 MetricsHttpServer::Start("127.0.0.1", 0, RegistryWithCounter(), 1));
  const std::string address = "127.0.0.1:" + std::to_string(first->port());
  EXPECT_THAT(MetricsHttpServer::Start("127.0.0.1", first->port(), RegistryWithCounter(), 1),
              StatusIs(absl::StatusCode::kUnavailable, AllOf(HasSubstr(address), Not(HasSubstr("static TLS")))));
}

// The probe behind the hint: civetweb's 100 KiB stacks start here; a stack
// below the system minimum never does.
TEST(MetricsHttpServerTest, CanStartThreadWithStack) {
  EXPECT_TRUE(internal::CanStartThreadWithStack(102400));
  EXPECT_FALSE(internal::CanStartThreadWithStack(1024));
}

}  // namespace
}  // namespace muonshard
