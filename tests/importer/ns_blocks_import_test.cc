// Fused weights and their Newton-Schulz blocks (TensorSpec.ns_blocks) as the
// importers set them: the HF families phi3, gpt_neox and falcon (names,
// shapes, order, totals and blocks), gpt-oss's alternating gate_up columns,
// DeepSeek-V3's kv_b_proj per head behind ImportOptions.ns_blocks_mla, and
// the tensor-name rules of --ns-blocks (ns_blocks_rules.h) in both
// importers and the CLI. Every manifest here is planned too: the planner
// accepts the blocks it is given.
//
// The configs (tests/importer/configs/) keep the parameter-shaping fields of
// the released config.json files:
//   Phi-3-mini-4k-instruct  microsoft/Phi-3-mini-4k-instruct: hidden 3072,
//     intermediate 8192, 32 layers, 32 heads / 32 KV heads, vocab 32064,
//     untied; 3,821,079,552 parameters, the published figure, reproduced.
//   Phi-4-mini-instruct  microsoft/Phi-4-mini-instruct (model_type phi3):
//     hidden 3072, intermediate 8192, 32 layers, 24 heads / 8 KV heads (GQA),
//     vocab 200064, tied; 3,836,021,760 computed ("3.8B" published).
//   pythia-160m  EleutherAI/pythia-160m: hidden 768, intermediate 3072, 12
//     layers, 12 heads, vocab 50304, untied, float16; 162,322,944, the
//     published figure, reproduced.
//   falcon-7b  tiiuae/falcon-7b: hidden 4544, 71 heads, multi_query, 32
//     layers, parallel_attn, no bias, vocab 65024, tied (FalconConfig's
//     default); 6,921,720,704, the published figure, reproduced.
//   falcon-40b  tiiuae/falcon-40b: hidden 8192, 128 heads / 8 KV heads,
//     new_decoder_architecture, 60 layers, vocab 65024, tied;
//     41,303,293,952 computed.

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "importer/hf_import.h"
#include "importer/manifest_summary.h"
#include "importer/ns_blocks_rules.h"
#include "importer/safetensors_import.h"
#include "importer/tp_split.h"
#include "plan/model.h"
#include "plan/ns_blocks.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"
#include "tests/importer/import_test_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"

namespace muonshard::importer {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ImportConfig;
using testing::IndexOf;
using testing::NamesWithPrefix;
using testing::ReadConfig;
using testing::Shape;
using testing::Tensor;

// The blocks of `name` as their text form ("" when it has none).
std::string BlocksOf(const v1::ModelManifest& m, absl::string_view name) {
  const v1::TensorSpec t = Tensor(m, name);
  return t.has_ns_blocks() ? planner::NsBlocksText(t.ns_blocks()) : "";
}

int CountBlocked(const v1::ModelManifest& m) {
  int n = 0;
  for (const v1::TensorSpec& t : m.tensors()) n += t.has_ns_blocks();
  return n;
}

// The manifest planned on `world` ranks (tp and balanced optional), checked.
absl::StatusOr<v1::Plan> Planned(const v1::ModelManifest& m, int world, int tp = 1) {
  v1::PlanRequest request;
  *request.mutable_manifest() = m;
  request.mutable_topology()->set_world_size(world);
  request.mutable_topology()->set_tp(tp);
  request.mutable_policy()->set_policy(v1::BALANCED);
  absl::StatusOr<v1::Plan> plan = planner::ComputePlan(request);
  if (plan.ok()) MUONSHARD_RETURN_IF_ERROR(planner::ValidatePlan(*plan));
  return plan;
}

const v1::PlannedTensor* PlannedTensor(const v1::Plan& plan, absl::string_view name) {
  for (const v1::PlannedTensor& t : plan.tensors()) {
    if (t.name() == name) return &t;
  }
  ADD_FAILURE() << "no planned tensor " << name;
  return nullptr;
}

TpSplitOptions Tp(int tp) {
  TpSplitOptions o;
  o.tp = tp;
  return o;
}

// ---------------------------------------------------------------- phi3

TEST(NsBlocksImportTest, Phi3Mini_FusedQkvAndGateUpWithTheirBlocks) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest m, ImportConfig("Phi-3-mini-4k-instruct"));
  const ManifestSummary s = Summarize(m);
  EXPECT_EQ(s.tensors, 195);
  EXPECT_EQ(s.parameters, 3'821'079'552);
  EXPECT_EQ(m.model(), "phi3");
  EXPECT_EQ(m.tensors(0).name(), "model.embed_tokens.weight");
  EXPECT_THAT(NamesWithPrefix(m, "model.layers.0."),
              ElementsAre("model.layers.0.self_attn.o_proj.weight", "model.layers.0.self_attn.qkv_proj.weight",
                          "model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.mlp.down_proj.weight",
                          "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"));
  EXPECT_THAT(Shape(Tensor(m, "model.layers.31.self_attn.qkv_proj.weight")), ElementsAre(9216, 3072));
  EXPECT_THAT(Shape(Tensor(m, "model.layers.31.mlp.gate_up_proj.weight")), ElementsAre(16384, 3072));
  EXPECT_EQ(BlocksOf(m, "model.layers.31.self_attn.qkv_proj.weight"), "rows:3072,3072,3072");
  EXPECT_EQ(BlocksOf(m, "model.layers.31.mlp.gate_up_proj.weight"), "rows:8192,8192");
  EXPECT_EQ(BlocksOf(m, "model.layers.31.self_attn.o_proj.weight"), "");
  EXPECT_EQ(CountBlocked(m), 64);
  EXPECT_EQ(m.tensors(194).name(), "lm_head.weight");
  MUONSHARD_EXPECT_OK(Planned(m, 8).status());
}

TEST(NsBlocksImportTest, Phi4Mini_GqaSizesAndTiedEmbeddings) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest m, ImportConfig("Phi-4-mini-instruct"));
  const ManifestSummary s = Summarize(m);
  EXPECT_EQ(s.tensors, 194);  // tied: no lm_head
  EXPECT_EQ(s.parameters, 3'836'021'760);
  EXPECT_THAT(Shape(Tensor(m, "model.layers.0.self_attn.qkv_proj.weight")), ElementsAre(5120, 3072));
  EXPECT_EQ(BlocksOf(m, "model.layers.0.self_attn.qkv_proj.weight"), "rows:3072,1024,1024");
  EXPECT_THAT(Shape(Tensor(m, "model.layers.0.self_attn.o_proj.weight")), ElementsAre(3072, 3072));
  EXPECT_EQ(IndexOf(m, "lm_head.weight"), -1);
  // With tp 2 (Megatron's column split of qkv_proj and gate_up_proj), gate
  // and up fall on one tp rank each: orthogonalised in place; q | k | v are
  // cut inside q: gathered.
  MUONSHARD_ASSERT_OK(MarkTensorParallel(Tp(2), &m));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, Planned(m, 4, 2));
  EXPECT_TRUE(PlannedTensor(plan, "model.layers.0.mlp.gate_up_proj.weight")->ns_local());
  EXPECT_FALSE(PlannedTensor(plan, "model.layers.0.self_attn.qkv_proj.weight")->ns_local());
}

// ---------------------------------------------------------------- gpt_neox

TEST(NsBlocksImportTest, Pythia160m_QueryKeyValueInterleavedPerHead) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest m, ImportConfig("pythia-160m"));
  const ManifestSummary s = Summarize(m);
  EXPECT_EQ(s.tensors, 148);
  EXPECT_EQ(s.parameters, 162'322'944);
  EXPECT_EQ(s.by_dtype.at(v1::FP16).tensors, 148);
  EXPECT_EQ(m.tensors(0).name(), "gpt_neox.embed_in.weight");
  EXPECT_THAT(NamesWithPrefix(m, "gpt_neox.layers.0."),
              ElementsAre("gpt_neox.layers.0.input_layernorm.weight", "gpt_neox.layers.0.input_layernorm.bias",
                          "gpt_neox.layers.0.post_attention_layernorm.weight",
                          "gpt_neox.layers.0.post_attention_layernorm.bias",
                          "gpt_neox.layers.0.attention.query_key_value.weight",
                          "gpt_neox.layers.0.attention.query_key_value.bias",
                          "gpt_neox.layers.0.attention.dense.weight", "gpt_neox.layers.0.attention.dense.bias",
                          "gpt_neox.layers.0.mlp.dense_h_to_4h.weight", "gpt_neox.layers.0.mlp.dense_h_to_4h.bias",
                          "gpt_neox.layers.0.mlp.dense_4h_to_h.weight", "gpt_neox.layers.0.mlp.dense_4h_to_h.bias"));
  EXPECT_THAT(Shape(Tensor(m, "gpt_neox.layers.11.attention.query_key_value.weight")), ElementsAre(2304, 768));
  EXPECT_EQ(BlocksOf(m, "gpt_neox.layers.11.attention.query_key_value.weight"), "rows:64,64,64x12");
  EXPECT_EQ(BlocksOf(m, "gpt_neox.layers.11.attention.query_key_value.bias"), "");
  EXPECT_EQ(CountBlocked(m), 12);
  EXPECT_EQ(m.tensors(145).name(), "gpt_neox.final_layer_norm.weight");
  EXPECT_EQ(m.tensors(147).name(), "embed_out.weight");
  // Megatron splits query_key_value by columns over whole heads: with tp
  // dividing the heads every tp rank orthogonalises its own heads.
  MUONSHARD_ASSERT_OK(MarkTensorParallel(Tp(4), &m));
  EXPECT_EQ(Tensor(m, "gpt_neox.layers.0.attention.query_key_value.weight").tp_split(), v1::TP_COLUMN);
  EXPECT_EQ(Tensor(m, "gpt_neox.layers.0.attention.dense.weight").tp_split(), v1::TP_ROW);
  EXPECT_EQ(Tensor(m, "gpt_neox.layers.0.attention.dense.bias").tp_split(), v1::TP_REPLICATED);
  EXPECT_EQ(Tensor(m, "gpt_neox.layers.0.mlp.dense_h_to_4h.weight").tp_split(), v1::TP_COLUMN);
  EXPECT_EQ(Tensor(m, "gpt_neox.layers.0.mlp.dense_4h_to_h.weight").tp_split(), v1::TP_ROW);
  EXPECT_EQ(Tensor(m, "gpt_neox.embed_in.weight").tp_split(), v1::TP_COLUMN);
  EXPECT_EQ(Tensor(m, "embed_out.weight").tp_split(), v1::TP_COLUMN);
  EXPECT_EQ(Tensor(m, "gpt_neox.final_layer_norm.weight").tp_split(), v1::TP_REPLICATED);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, Planned(m, 8, 4));
  const v1::PlannedTensor* qkv = PlannedTensor(plan, "gpt_neox.layers.0.attention.query_key_value.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_TRUE(qkv->ns_local());
  EXPECT_LE(plan.stats().max_over_lb_ns_flops(), 1.05);
}

TEST(NsBlocksImportTest, GptNeox_TiedAndBiasFree) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string json, ReadConfig("pythia-160m"));
  json = testing::SetField(json, "tie_word_embeddings", testing::Flag(true));
  json = testing::SetField(json, "attention_bias", testing::Flag(false));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest m, ImportHfConfig(json, {}));
  EXPECT_EQ(IndexOf(m, "embed_out.weight"), -1);
  EXPECT_EQ(IndexOf(m, "gpt_neox.layers.0.attention.query_key_value.bias"), -1);
  EXPECT_EQ(IndexOf(m, "gpt_neox.layers.0.attention.dense.bias"), -1);
  EXPECT_GE(IndexOf(m, "gpt_neox.layers.0.mlp.dense_h_to_4h.bias"), 0);  // the MLP is always biased
  json = testing::SetField(json, "num_attention_heads", testing::Number(7));
  EXPECT_THAT(ImportHfConfig(json, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("hidden_size 768 is not divisible by num_attention_heads 7")));
}

// ---------------------------------------------------------------- falcon

TEST(NsBlocksImportTest, Falcon7b_MultiQuery) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest m, ImportConfig("falcon-7b"));
  const ManifestSummary s = Summarize(m);
  EXPECT_EQ(s.tensors, 195);
  EXPECT_EQ(s.parameters, 6'921'720'704);
  EXPECT_EQ(m.tensors(0).name(), "transformer.word_embeddings.weight");
  EXPECT_THAT(NamesWithPrefix(m, "transformer.h.0."),
              ElementsAre("transformer.h.0.self_attention.query_key_value.weight",
                          "transformer.h.0.self_attention.dense.weight", "transformer.h.0.mlp.dense_h_to_4h.weight",
                          "transformer.h.0.mlp.dense_4h_to_h.weight", "transformer.h.0.input_layernorm.weight",
                          "transformer.h.0.input_layernorm.bias"));
  // [all 71 Q heads | K | V], head_dim 64.
  EXPECT_THAT(Shape(Tensor(m, "transformer.h.31.self_attention.query_key_value.weight")), ElementsAre(4672, 4544));
  EXPECT_EQ(BlocksOf(m, "transformer.h.31.self_attention.query_key_value.weight"), "rows:4544,64,64");
  EXPECT_THAT(Shape(Tensor(m, "transformer.h.31.mlp.dense_h_to_4h.weight")), ElementsAre(18176, 4544));
  EXPECT_EQ(m.tensors(194).name(), "transformer.ln_f.bias");  // tied: no lm_head
  EXPECT_EQ(CountBlocked(m), 32);
  MUONSHARD_EXPECT_OK(Planned(m, 8).status());
}

TEST(NsBlocksImportTest, Falcon40b_PerKvGroup) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest m, ImportConfig("falcon-40b"));
  const ManifestSummary s = Summarize(m);
  EXPECT_EQ(s.tensors, 1 + 60 * 8 + 2);
  EXPECT_EQ(s.parameters, 41'303'293'952);
  // Per KV group: its 16 Q heads, then K and V, head_dim 64.
  EXPECT_THAT(Shape(Tensor(m, "transformer.h.0.self_attention.query_key_value.weight")), ElementsAre(9216, 8192));
  EXPECT_EQ(BlocksOf(m, "transformer.h.0.self_attention.query_key_value.weight"), "rows:1024,64,64x8");
  EXPECT_THAT(NamesWithPrefix(m, "transformer.h.0.ln"),
              ElementsAre("transformer.h.0.ln_attn.weight", "transformer.h.0.ln_attn.bias",
                          "transformer.h.0.ln_mlp.weight", "transformer.h.0.ln_mlp.bias"));
  // tp 8 puts one KV group on each tp rank: orthogonalised in place.
  MUONSHARD_ASSERT_OK(MarkTensorParallel(Tp(8), &m));
  EXPECT_EQ(Tensor(m, "transformer.h.0.self_attention.dense.weight").tp_split(), v1::TP_ROW);
  EXPECT_EQ(Tensor(m, "transformer.word_embeddings.weight").tp_split(), v1::TP_COLUMN);
  m.mutable_tensors()->DeleteSubrange(1 + 2 * 8, m.tensors_size() - 1 - 2 * 8);  // two layers are enough
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, Planned(m, 16, 8));
  EXPECT_TRUE(PlannedTensor(plan, "transformer.h.1.self_attention.query_key_value.weight")->ns_local());
}

TEST(NsBlocksImportTest, Falcon_LayoutsAndNormsFollowTheConfig) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string falcon7b, ReadConfig("falcon-7b"));
  // RW-1B's shape: the old architecture without multi-query, every head its
  // own [q_h, k_h, v_h]; sequential attention (two norms); biases.
  std::string json = testing::SetField(falcon7b, "multi_query", testing::Flag(false));
  json = testing::SetField(json, "parallel_attn", testing::Flag(false));
  json = testing::SetField(json, "bias", testing::Flag(true));
  json = testing::SetField(json, "hidden_size", testing::Number(2048));
  json = testing::SetField(json, "num_attention_heads", testing::Number(32));
  json = testing::SetField(json, "tie_word_embeddings", testing::Flag(false));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest m, ImportHfConfig(json, {}));
  EXPECT_THAT(Shape(Tensor(m, "transformer.h.0.self_attention.query_key_value.weight")), ElementsAre(6144, 2048));
  EXPECT_EQ(BlocksOf(m, "transformer.h.0.self_attention.query_key_value.weight"), "rows:64,64,64x32");
  EXPECT_GE(IndexOf(m, "transformer.h.0.self_attention.query_key_value.bias"), 0);
  EXPECT_THAT(NamesWithPrefix(m, "transformer.h.0.post"), ElementsAre("transformer.h.0.post_attention_layernorm.weight",
                                                                      "transformer.h.0.post_attention_layernorm.bias"));
  EXPECT_LT(IndexOf(m, "transformer.h.0.post_attention_layernorm.weight"),
            IndexOf(m, "transformer.h.0.input_layernorm.weight"));
  EXPECT_EQ(m.tensors(m.tensors_size() - 1).name(), "lm_head.weight");
  // The new architecture with one norm in parallel attention (Falcon2).
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string falcon40b, ReadConfig("falcon-40b"));
  json = testing::SetField(falcon40b, "num_ln_in_parallel_attn", testing::Number(1));
  json = testing::SetField(json, "ffn_hidden_size", testing::Number(16384));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(m, ImportHfConfig(json, {}));
  EXPECT_THAT(NamesWithPrefix(m, "transformer.h.0.ln"), ElementsAre());
  EXPECT_GE(IndexOf(m, "transformer.h.0.input_layernorm.weight"), 0);
  EXPECT_THAT(Shape(Tensor(m, "transformer.h.0.mlp.dense_h_to_4h.weight")), ElementsAre(16384, 8192));
  // Query heads that do not split into the KV groups.
  json = testing::SetField(falcon40b, "num_kv_heads", testing::Number(7));
  EXPECT_THAT(ImportHfConfig(json, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("num_attention_heads 128 is not divisible by num_kv_heads 7")));
}

// ---------------------------------------------------------------- gpt-oss

TEST(NsBlocksImportTest, GptOss_GateUpInAlternatingColumns) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest m, ImportConfig("gpt-oss-20b"));
  EXPECT_EQ(Summarize(m).parameters, 20'914'757'184);  // unchanged: blocks shape nothing
  const std::string gate_up = "model.layers.23.mlp.experts.gate_up_proj";
  EXPECT_THAT(Shape(Tensor(m, gate_up)), ElementsAre(32, 2880, 5760));
  EXPECT_EQ(Tensor(m, gate_up).layout(), v1::IN_OUT);
  EXPECT_EQ(BlocksOf(m, gate_up), "cols:stride2");
  EXPECT_EQ(BlocksOf(m, "model.layers.23.mlp.experts.down_proj"), "");
  EXPECT_EQ(BlocksOf(m, "model.layers.23.mlp.experts.gate_up_proj_bias"), "");
  EXPECT_EQ(CountBlocked(m), 24);
  // Planned per expert and per half: 32 experts x 2 blocks of 2880 x 2880.
  m.mutable_tensors()->DeleteSubrange(1, 23 * 17);  // the embedding, the last layer (17 tensors), norm, lm_head
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, Planned(m, 4));
  double flops = 0;
  for (const v1::RankPlan& r : plan.ranks()) flops += r.ns_flops();
  const int steps = plan.policy().ns_steps();
  const double expected = 32 * 2 * planner::NsFlops(2880, 2880, steps) + 32 * planner::NsFlops(2880, 2880, steps) +
                          planner::NsFlops(4096, 2880, steps) + 2 * planner::NsFlops(512, 2880, steps) +
                          planner::NsFlops(2880, 4096, steps);
  EXPECT_NEAR(flops, expected, 1e-9 * expected);
}

// ---------------------------------------------------------------- DeepSeek-V3 MLA

TEST(NsBlocksImportTest, DeepseekV3_KvBProjPerHeadBehindTheFlag) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest plain, ImportConfig("DeepSeek-V3"));
  EXPECT_EQ(CountBlocked(plain), 0);
  ImportOptions options;
  options.ns_blocks_mla = true;
  options.mtp = true;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest m, ImportConfig("DeepSeek-V3", options));
  EXPECT_EQ(m.tensors_size(), plain.tensors_size() + 788);  // the MTP layer, as before
  // 128 heads of [k_nope 128 | v 128] rows over kv_lora_rank 512.
  EXPECT_THAT(Shape(Tensor(m, "model.layers.0.self_attn.kv_b_proj.weight")), ElementsAre(32768, 512));
  EXPECT_EQ(BlocksOf(m, "model.layers.0.self_attn.kv_b_proj.weight"), "rows:128,128x128");
  EXPECT_EQ(BlocksOf(m, "model.layers.61.self_attn.kv_b_proj.weight"), "rows:128,128x128");  // MTP
  EXPECT_EQ(BlocksOf(m, "model.layers.0.self_attn.q_b_proj.weight"), "");
  EXPECT_EQ(CountBlocked(m), 62);
  // Kimi-K2 shares the architecture and the flag.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest kimi, ImportConfig("Kimi-K2-Instruct", options));
  EXPECT_EQ(BlocksOf(kimi, "model.layers.0.self_attn.kv_b_proj.weight"), "rows:128,128x64");
}

TEST(NsBlocksImportTest, DeepseekV3_PlannedWithHeadsOnTheirTpRanks) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string json, ReadConfig("DeepSeek-V3"));
  json = testing::SetField(json, "num_hidden_layers", testing::Number(3));
  json = testing::SetField(json, "n_routed_experts", testing::Number(8));
  ImportOptions options;
  options.ns_blocks_mla = true;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest m, ImportHfConfig(json, options));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan whole, Planned(m, 8));
  const v1::PlannedTensor* kv_b = PlannedTensor(whole, "model.layers.2.self_attn.kv_b_proj.weight");
  ASSERT_NE(kv_b, nullptr);
  EXPECT_EQ(planner::NsBlocksText(kv_b->ns_blocks()), "rows:128,128x128");
  MUONSHARD_ASSERT_OK(MarkTensorParallel(Tp(4), &m));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan tp, Planned(m, 8, 4));
  EXPECT_TRUE(PlannedTensor(tp, "model.layers.2.self_attn.kv_b_proj.weight")->ns_local());
}

TEST(NsBlocksImportTest, MlaFlagOnAModelWithoutMlaIsRefused) {
  ImportOptions options;
  options.ns_blocks_mla = true;
  EXPECT_THAT(ImportConfig("Llama-3.1-8B", options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--ns-blocks-mla: model_type \"llama\" has no multi-head latent attention")));
}

// ---------------------------------------------------------------- rules

v1::ModelManifest RuleManifest() {
  v1::ModelManifest m;
  auto add = [&m](const std::string& name, std::vector<int64_t> shape) {
    v1::TensorSpec* t = m.add_tensors();
    t->set_name(name);
    for (int64_t d : shape) t->add_shape(d);
    t->set_dtype(v1::BF16);
  };
  for (int l = 0; l < 2; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    add(p + "attention.wqkv.weight", {96, 64});
    add(p + "attention.wqkv.bias", {96});
    add(p + "feed_forward.w13.weight", {256, 64});
    add(p + "feed_forward.w2.weight", {64, 128});
  }
  add("moe.experts.gate_up", {4, 64, 256});
  return m;
}

TEST(NsBlocksRulesTest, RulesSetTheBlocksOfTheTensorsTheyMatchWhole) {
  v1::ModelManifest m = RuleManifest();
  MUONSHARD_ASSERT_OK(ApplyNsBlocksRules({R"(layers\.\d+\.attention\.wqkv\.weight=rows:32,8,8x2)",
                                          ".*w13\\.weight=rows:128,128", "moe.experts.gate_up = cols:stride2"},
                                         &m));
  EXPECT_EQ(BlocksOf(m, "layers.1.attention.wqkv.weight"), "rows:32,8,8x2");
  EXPECT_EQ(BlocksOf(m, "layers.1.attention.wqkv.bias"), "");  // the regex matches whole names only
  EXPECT_EQ(BlocksOf(m, "layers.0.feed_forward.w13.weight"), "rows:128,128");
  EXPECT_EQ(BlocksOf(m, "layers.0.feed_forward.w2.weight"), "");
  EXPECT_EQ(BlocksOf(m, "moe.experts.gate_up"), "cols:stride2");
  MUONSHARD_EXPECT_OK(Planned(m, 2).status());
  // A '=' inside the regex: the last one splits.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(NsBlocksRule rule, ParseNsBlocksRule("a(?:=)?b=cols:stride4"));
  EXPECT_EQ(rule.pattern, "a(?:=)?b");
  EXPECT_EQ(rule.blocks.stride(), 4);
}

TEST(NsBlocksRulesTest, BadRulesAreRefusedNamingThemAndChangeNothing) {
  const v1::ModelManifest before = RuleManifest();
  struct Case {
    std::vector<std::string> rules;
    std::vector<std::string> what;
  };
  const std::vector<Case> cases = {
      {{"rows:32,32"}, {"ns_blocks rule \"rows:32,32\"", "expected REGEX=BLOCKS"}},
      {{"=rows:32,32"}, {"the regex before '=' is empty"}},
      {{"(unclosed=rows:1"}, {"ns_blocks rule \"(unclosed=rows:1\"", "not a valid regex"}},
      {{".*w13\\.weight=rows:128;128"}, {"ns_blocks rule", "size \"128;128\" is not a positive integer"}},
      {{".*w13\\.weight=diag:128"}, {"axis \"diag\" is not rows or cols"}},
      {{".*wq\\.weight=rows:1"}, {"ns_blocks rule \".*wq\\.weight=rows:1\": matches no tensor"}},
      {{".*\\.w13\\.weight=rows:128,128", "layers\\.0\\.feed_forward\\..*=rows:128,128"},
       {"tensor \"layers.0.feed_forward.w13.weight\": matched by ns_blocks rules \".*\\.w13\\.weight=rows:128,128\" "
        "and \"layers\\.0\\.feed_forward\\..*=rows:128,128\""}},
      {{".*wqkv\\.weight=rows:32,32"},
       {"tensor \"layers.0.attention.wqkv.weight\" (ns_blocks rule \".*wqkv\\.weight=rows:32,32\")",
        "ns_blocks rows:32,32: the sizes sum to 64 x 1 group, not the 96 rows (dimension 0)"}},
      {{".*wqkv\\.bias=rows:48,48"}, {"tensor \"layers.0.attention.wqkv.bias\"", "the shape has 1 dimensions"}},
  };
  for (const Case& c : cases) {
    v1::ModelManifest m = before;
    const absl::Status s = ApplyNsBlocksRules(c.rules, &m);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.rules[0];
    for (const std::string& what : c.what) EXPECT_THAT(s.message(), HasSubstr(what)) << c.rules[0];
    EXPECT_EQ(CountBlocked(m), 0) << c.rules[0];
  }
}

TEST(NsBlocksRulesTest, HfImportRulesReplaceTheFamilysBlocks) {
  ImportOptions options;
  options.ns_blocks = {R"(model\.layers\.\d+\.self_attn\.qkv_proj\.weight=rows:96,96,96x32)"};
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ModelManifest m, ImportConfig("Phi-3-mini-4k-instruct", options));
  EXPECT_EQ(BlocksOf(m, "model.layers.3.self_attn.qkv_proj.weight"), "rows:96,96,96x32");
  EXPECT_EQ(BlocksOf(m, "model.layers.3.mlp.gate_up_proj.weight"), "rows:8192,8192");
  options.ns_blocks = {"nothing=rows:1"};
  EXPECT_THAT(ImportConfig("Phi-3-mini-4k-instruct", options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matches no tensor")));
}

// A safetensors header holding `tensors` (name, shape) of BF16, back to back.
SafetensorsFileHeader Header(const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
  std::string json = "{";
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    int64_t bytes = 2;
    std::string shape;
    for (size_t d = 0; d < tensors[i].second.size(); ++d) {
      bytes *= tensors[i].second[d];
      absl::StrAppend(&shape, d > 0 ? "," : "", tensors[i].second[d]);
    }
    absl::StrAppend(&json, i > 0 ? "," : "", "\"", tensors[i].first, "\":{\"dtype\":\"BF16\",\"shape\":[", shape,
                    "],\"data_offsets\":[", offset, ",", offset + bytes, "]}");
    offset += bytes;
  }
  json += "}";
  SafetensorsFileHeader h;
  h.name = "model.safetensors";
  h.json = json;
  h.file_size = 8 + static_cast<int64_t>(json.size()) + offset;
  return h;
}

TEST(NsBlocksRulesTest, SafetensorsImportAppliesTheRules) {
  const std::vector<SafetensorsFileHeader> files = {Header({{"tok_embeddings.weight", {64, 32}},
                                                            {"layers.0.attention.wqkv.weight", {96, 32}},
                                                            {"layers.0.feed_forward.w13.weight", {128, 32}}})};
  SafetensorsImportOptions options;
  options.ns_blocks = {".*wqkv\\.weight=rows:32,32,32", ".*w13\\.weight=rows:64,64"};
  MUONSHARD_ASSERT_OK_AND_ASSIGN(SafetensorsImport imported, ImportSafetensorsHeaders(files, nullptr, options));
  EXPECT_EQ(BlocksOf(imported.manifest, "layers.0.attention.wqkv.weight"), "rows:32,32,32");
  EXPECT_EQ(BlocksOf(imported.manifest, "layers.0.feed_forward.w13.weight"), "rows:64,64");
  EXPECT_EQ(BlocksOf(imported.manifest, "tok_embeddings.weight"), "");
  options.ns_blocks = {".*wqkv\\.weight=rows:48,32"};
  EXPECT_THAT(ImportSafetensorsHeaders(files, nullptr, options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"layers.0.attention.wqkv.weight\""), HasSubstr("rows:48,32"))));
}

// ---------------------------------------------------------------- CLI

using muonshard::testing::CommandResult;
using muonshard::testing::RunCtl;

TEST(NsBlocksCliTest, ImportHfFlags) {
  const std::string deepseek = testing::TestConfigPath("DeepSeek-V3");
  CommandResult r = RunCtl(absl::StrCat("import-hf '", deepseek, "' --ns-blocks-mla"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::ModelManifest m;
  MUONSHARD_ASSERT_OK(FromJson(r.out, &m, "stdout"));
  EXPECT_EQ(BlocksOf(m, "model.layers.0.self_attn.kv_b_proj.weight"), "rows:128,128x128");
  EXPECT_THAT(r.out, HasSubstr("\"ns_blocks\""));
  r = RunCtl(absl::StrCat("import-hf '", testing::TestConfigPath("Llama-3.1-8B"), "' --ns-blocks-mla"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--ns-blocks-mla: model_type \"llama\""));
  r = RunCtl(
      absl::StrCat("import-hf '", testing::TestConfigPath("Llama-3.1-8B"),
                   "' --ns-blocks '.*q_proj\\.weight=rows:2048,2048' --ns-blocks '.*up_proj.weight=cols:stride2'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  MUONSHARD_ASSERT_OK(FromJson(r.out, &m, "stdout"));
  EXPECT_EQ(BlocksOf(m, "model.layers.5.self_attn.q_proj.weight"), "rows:2048,2048");
  EXPECT_EQ(BlocksOf(m, "model.layers.5.mlp.up_proj.weight"), "cols:stride2");
  r = RunCtl(absl::StrCat("import-hf '", testing::TestConfigPath("Llama-3.1-8B"), "' --ns-blocks '.*q_proj=rows:1'"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("ns_blocks rule \".*q_proj=rows:1\": matches no tensor"));
}

TEST(NsBlocksCliTest, ImportSafetensorsRules) {
  const std::string dir = testing::TestTempPath("ckpt");
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p '", dir, "'").c_str()), 0);
  const SafetensorsFileHeader h = Header({{"layers.0.attention.wqkv.weight", {96, 32}}});
  {
    std::ofstream f(dir + "/model.safetensors", std::ios::binary);
    uint64_t n = h.json.size();
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
    f << h.json << std::string(96 * 32 * 2, '\0');
  }
  CommandResult r = RunCtl(absl::StrCat("import-safetensors '", dir, "' --ns-blocks '.*wqkv\\.weight=rows:32,32,32'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::ModelManifest m;
  MUONSHARD_ASSERT_OK(FromJson(r.out, &m, "stdout"));
  EXPECT_EQ(BlocksOf(m, "layers.0.attention.wqkv.weight"), "rows:32,32,32");
  r = RunCtl(absl::StrCat("import-safetensors '", dir, "' --ns-blocks '.*wqkv\\.weight=rows:32,32x2'"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("the sizes sum to 64 x 2 groups, not the 96 rows"));
}

}  // namespace
}  // namespace muonshard::importer
