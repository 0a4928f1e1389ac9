#include "worker/workload/workload.h"

#include "absl/strings/str_cat.h"

namespace muonshard::worker {

absl::Status CheckPartRange(const v1::PlannedTensor& tensor, int64_t element_begin, int64_t n) {
  if (element_begin < 0 || n < 0 || element_begin + n > tensor.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", tensor.name(), "\": elements [", element_begin, ", ",
                                                   element_begin + n, ") are outside its ", tensor.numel()));
  }
  return absl::OkStatus();
}

}  // namespace muonshard::worker
