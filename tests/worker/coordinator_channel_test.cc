// The worker's channel to the coordinator finds a restarted coordinator again
// within the adoption grace (NOTE [Adoption] in coordinator.proto: two
// heartbeat timeouts, 20 s in the compose demo), also when it comes back at
// another address under the same name, as a restarted container does. The
// container stack test (tests/deploy/check_containers.py) restarts the
// coordinator right after a worker's restart; these bounds are what makes
// that worker re-register in time.

#include "client/coordinator_channel.h"

#include <optional>
#include <string>

#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonshard::client {
namespace {

// The integer argument `key` of `args`, if set.
std::optional<int> IntArg(grpc::ChannelArguments& args, const char* key) {
  const grpc_channel_args c = args.c_channel_args();
  std::optional<int> value;
  for (size_t i = 0; i < c.num_args; ++i) {
    if (std::string(c.args[i].key) == key && c.args[i].type == GRPC_ARG_INTEGER) value = c.args[i].value.integer;
  }
  return value;
}

// The compose demo's --heartbeat-timeout: the grace is twice that.
constexpr int kAdoptionGraceMs = 2 * 10'000;

TEST(CoordinatorChannelTest, DnsReResolvedWithinASecond) {
  // gRPC's default (30 s) kept a worker that had resolved the name shortly
  // before the coordinator restarted dialing the old address past the grace.
  grpc::ChannelArguments args = CoordinatorChannelArguments(ConnectionOptions{});
  const std::optional<int> min_time = IntArg(args, GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS);
  ASSERT_TRUE(min_time.has_value()) << "gRPC's default is 30 s";
  EXPECT_GT(*min_time, 0);
  EXPECT_LE(*min_time, 1000);
}

TEST(CoordinatorChannelTest, ReconnectBackoffBoundedToASecond) {
  grpc::ChannelArguments args = CoordinatorChannelArguments(ConnectionOptions{});
  EXPECT_EQ(IntArg(args, GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS), 100);
  // Also the shortest connect attempt: one to a vanished address ends soon.
  EXPECT_EQ(IntArg(args, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS), 100);
  const std::optional<int> max = IntArg(args, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS);
  ASSERT_TRUE(max.has_value()) << "gRPC's default is 120 s";
  EXPECT_LE(*max, 1000);
}

TEST(CoordinatorChannelTest, WorstCaseRediscoveryWellInsideTheAdoptionGrace) {
  // After the coordinator is back (and its name resolves to it): at most one
  // re-resolution wait plus one reconnect backoff, plus the heartbeat period
  // (a third of the timeout) before the session notices; a quarter of the
  // grace leaves the rest for a loaded machine.
  grpc::ChannelArguments args = CoordinatorChannelArguments(ConnectionOptions{});
  const int worst = IntArg(args, GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS).value_or(30'000) +
                    IntArg(args, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS).value_or(120'000);
  EXPECT_LE(worst, kAdoptionGraceMs / 4);
}

TEST(CoordinatorChannelTest, DedicatedConnectionUsesALocalSubchannelPool) {
  ConnectionOptions options;
  grpc::ChannelArguments shared = CoordinatorChannelArguments(options);
  EXPECT_EQ(IntArg(shared, GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL), std::nullopt);
  options.dedicated_connection = true;
  grpc::ChannelArguments dedicated = CoordinatorChannelArguments(options);
  EXPECT_EQ(IntArg(dedicated, GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL), 1);
  EXPECT_EQ(IntArg(dedicated, GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS),
            IntArg(shared, GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS));
}

}  // namespace
}  // namespace muonshard::client
