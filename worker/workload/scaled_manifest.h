#ifndef MUONSHARD_WORKER_WORKLOAD_SCALED_MANIFEST_H_
#define MUONSHARD_WORKER_WORKLOAD_SCALED_MANIFEST_H_

// A real model's manifest shrunk for benchmarks that must run on a laptop or
// a CI runner: same tensor names, order, dtypes, expert structure and shape
// ratios, fewer layers and smaller dimensions. Pure.

#include "absl/status/statusor.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard::worker {

struct ScaleDownOptions {
  // Every dimension d becomes max(1, d / divisor), except the expert
  // dimension (dim 0) of a fused 3-D expert stack, which is kept so expert
  // parallelism still splits it. 1 keeps the shapes.
  int divisor = 1;
  // Tensors of layers >= max_layers ("layers.N" in the name) are dropped;
  // tensors outside layers (embedding, final norm, lm_head) are kept.
  // -1 keeps every layer.
  int max_layers = -1;
};

// INVALID_ARGUMENT for divisor < 1 or max_layers < -1 or 0.
absl::StatusOr<v1::ModelManifest> ScaleDownManifest(const v1::ModelManifest& manifest, const ScaleDownOptions& options);

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_WORKLOAD_SCALED_MANIFEST_H_
