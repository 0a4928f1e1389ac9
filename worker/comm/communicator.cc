#include "worker/comm/communicator.h"

#include "absl/strings/str_cat.h"

namespace muonshard::worker {

absl::StatusOr<int64_t> CommDTypeSize(CommDType dtype) {
  switch (dtype) {
    case CommDType::kFloat32:
      return 4;
    case CommDType::kBFloat16:
    case CommDType::kFloat16:
      return 2;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown CommDType ", static_cast<int>(dtype)));
}

absl::string_view CommDTypeName(CommDType dtype) {
  switch (dtype) {
    case CommDType::kFloat32:
      return "f32";
    case CommDType::kBFloat16:
      return "bf16";
    case CommDType::kFloat16:
      return "f16";
  }
  return "unknown";
}

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "unknown";
}

}  // namespace muonshard::worker
