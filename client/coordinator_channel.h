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
// to the max; the time a connection attempt has to complete (gRPC's
// GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: an attempt gets the larger of it and
// the current backoff); and the shortest time between two DNS resolutions
// of the coordinator's name (gRPC's default, 30 s, outlasts the grace when
// a restarted coordinator has a new address).
//
// The connect time: a worker training on every core gets to the handshake
// late (its gRPC threads are starved; the server's first HTTP/2 frame is
// read late). At 100 ms, attempts failed one after the other ("tcp
// handshaker shutdown") and ranks re-registered 20-46 s after the
// coordinator was back, past the grace (the container stack test; tests/
// worker/coordinator_channel_test.cc reproduces it with a slow relay). Five
// seconds still give up an address nobody holds any more well inside the
// grace of the compose demo (20 s).
inline constexpr int kCoordinatorReconnectBackoffMs = 100;
inline constexpr int kCoordinatorMaxReconnectBackoffMs = 1000;
inline constexpr int kCoordinatorConnectTimeoutMs = 5000;
inline constexpr int kCoordinatorDnsMinTimeBetweenResolutionsMs = 1000;

// The channel arguments of CoordinatorClient::Connect (keepalive, the
// reconnect and re-resolution bounds above, message size, subchannel pool).
grpc::ChannelArguments CoordinatorChannelArguments(const ConnectionOptions& options);

}  // namespace muonshard::client

#endif  // MUONSHARD_CLIENT_COORDINATOR_CHANNEL_H_
