#ifndef MUONSHARD_TESTS_TESTING_MANIFEST_BUILDER_H_
#define MUONSHARD_TESTS_TESTING_MANIFEST_BUILDER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "muonshard/v1/manifest.pb.h"

namespace muonshard::testing {

// Fluent builder for hand-written manifests in tests.
class ManifestBuilder {
 public:
  explicit ManifestBuilder(std::string model = "test") { manifest_.set_model(std::move(model)); }

  ManifestBuilder& Add(const std::string& name, std::vector<int64_t> shape, v1::DType dtype = v1::BF16,
                       std::optional<int> expert = std::nullopt);
  ManifestBuilder& AddWithStage(const std::string& name, std::vector<int64_t> shape, int stage,
                                v1::DType dtype = v1::BF16);
  v1::ModelManifest Build() const { return manifest_; }

 private:
  v1::ModelManifest manifest_;
};

// A dense decoder: embedding, `layers` x (q,k,v,o, gate/up/down, 2 norms),
// final norm, lm_head.
v1::ModelManifest DenseManifest(int layers, int64_t hidden, int64_t ffn, int64_t vocab);

// An MoE decoder with `experts` per-expert MLPs per layer and a router.
v1::ModelManifest MoeManifest(int layers, int64_t hidden, int64_t expert_ffn, int experts, int64_t vocab);

// A Kimi-K2-shaped MoE manifest (DeepSeek-V3 architecture: MLA attention,
// `dense_layers` dense MLPs first, then `experts` routed experts + a shared
// expert per layer): 61 layers x 384 experts gives ~71k tensors.
v1::ModelManifest LargeMoeManifest(int layers = 61, int dense_layers = 1, int experts = 384);

// A pseudo-random manifest (for invariant tests): mixed dtypes, 1-D..3-D
// shapes, experts when `experts` > 0.
v1::ModelManifest RandomManifest(uint64_t seed, int tensors, int experts);

v1::PlanRequest MakeRequest(const v1::ModelManifest& manifest, int world_size, int pp = 1, int ep = 1,
                            v1::Policy policy = v1::SEED, int comm_buffer_mb = 0);

}  // namespace muonshard::testing

#endif  // MUONSHARD_TESTS_TESTING_MANIFEST_BUILDER_H_
