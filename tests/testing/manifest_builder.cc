#include "tests/testing/manifest_builder.h"

#include <random>

#include "absl/strings/str_cat.h"

namespace muonshard::testing {

ManifestBuilder& ManifestBuilder::Add(const std::string& name, std::vector<int64_t> shape, v1::DType dtype,
                                      std::optional<int> expert) {
  v1::TensorSpec* t = manifest_.add_tensors();
  t->set_name(name);
  for (int64_t d : shape) t->add_shape(d);
  t->set_dtype(dtype);
  if (expert) t->set_expert(*expert);
  return *this;
}

ManifestBuilder& ManifestBuilder::AddWithStage(const std::string& name, std::vector<int64_t> shape, int stage,
                                               v1::DType dtype) {
  Add(name, std::move(shape), dtype);
  manifest_.mutable_tensors(manifest_.tensors_size() - 1)->set_stage(stage);
  return *this;
}

v1::ModelManifest DenseManifest(int layers, int64_t hidden, int64_t ffn, int64_t vocab) {
  ManifestBuilder b("dense");
  b.Add("model.embed_tokens.weight", {vocab, hidden});
  for (int l = 0; l < layers; ++l) {
    std::string p = absl::StrCat("model.layers.", l, ".");
    b.Add(p + "self_attn.q_proj.weight", {hidden, hidden})
        .Add(p + "self_attn.k_proj.weight", {hidden / 4, hidden})
        .Add(p + "self_attn.v_proj.weight", {hidden / 4, hidden})
        .Add(p + "self_attn.o_proj.weight", {hidden, hidden})
        .Add(p + "mlp.gate_proj.weight", {ffn, hidden})
        .Add(p + "mlp.up_proj.weight", {ffn, hidden})
        .Add(p + "mlp.down_proj.weight", {hidden, ffn})
        .Add(p + "input_layernorm.weight", {hidden})
        .Add(p + "post_attention_layernorm.weight", {hidden});
  }
  b.Add("model.norm.weight", {hidden}).Add("lm_head.weight", {vocab, hidden});
  return b.Build();
}

v1::ModelManifest MoeManifest(int layers, int64_t hidden, int64_t expert_ffn, int experts, int64_t vocab) {
  ManifestBuilder b("moe");
  b.Add("model.embed_tokens.weight", {vocab, hidden});
  for (int l = 0; l < layers; ++l) {
    std::string p = absl::StrCat("model.layers.", l, ".");
    b.Add(p + "self_attn.q_proj.weight", {hidden, hidden})
        .Add(p + "self_attn.k_proj.weight", {hidden / 4, hidden})
        .Add(p + "self_attn.v_proj.weight", {hidden / 4, hidden})
        .Add(p + "self_attn.o_proj.weight", {hidden, hidden})
        .Add(p + "mlp.gate.weight", {experts, hidden});
    for (int e = 0; e < experts; ++e) {
      std::string q = absl::StrCat(p, "mlp.experts.", e, ".");
      b.Add(q + "gate_proj.weight", {expert_ffn, hidden})
          .Add(q + "up_proj.weight", {expert_ffn, hidden})
          .Add(q + "down_proj.weight", {hidden, expert_ffn});
    }
    b.Add(p + "input_layernorm.weight", {hidden}).Add(p + "post_attention_layernorm.weight", {hidden});
  }
  b.Add("model.norm.weight", {hidden}).Add("lm_head.weight", {vocab, hidden});
  return b.Build();
}

v1::ModelManifest LargeMoeManifest(int layers, int dense_layers, int experts) {
  const int64_t hidden = 7168, q_lora = 1536, kv_lora = 512, heads = 64, vocab = 163840;
  const int64_t nope = 128, rope = 64, v_head = 128, dense_ffn = 18432, expert_ffn = 2048;
  ManifestBuilder b("kimi-k2-like");
  b.Add("model.embed_tokens.weight", {vocab, hidden});
  for (int l = 0; l < layers; ++l) {
    std::string p = absl::StrCat("model.layers.", l, ".");
    b.Add(p + "self_attn.q_a_proj.weight", {q_lora, hidden})
        .Add(p + "self_attn.q_a_layernorm.weight", {q_lora})
        .Add(p + "self_attn.q_b_proj.weight", {heads * (nope + rope), q_lora})
        .Add(p + "self_attn.kv_a_proj_with_mqa.weight", {kv_lora + rope, hidden})
        .Add(p + "self_attn.kv_a_layernorm.weight", {kv_lora})
        .Add(p + "self_attn.kv_b_proj.weight", {heads * (nope + v_head), kv_lora})
        .Add(p + "self_attn.o_proj.weight", {hidden, heads * v_head});
    if (l < dense_layers) {
      b.Add(p + "mlp.gate_proj.weight", {dense_ffn, hidden})
          .Add(p + "mlp.up_proj.weight", {dense_ffn, hidden})
          .Add(p + "mlp.down_proj.weight", {hidden, dense_ffn});
    } else {
      for (int e = 0; e < experts; ++e) {
        std::string q = absl::StrCat(p, "mlp.experts.", e, ".");
        b.Add(q + "gate_proj.weight", {expert_ffn, hidden})
            .Add(q + "up_proj.weight", {expert_ffn, hidden})
            .Add(q + "down_proj.weight", {hidden, expert_ffn});
      }
      b.Add(p + "mlp.gate.weight", {experts, hidden})
          .Add(p + "mlp.gate.e_score_correction_bias", {experts}, v1::FP32)
          .Add(p + "mlp.shared_experts.gate_proj.weight", {expert_ffn, hidden})
          .Add(p + "mlp.shared_experts.up_proj.weight", {expert_ffn, hidden})
          .Add(p + "mlp.shared_experts.down_proj.weight", {hidden, expert_ffn});
    }
    b.Add(p + "input_layernorm.weight", {hidden}).Add(p + "post_attention_layernorm.weight", {hidden});
  }
  b.Add("model.norm.weight", {hidden}).Add("lm_head.weight", {vocab, hidden});
  return b.Build();
}

v1::ModelManifest RandomManifest(uint64_t seed, int tensors, int experts) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const v1::DType dtypes[] = {v1::BF16, v1::FP16, v1::FP32};
  ManifestBuilder b(absl::StrCat("random-", seed));
  int layers = static_cast<int>(pick(1, 8));
  for (int i = 0; i < tensors; ++i) {
    int layer = static_cast<int>(i * layers / tensors);
    std::string p = absl::StrCat("model.layers.", layer, ".");
    v1::DType dtype = pick(0, 9) < 7 ? v1::BF16 : dtypes[pick(0, 2)];
    int kind = static_cast<int>(pick(0, 9));
    if (kind < 3) {
      b.Add(absl::StrCat(p, "norm", i, ".weight"), {pick(1, 5000)}, dtype);
    } else if (kind < 8 || experts == 0) {
      b.Add(absl::StrCat(p, "proj", i, ".weight"), {pick(1, 700), pick(1, 700)}, dtype);
    } else if (kind == 8) {
      int e = static_cast<int>(pick(0, experts - 1));
      b.Add(absl::StrCat(p, "mlp.experts.", e, ".w", i, ".weight"), {pick(1, 300), pick(1, 300)}, dtype);
    } else {
      b.Add(absl::StrCat(p, "mlp.experts.w", i), {experts, pick(1, 64), pick(1, 64)}, dtype);
    }
  }
  // Make sure the highest expert index exists so num_experts == experts.
  if (experts > 0) {
    b.Add(absl::StrCat("model.layers.0.mlp.experts.", experts - 1, ".last.weight"), {16, 16});
  }
  return b.Build();
}

v1::PlanRequest MakeRequest(const v1::ModelManifest& manifest, int world_size, int pp, int ep, v1::Policy policy,
                            int comm_buffer_mb) {
  v1::PlanRequest r;
  *r.mutable_manifest() = manifest;
  r.mutable_topology()->set_world_size(world_size);
  r.mutable_topology()->set_pp(pp);
  r.mutable_topology()->set_ep(ep);
  r.mutable_policy()->set_policy(policy);
  r.mutable_policy()->set_comm_buffer_mb(comm_buffer_mb);
  return r;
}

}  // namespace muonshard::testing
