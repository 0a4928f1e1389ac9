// The worker's channel to the coordinator finds a restarted coordinator again
// within the adoption grace (NOTE [Adoption] in coordinator.proto: two
// heartbeat timeouts, 20 s in the compose demo), also when it comes back at
// another address under the same name, as a restarted container does. The
// container stack test (tests/deploy/check_containers.py) restarts the
// coordinator right after a worker's restart; these bounds are what makes
// that worker re-register in time.

#include "client/coordinator_channel.h"

#include <signal.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "client/coordinator_session.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_dns_server.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/slow_tcp_relay.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

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
  const std::optional<int> max = IntArg(args, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS);
  ASSERT_TRUE(max.has_value()) << "gRPC's default is 120 s";
  EXPECT_LE(*max, 1000);
}

TEST(CoordinatorChannelTest, ConnectAttemptsGetSecondsNotTheBackoff) {
  // gRPC's MIN_RECONNECT_BACKOFF is the time a connection attempt has: at
  // the backoff's 100 ms a starved worker never completed one (see
  // CoordinatorRestartTest below); gRPC's default (20 s) would hold an
  // attempt to a vanished address past the grace.
  grpc::ChannelArguments args = CoordinatorChannelArguments(ConnectionOptions{});
  const std::optional<int> connect = IntArg(args, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS);
  ASSERT_TRUE(connect.has_value()) << "gRPC's default is 20 s";
  EXPECT_GE(*connect, 2000);
  EXPECT_LE(*connect, kAdoptionGraceMs / 4);
}

TEST(CoordinatorChannelTest, WorstCaseRediscoveryWellInsideTheAdoptionGrace) {
  // After the coordinator is back (and its name resolves to it): at most one
  // attempt at the old address running out, one re-resolution wait and one
  // reconnect backoff, plus the heartbeat period (a sixth of the grace)
  // before the session notices; half the grace leaves the rest for a loaded
  // machine.
  grpc::ChannelArguments args = CoordinatorChannelArguments(ConnectionOptions{});
  const int worst = IntArg(args, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS).value_or(20'000) +
                    IntArg(args, GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS).value_or(30'000) +
                    IntArg(args, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS).value_or(120'000);
  EXPECT_LE(worst, kAdoptionGraceMs / 2);
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

// The restart the bounds above are for, with a real coordinator: it stops,
// its name vanishes (podman's and Docker's DNS, a headless Service), and it
// comes back at another address under the name, on its data, behind a path
// whose server answers a connection 1.5 s late (SlowTcpRelay): what a
// worker training on every core saw in the container stack test, where its
// gRPC threads got to the handshake late. gRPC gives a connection attempt
// max(reconnect backoff, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS) to complete; at
// 100 ms every attempt there failed ("tcp handshaker shutdown") and the
// ranks re-registered 20-46 s after the coordinator was back, past the
// adoption grace, so the job moved to a new generation. Heartbeat timeout 3
// s: grace 6 s, a heartbeat a second.
TEST(CoordinatorRestartTest, NameGoneThenBackAtASlowAddress_AdoptedAtItsGeneration) {
  constexpr char kName[] = "coordinator.muonshard.test";
  constexpr absl::Duration kSlowHandshake = absl::Milliseconds(1500);
  const std::vector<std::string> kFlags = {"--heartbeat-timeout", "3"};
  ::muonshard::testing::TempDir dir;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<::muonshard::testing::FakeDnsServer> dns,
                                 ::muonshard::testing::FakeDnsServer::Start());
  dns->Set(kName, "127.0.0.2");
  std::vector<std::string> flags = kFlags;
  flags.insert(flags.end(), {"--listen", "127.0.0.2:0"});
  MUONSHARD_ASSERT_OK_AND_ASSIGN(::muonshard::testing::CoordinatorProcess started,
                                 ::muonshard::testing::CoordinatorProcess::Start(dir.Join("data"), dir.path(), flags));
  auto first = std::make_unique<::muonshard::testing::CoordinatorProcess>(std::move(started));
  const int port = first->port();

  ConnectionOptions options;
  options.coordinator = absl::StrCat("dns://127.0.0.1:", dns->port(), "/", kName, ":", port);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CoordinatorClient> client, CoordinatorClient::Connect(options));
  v1::SubmitPlanRequest submit;
  *submit.mutable_request() = ::muonshard::testing::MakeRequest(::muonshard::testing::DenseManifest(1, 32, 48, 40), 1);
  v1::SubmitPlanResponse submitted;
  auto ctx = client->NewContext();
  MUONSHARD_ASSERT_OK(FromGrpcStatus(client->stub().SubmitPlan(ctx.get(), submit, &submitted)));
  SessionOptions session_options;
  session_options.job = "restart";
  session_options.host = "test-host";
  session_options.device = "cpu:0";
  session_options.rank = 0;
  session_options.plan_version = submitted.version();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CoordinatorSession> session,
                                 CoordinatorSession::Join(client.get(), session_options));
  ASSERT_EQ(session->joined().generation, 1);

  // Down, its name gone (no answer at all, as from a DNS forwarder with no
  // upstream), for three heartbeats.
  first->Signal(SIGTERM);
  MUONSHARD_ASSERT_OK(first->WaitForExit(absl::Seconds(20)).status());
  first.reset();
  dns->Remove(kName, ::muonshard::testing::FakeDnsServer::Missing::kNoAnswer);
  const int64_t beats = session->heartbeats();
  MUONSHARD_ASSERT_OK(::muonshard::testing::PollUntil([&] { return session->heartbeats() >= beats + 3; },
                                                      absl::Seconds(30), "three heartbeats while it is down"));
  ASSERT_GT(dns->queries(), 0) << "the channel never asked the test's DNS server";

  // Back on its data, reached through the slow relay at a new address.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(::muonshard::testing::CoordinatorProcess second,
                                 ::muonshard::testing::CoordinatorProcess::Start(dir.Join("data"), dir.path(), kFlags));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<::muonshard::testing::SlowTcpRelay> relay,
      ::muonshard::testing::SlowTcpRelay::Start("127.0.0.3", port, second.port(), kSlowHandshake));
  dns->Set(kName, "127.0.0.3");
  const absl::Status adopted =
      ::muonshard::testing::PollUntil([&] { return session->adoptions() > 0 || !session->health().ok(); },
                                      absl::Seconds(30), "the rank adopted or its membership lost");
  ASSERT_TRUE(adopted.ok()) << adopted << " (" << relay->connections() << " connection attempt(s) through the relay)\n"
                            << second.Log();
  EXPECT_TRUE(session->health().ok()) << session->health() << "\n" << second.Log();
  EXPECT_EQ(session->adoptions(), 1);
  EXPECT_THAT(second.Log(), ::testing::HasSubstr("(adopted after a coordinator restart)"));
  EXPECT_THAT(second.Log(), ::testing::Not(::testing::HasSubstr("did not re-register")));
}

}  // namespace
}  // namespace muonshard::client
