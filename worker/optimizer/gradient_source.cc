#include "worker/optimizer/gradient_source.h"

#include "absl/strings/str_cat.h"

namespace muonshard::worker {

absl::StatusOr<absl::Span<const float>> GradientMap::PartGradient(int tensor) {
  auto it = grads_.find(tensor);
  if (it == grads_.end()) {
    return absl::NotFoundError(absl::StrCat("no gradient for tensor ", tensor));
  }
  return absl::Span<const float>(it->second);
}

absl::StatusOr<BackendGradient> BackendGradientMap::PartGradient(int tensor) {
  auto it = grads_.find(tensor);
  if (it == grads_.end()) {
    return absl::NotFoundError(absl::StrCat("no gradient for tensor ", tensor));
  }
  return it->second;
}

}  // namespace muonshard::worker
