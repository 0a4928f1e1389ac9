#ifndef MUONSHARD_COMMON_GRPC_STATUS_H_
#define MUONSHARD_COMMON_GRPC_STATUS_H_

// absl::Status <-> grpc::Status at the RPC boundary (TSL grpc_util.h). The
// canonical codes are numerically identical in both; the message travels
// unchanged.

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace muonshard::client {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace muonshard::client

#endif  // MUONSHARD_COMMON_GRPC_STATUS_H_
