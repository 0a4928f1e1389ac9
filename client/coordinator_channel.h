#ifndef MUONSHARD_CLIENT_COORDINATOR_CHANNEL_H_
#define MUONSHARD_CLIENT_COORDINATOR_CHANNEL_H_

// The gRPC channel arguments of CoordinatorClient::Connect, on their own so
// a test can assert them (tests/worker/coordinator_channel_test.cc).

#include "client/coordinator_client.h"
#include "grpcpp/support/channel_arguments.h"

namespace muonshard::client {

// How fast a client finds a restarted coordinator again (NOTE [Adoption]
// in coordinator.proto: the rank must re-register within the adoption grace,
// two heartbeat timeouts): gRPC's reconnect backoff, from ..._BACKOFF_MS up
// to the max (the shortest connect attempt too), and the shortest time
// between two DNS resolutions of the coordinator's name (gRPC's default, 30
// s, outlasts the grace when a restarted coordinator has a new address).
inline constexpr int kCoordinatorReconnectBackoffMs = 100;
inline constexpr int kCoordinatorMaxReconnectBackoffMs = 1000;
inline constexpr int kCoordinatorDnsMinTimeBetweenResolutionsMs = 1000;

// The channel arguments of CoordinatorClient::Connect (keepalive, the
// reconnect and re-resolution bounds above, message size, subchannel pool).
grpc::ChannelArguments CoordinatorChannelArguments(const ConnectionOptions& options);

}  // namespace muonshard::client

#endif  // MUONSHARD_CLIENT_COORDINATOR_CHANNEL_H_
