#ifndef MUONSHARD_COORDINATOR_SERVICE_GRPC_STATUS_H_
#define MUONSHARD_COORDINATOR_SERVICE_GRPC_STATUS_H_

// absl::Status <-> grpc::Status at the RPC boundary (TSL grpc_util.h). The
// canonical codes are numerically identical in both; the message travels
// unchanged.

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace muonshard::coordinator {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_SERVICE_GRPC_STATUS_H_
