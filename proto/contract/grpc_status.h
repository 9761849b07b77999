// Conversion between absl::Status and grpc::Status. The codes are the same
// numbers; only the service boundary and the client use this.
#ifndef HOSTKV_PROTO_CONTRACT_GRPC_STATUS_H_
#define HOSTKV_PROTO_CONTRACT_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace hostkv {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace hostkv

#endif  // HOSTKV_PROTO_CONTRACT_GRPC_STATUS_H_
