#include "importer/tp_split.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "importer/hf_import.h"
#include "tests/importer/import_test_util.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::importer {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;
using testing::IndexOf;
using testing::ReadConfig;

TpSplitOptions Tp(int tp, bool split_experts = false) {
  TpSplitOptions o;
  o.tp = tp;
  o.split_experts = split_experts;
  return o;
}

v1::ModelManifest Imported(absl::string_view model, bool mtp = false) {
  ImportOptions options;
  options.mtp = mtp;
  absl::StatusOr<std::string> json = ReadConfig(model);
  EXPECT_TRUE(json.ok()) << json.status();
  absl::StatusOr<v1::ModelManifest> m = ImportHfConfig(*json, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

v1::TpSplit SplitOf(const v1::ModelManifest& m, const std::string& name) {
  const int i = IndexOf(m, name);
  if (i < 0) {
    ADD_FAILURE() << "no tensor " << name;
    return v1::TP_SPLIT_UNSPECIFIED;
  }
  return m.tensors(i).tp_split();
}

TEST(MarkTensorParallelTest, Llama_MegatronSplits) {
  v1::ModelManifest m = Imported("Llama-3.1-8B");
  MUONSHARD_ASSERT_OK(MarkTensorParallel(Tp(8), &m));
  const std::string p = "model.layers.3.";
  for (const char* column : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                             "mlp.gate_proj.weight", "mlp.up_proj.weight"}) {
    EXPECT_EQ(SplitOf(m, p + column), v1::TP_COLUMN) << column;
  }
  EXPECT_EQ(SplitOf(m, p + "self_attn.o_proj.weight"), v1::TP_ROW);
  EXPECT_EQ(SplitOf(m, p + "mlp.down_proj.weight"), v1::TP_ROW);
  EXPECT_EQ(SplitOf(m, p + "input_layernorm.weight"), v1::TP_REPLICATED);
  EXPECT_EQ(SplitOf(m, "model.embed_tokens.weight"), v1::TP_COLUMN);  // vocab-parallel
  EXPECT_EQ(SplitOf(m, "lm_head.weight"), v1::TP_COLUMN);
  EXPECT_EQ(SplitOf(m, "model.norm.weight"), v1::TP_REPLICATED);
}

TEST(MarkTensorParallelTest, DeepSeekMla_LowRankProjectionsReplicatedExpertsWhole) {
  v1::ModelManifest m = Imported("DeepSeek-V3", /*mtp=*/true);
  MUONSHARD_ASSERT_OK(MarkTensorParallel(Tp(8), &m));
  const std::string p = "model.layers.5.";
  EXPECT_EQ(SplitOf(m, p + "self_attn.q_a_proj.weight"), v1::TP_REPLICATED);
  EXPECT_EQ(SplitOf(m, p + "self_attn.kv_a_proj_with_mqa.weight"), v1::TP_REPLICATED);
  EXPECT_EQ(SplitOf(m, p + "self_attn.q_b_proj.weight"), v1::TP_COLUMN);
  EXPECT_EQ(SplitOf(m, p + "self_attn.kv_b_proj.weight"), v1::TP_COLUMN);
  EXPECT_EQ(SplitOf(m, p + "mlp.gate.weight"), v1::TP_REPLICATED);  // the router
  EXPECT_EQ(SplitOf(m, p + "mlp.experts.7.up_proj.weight"), v1::TP_REPLICATED);
  EXPECT_EQ(SplitOf(m, p + "mlp.shared_experts.down_proj.weight"), v1::TP_ROW);
  EXPECT_EQ(SplitOf(m, "model.layers.61.shared_head.head.weight"), v1::TP_COLUMN);
  EXPECT_EQ(SplitOf(m, "model.layers.61.eh_proj.weight"), v1::TP_REPLICATED);

  MUONSHARD_ASSERT_OK(MarkTensorParallel(Tp(8, /*split_experts=*/true), &m));
  EXPECT_EQ(SplitOf(m, p + "mlp.experts.7.up_proj.weight"), v1::TP_COLUMN);
  EXPECT_EQ(SplitOf(m, p + "mlp.experts.7.down_proj.weight"), v1::TP_ROW);
}

TEST(MarkTensorParallelTest, GptOss_InOutStacksSplitAlongTheirLastDimensionAndBiasesFollowColumns) {
  v1::ModelManifest m = Imported("gpt-oss-20b");
  MUONSHARD_ASSERT_OK(MarkTensorParallel(Tp(2, /*split_experts=*/true), &m));
  const std::string p = "model.layers.0.";
  EXPECT_EQ(SplitOf(m, p + "mlp.experts.gate_up_proj"), v1::TP_COLUMN);
  EXPECT_EQ(SplitOf(m, p + "mlp.experts.gate_up_proj_bias"), v1::TP_COLUMN);
  EXPECT_EQ(SplitOf(m, p + "mlp.experts.down_proj"), v1::TP_ROW);
  EXPECT_EQ(SplitOf(m, p + "mlp.experts.down_proj_bias"), v1::TP_REPLICATED);  // a row layer's bias
  EXPECT_EQ(SplitOf(m, p + "self_attn.q_proj.bias"), v1::TP_COLUMN);
  EXPECT_EQ(SplitOf(m, p + "self_attn.o_proj.bias"), v1::TP_REPLICATED);
}

TEST(MarkTensorParallelTest, Mixtral_W1W3ColumnW2Row) {
  v1::ModelManifest m = Imported("Mixtral-8x7B-v0.1");
  MUONSHARD_ASSERT_OK(MarkTensorParallel(Tp(2, /*split_experts=*/true), &m));
  const std::string p = "model.layers.0.block_sparse_moe.";
  EXPECT_EQ(SplitOf(m, p + "experts.3.w1.weight"), v1::TP_COLUMN);
  EXPECT_EQ(SplitOf(m, p + "experts.3.w3.weight"), v1::TP_COLUMN);
  EXPECT_EQ(SplitOf(m, p + "experts.3.w2.weight"), v1::TP_ROW);
  EXPECT_EQ(SplitOf(m, p + "gate.weight"), v1::TP_REPLICATED);
}

TEST(MarkTensorParallelTest, IndivisibleDimensionNamesTheTensorAndChangesNothing) {
  v1::ModelManifest m = Imported("Llama-3.1-8B");  // 8 KV heads of 128: k_proj out = 1024
  const v1::ModelManifest before = m;
  EXPECT_THAT(MarkTensorParallel(Tp(3), &m),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor \"model.layers.0.self_attn.q_proj.weight\": column-parallel dimension 0 "
                                 "(4096) is not divisible by tp 3")));
  EXPECT_EQ(m.SerializeAsString(), before.SerializeAsString());
  EXPECT_THAT(MarkTensorParallel(Tp(0), &m), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tp")));
}

// A tensor-parallel program's parameters: shard shapes, one tensor marked
// by hand. The rules mark the rest; split dimensions grow by tp.
TEST(MarkTensorParallelTest, ShardShapesAndKeptMarks) {
  v1::ModelManifest m = Imported("Llama-3.1-8B");
  const int q = IndexOf(m, "model.layers.0.self_attn.q_proj.weight");
  const int o = IndexOf(m, "model.layers.0.self_attn.o_proj.weight");
  const int norm = IndexOf(m, "model.layers.0.input_layernorm.weight");
  m.mutable_tensors(q)->set_shape(0, 4096 / 4);
  m.mutable_tensors(o)->set_shape(1, 4096 / 4);
  m.mutable_tensors(norm)->set_tp_split(v1::TP_COLUMN);  // by hand
  TpSplitOptions options = Tp(4);
  options.keep_marked = true;
  options.shard_shapes = true;
  MUONSHARD_ASSERT_OK(MarkTensorParallel(options, &m));
  EXPECT_EQ(m.tensors(q).shape(0), 4096);
  EXPECT_EQ(m.tensors(o).shape(1), 4096);
  EXPECT_EQ(m.tensors(norm).tp_split(), v1::TP_COLUMN);
  EXPECT_EQ(m.tensors(norm).shape(0), 4 * 4096);
  v1::ModelManifest row_1d = Imported("Llama-3.1-8B");
  row_1d.mutable_tensors(norm)->set_tp_split(v1::TP_ROW);
  options.shard_shapes = false;
  EXPECT_THAT(MarkTensorParallel(options, &row_1d),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor \"model.layers.0.input_layernorm.weight\": a 1-D tensor has no row split")));
}

}  // namespace
}  // namespace muonshard::importer
