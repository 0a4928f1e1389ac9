// `muonshardctl plan` as users run it: the real binary, exit codes 0/2,
// JSON field names scripts rely on, and messages naming the bad input.
#include <algorithm>
#include <fstream>
#include <string>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "muonshard/v1/plan.pb.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace muonshard {
namespace {

using testing::CommandResult;
using ::testing::HasSubstr;
using testing::RunCtl;

std::string WriteManifest(const v1::ModelManifest& m, const std::string& name) {
  std::string path = absl::StrCat(testing::ProcessTempDir(), "/", name);
  std::ofstream(path) << *ToJson(m);
  return path;
}

TEST(PlanCliTest, JsonHasTheFieldsScriptsRelyOn) {
  const std::string manifest = WriteManifest(testing::DenseManifest(2, 64, 96, 100), "dense.json");
  CommandResult r =
      RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 4 --policy seed-all --output json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  google::protobuf::Struct json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &json).ok());
  const auto& ranks = json.fields().at("ranks").list_value();
  ASSERT_EQ(ranks.values_size(), 4);
  for (int i = 0; i < 4; ++i) {
    const auto& rank = ranks.values(i).struct_value().fields();
    EXPECT_EQ(rank.at("rank").number_value(), i);  // printed even for rank 0
    ASSERT_TRUE(rank.count("owned") && rank.count("slices") && rank.count("ns_flops"));
    EXPECT_TRUE(rank.count("optimizer_state_bytes"));
    for (const auto& o : rank.at("owned").list_value().values()) {
      EXPECT_THAT(o.struct_value().fields().at("name").string_value(), HasSubstr("model.layers."));
    }
    for (const auto& s : rank.at("slices").list_value().values()) {
      const auto& f = s.struct_value().fields();
      EXPECT_FALSE(f.at("name").string_value().empty());
      EXPECT_TRUE(f.count("begin") && f.count("end"));
    }
  }
  const auto& stats = json.fields().at("stats").struct_value().fields();
  EXPECT_TRUE(stats.count("memory_imbalance"));
  EXPECT_TRUE(stats.count("max_over_mean_state_bytes"));
  // And it parses back as a Plan.
  v1::Plan plan;
  EXPECT_TRUE(FromJson(r.out, &plan, "stdout").ok());
  EXPECT_EQ(plan.ranks_size(), 4);
}

// Stored plans are keyed by their content hash, so the hash of a request
// must never change between versions: pinned for the bundled tiny MoE model
// (also against the streamed SHA-256 of HashRequestParts).
TEST(PlanCliTest, ContentHashIsStable) {
  CommandResult r = RunCtl("plan --manifest examples/manifests/tiny-moe.json --world-size 4 --ep 2 --output json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::Plan plan;
  ASSERT_TRUE(FromJson(r.out, &plan, "stdout").ok());
  EXPECT_EQ(plan.content_hash(), "sha256:9837cc407f2835ca6a787ff35a15cb05fe90100d336770f54d78bc02f8fcb499");
}

TEST(PlanCliTest, TableByDefault) {
  const std::string manifest = WriteManifest(testing::MoeManifest(2, 64, 32, 4, 100), "moe.json");
  CommandResult r = RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 4 --ep 2"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("state_MiB"));
  EXPECT_THAT(r.out, HasSubstr("buddy_MiB"));  // --buddy-every's host memory per rank
  EXPECT_THAT(r.out, HasSubstr("max/LB"));
}

// The summary comes first, then the rows; quantities have thousands
// separators; --sort / --top pick and order the rows of a big plan.
TEST(PlanCliTest, TableSummaryFirstGroupedSortedAndCut) {
  const std::string base = "plan --manifest examples/manifests/tiny-moe.json --world-size 4 --ep 2";
  CommandResult r = RunCtl(base);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("model tiny-moe  world 4  pp 1  ep 2  policy SEED", 0), 0u) << r.out;
  EXPECT_THAT(r.out, HasSubstr("params 4,467,456 (muon 3,932,160 in 112 tensors, adamw 535,296 in 23 tensors)"));
  EXPECT_THAT(r.out, HasSubstr("2,359,296"));  // rank 0's muon_elems
  EXPECT_LT(r.out.find("newton-schulz"), r.out.find("state_MiB"));

  r = RunCtl(absl::StrCat(base, " --sort state --top 1"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string rows = r.out.substr(r.out.find("1 of 4 ranks, by state (largest first)\n"));
  ASSERT_NE(rows.find("state_MiB"), std::string::npos) << r.out;
  // The caption, the header and the busiest rank (0: 19.5 MiB) only.
  EXPECT_EQ(std::count(rows.begin(), rows.end(), '\n'), 3) << rows;
  EXPECT_THAT(rows, HasSubstr("\n     0     0    0           19.5"));

  r = RunCtl(absl::StrCat(base, " --sort size"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("flag --sort: \"size\" is not one of rank, stage, ep, state, flops, owned, muon, "
                               "slice, memory, headroom, buddy"));
  r = RunCtl(absl::StrCat(base, " --top 2 --output json"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--output json prints every row; --top is for the table"));
}

// compare --output json is one JSON object: each policy's PlanStats, then
// exact numbers (no 9.47021e+06) and int64 as strings, as in proto3 JSON.
TEST(PlanCliTest, CompareJsonIsOneObjectWithExactNumbers) {
  CommandResult r = RunCtl("compare --manifest examples/manifests/tiny-moe.json --world-size 4 --ep 2 --output json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  google::protobuf::Struct json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &json).ok()) << r.out;
  const auto& f = json.fields();
  EXPECT_EQ(f.at("tight_lb_state_bytes").number_value(), 9470208);
  EXPECT_EQ(f.at("tight_lb_ns_flops").number_value(), 3732930560);
  EXPECT_THAT(r.out, HasSubstr("\"tight_lb_state_bytes\": 9470208,\n"));
  EXPECT_EQ(f.at("seed_max_comm_bytes").string_value(), "17402880");
  EXPECT_EQ(f.at("balanced_max_comm_bytes").string_value(), "17370624");
  EXPECT_GT(f.at("seed_plan_ms").number_value(), 0);
  EXPECT_EQ(f.at("seed").struct_value().fields().at("max_state_bytes").string_value(), "20497920");
  EXPECT_EQ(f.at("balanced").struct_value().fields().at("muon_tensors").number_value(), 112);
  EXPECT_THAT(r.out, Not(HasSubstr("e+0")));
}

// compare always plans with seed and balanced: a --policy would be ignored.
TEST(PlanCliTest, CompareRefusesPolicy) {
  CommandResult r =
      RunCtl("compare --manifest examples/manifests/tiny-moe.json --world-size 4 --ep 2 --policy balanced");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("error: compare runs both policies; --policy is not used"));
  EXPECT_TRUE(r.out.empty()) << r.out;
  CommandResult help = RunCtl("compare --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("--world-size"));
  EXPECT_THAT(help.out, Not(HasSubstr("--policy VALUE")));
}

// examples/README.md's command regenerates the bundled manifests byte for
// byte (a manifest prints the fields it sets; common/proto_json.h).
TEST(PlanCliTest, BundledManifestsRegenerateByteForByte) {
  for (const char* model : {"tiny-llama", "tiny-moe"}) {
    CommandResult r = RunCtl(absl::StrCat("import-hf examples/configs/", model, ".config.json"));
    ASSERT_EQ(r.exit_code, 0) << model << ": " << r.err;
    std::ifstream in(absl::StrCat("examples/manifests/", model, ".json"), std::ios::binary);
    const std::string bundled((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(bundled.empty()) << model;
    EXPECT_TRUE(r.out == bundled) << model << ": regenerate with: build/bin/muonshardctl import-hf examples/configs/"
                                  << model << ".config.json > examples/manifests/" << model << ".json";
  }
}

TEST(PlanCliTest, BadInputExitsTwoNamingIt) {
  const std::string dup =
      WriteManifest(testing::ManifestBuilder().Add("a.weight", {4, 4}).Add("a.weight", {4}).Build(), "dup.json");
  CommandResult r = RunCtl(absl::StrCat("plan --manifest ", dup, " --world-size 2"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("tensor \"a.weight\": duplicate name"));

  const std::string zero =
      WriteManifest(testing::ManifestBuilder().Add("model.layers.3.mlp.up_proj.weight", {4, 0}).Build(), "zero.json");
  r = RunCtl(absl::StrCat("plan --manifest ", zero, " --world-size 2"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("\"model.layers.3.mlp.up_proj.weight\": shape has a 0 dimension"));

  const std::string ok = WriteManifest(testing::MoeManifest(1, 64, 32, 6, 100), "moe6.json");
  r = RunCtl(absl::StrCat("plan --manifest ", ok, " --world-size 8 --ep 4"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("6 experts are not divisible by ep 4"));
  r = RunCtl(absl::StrCat("plan --manifest ", ok, " --world-size 6 --pp 4"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("not divisible by pp"));
  r = RunCtl(absl::StrCat("plan --manifest ", ok));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--world-size"));
  r = RunCtl(absl::StrCat("plan --manifest ", ok, " --world-size 2 --policy best"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--policy"));
  r = RunCtl("plan --manifest /nonexistent.json --world-size 2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent.json"));

  std::ofstream(absl::StrCat(testing::ProcessTempDir(), "/bad.json"))
      << "{\"tensors\": [{\"name\": \"x\", \"dtype\": \"FP8\"}]}";
  r = RunCtl(absl::StrCat("plan --manifest ", testing::ProcessTempDir(), "/bad.json --world-size 2"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("FP8"));
}

// proto3 reads 0 as "unset", which the planner takes as 1: --pp 0 and --ep 0
// must be refused like --ep -2, not run silently as 1.
TEST(PlanCliTest, ZeroPipelineOrExpertDegreeExitsTwoNamingTheFlag) {
  const std::string ok = WriteManifest(testing::MoeManifest(1, 64, 32, 4, 100), "moe4.json");
  for (const char* command : {"plan", "compare"}) {
    for (const char* flag : {"pp", "ep", "tp"}) {
      for (const char* value : {"0", "-2"}) {
        CommandResult r = RunCtl(absl::StrCat(command, " --manifest ", ok, " --world-size 4 --", flag, " ", value));
        EXPECT_EQ(r.exit_code, 2) << command << " --" << flag << " " << value << ": " << r.out << r.err;
        EXPECT_THAT(r.err, HasSubstr(absl::StrCat("--", flag))) << command;
      }
    }
  }
}

// --gpus-per-node lands in the plan's topology (and so in its hash); a
// negative value exits 2 naming the flag.
TEST(PlanCliTest, GpusPerNode_RecordedInThePlanNegativeExitsTwo) {
  const std::string manifest = WriteManifest(testing::DenseManifest(2, 64, 96, 100), "dense-nodes.json");
  const std::string base = absl::StrCat("plan --manifest ", manifest, " --world-size 4 --output json");
  CommandResult with = RunCtl(base + " --gpus-per-node 2");
  ASSERT_EQ(with.exit_code, 0) << with.err;
  EXPECT_THAT(with.out, HasSubstr("\"gpus_per_node\": 2"));
  CommandResult without = RunCtl(base);
  ASSERT_EQ(without.exit_code, 0) << without.err;
  EXPECT_TRUE(absl::StrContains(without.out, "\"gpus_per_node\": 0"));
  // The same owners, another plan: the content hash tells them apart.
  const auto hash = [](const std::string& json) { return json.substr(json.find("sha256:"), 71); };
  EXPECT_NE(hash(with.out), hash(without.out));
  CommandResult bad = RunCtl(base + " --gpus-per-node -2");
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  EXPECT_THAT(bad.err, HasSubstr("--gpus-per-node: must be >= 0, got -2"));
}

// A manifest marked by `import-hf --tp` plans with --tp: the table says the
// mode and the TP bytes, the JSON has the TP groups and each owner's TP op.
TEST(PlanCliTest, TensorParallelPlanTableAndJson) {
  v1::ModelManifest m = testing::DenseManifest(2, 64, 96, 80);
  for (v1::TensorSpec& t : *m.mutable_tensors()) {
    if (t.shape_size() == 2) t.set_tp_split(v1::TP_COLUMN);
  }
  const std::string manifest = WriteManifest(m, "dense_tp.json");
  CommandResult table = RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 4 --tp 2 --policy balanced"));
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("  tp 2  policy BALANCED"));
  EXPECT_THAT(table.out, HasSubstr("tensor parallel  tp 2  TP_MUON_DISTRIBUTED  TP bytes per step"));
  CommandResult json =
      RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 4 --tp 2 --tp-muon duplicated --output json"));
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"TENSOR_PARALLEL\""));
  EXPECT_THAT(json.out, HasSubstr("\"TP_OP_ALL_GATHER\""));
  CommandResult sharded =
      RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 4 --tp 2 --tp-muon sharded --output json"));
  ASSERT_EQ(sharded.exit_code, 0) << sharded.err;
  EXPECT_THAT(sharded.out, HasSubstr("\"TP_MUON_SHARDED\""));
  CommandResult mode = RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 4 --tp 2 --tp-muon twice"));
  EXPECT_EQ(mode.exit_code, 2);
  EXPECT_THAT(mode.err, HasSubstr("--tp-muon: \"twice\" is not one of distributed, duplicated, sharded"));
  CommandResult three = RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 6 --tp 3"));
  EXPECT_EQ(three.exit_code, 2);
  EXPECT_THAT(three.err, HasSubstr("is not divisible by tp 3"));
}

// Fused weights (TensorSpec.ns_blocks): the table shows each kind of blocked
// tensor (blocks, shape, TP handling, count, first name) and the NS FLOPs
// blocked against whole; the JSON has every tensor's blocks and ns_local; a
// bad block spec exits 2 naming the tensor and the sizes.
TEST(PlanCliTest, FusedWeightsShowTheirBlocks) {
  v1::ModelManifest m;
  m.set_model("fused");
  for (int l = 0; l < 2; ++l) {
    for (const auto& [name, rows, blocks] :
         {std::tuple<const char*, int64_t, const char*>{"attention.query_key_value.weight", 96, "rows:8,8,8x4"},
          {"mlp.gate_up_proj.weight", 128, "rows:64,64"},
          {"mlp.down_proj.weight", 32, ""}}) {
      v1::TensorSpec* t = m.add_tensors();
      t->set_name(absl::StrCat("model.layers.", l, ".", name));
      t->add_shape(rows);
      t->add_shape(32);
      t->set_dtype(v1::BF16);
      t->set_tp_split(v1::TP_COLUMN);
      if (*blocks == 'r') {
        t->mutable_ns_blocks()->set_axis(v1::NsBlocks::ROWS);
        const bool per_head = rows == 96;
        for (int i = 0; i < (per_head ? 3 : 2); ++i) t->mutable_ns_blocks()->add_sizes(per_head ? 8 : 64);
        if (per_head) t->mutable_ns_blocks()->set_groups(4);
      }
    }
  }
  const std::string manifest = WriteManifest(m, "fused.json");
  CommandResult table = RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 4"));
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("per-block NS     4 tensors  NS per step "));
  EXPECT_THAT(table.out, HasSubstr("rows:8,8,8x4"));
  EXPECT_THAT(table.out, HasSubstr("[96, 32]"));
  EXPECT_THAT(table.out, HasSubstr("model.layers.0.attention.query_key_value.weight"));
  EXPECT_THAT(table.out, HasSubstr("rows:64,64"));
  // With tp 2: four heads, two per tp rank (local); gate | up, one each.
  CommandResult tp = RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 4 --tp 2"));
  ASSERT_EQ(tp.exit_code, 0) << tp.err;
  EXPECT_THAT(tp.out, ::testing::ContainsRegex("rows:8,8,8x4 +\\[96, 32\\] +local"));
  CommandResult json = RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 4 --tp 2 --output json"));
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"ns_blocks\""));
  EXPECT_THAT(json.out, HasSubstr("\"ns_local\": true"));
  EXPECT_THAT(json.out, HasSubstr("\"TP_OP_LOCAL\""));

  m.mutable_tensors(1)->mutable_ns_blocks()->set_sizes(1, 60);
  CommandResult bad = RunCtl(absl::StrCat("plan --manifest ", WriteManifest(m, "fused_bad.json"), " --world-size 4"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("tensor \"model.layers.0.mlp.gate_up_proj.weight\": ns_blocks rows:64,60: the sizes "
                                 "sum to 124 x 1 group, not the 128 rows (dimension 0)"));
}

// A huge flag value is quoted as a short, escaped prefix, not echoed whole.
TEST(PlanCliTest, HugeFlagValueGivesAShortErrorLine) {
  const std::string huge(100000, '7');
  CommandResult r = RunCtl(absl::StrCat("plan --manifest m.json --world-size ", huge, "x"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--world-size"));
  EXPECT_LT(r.err.substr(0, r.err.find('\n')).size(), 300u) << r.err.substr(0, 400);
  r = RunCtl(absl::StrCat("plan --", huge));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_LT(r.err.substr(0, r.err.find('\n')).size(), 300u) << r.err.substr(0, 400);
}

// A HuggingFace config.json passed as --manifest gets one line saying to run
// import-hf first, not protobuf's complaint about an unknown field.
TEST(PlanCliTest, HfConfigAsManifestSaysToRunImportHf) {
  const std::string config = "tests/importer/configs/Llama-3.1-8B.config.json";
  CommandResult r = RunCtl(absl::StrCat("plan --manifest ", config, " --world-size 8"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.substr(0, r.err.find('\n') + 1),
            absl::StrCat("error: ", config, " looks like a HuggingFace config.json (model_type \"llama\"), ",
                         "not a manifest: run `muonshardctl import-hf ", config, "` first [INVALID_ARGUMENT]\n"))
      << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;  // that one line only
}

// Memory fit (docs/planner.md, "Memory"): the table states every rank's
// training memory and headroom; a capacity that a rank overflows is exit 2
// naming the rank and its largest term, with the smallest world size that
// fits as a hint.
TEST(PlanCliTest, DeviceMemory_HeadroomTableRefusalAndMinWorldSizeHint) {
  const std::string manifest = "examples/manifests/tiny-moe.json";
  CommandResult ok = RunCtl(absl::StrCat("plan --manifest ", manifest,
                                         " --world-size 4 --ep 2 --device-memory 80GiB --sort headroom --top 1"));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("training memory  max "));
  EXPECT_THAT(ok.out, HasSubstr("capacity 81,920.0  headroom "));
  EXPECT_THAT(ok.out, HasSubstr("headroom_MiB"));
  EXPECT_THAT(ok.out, HasSubstr("1 of 4 ranks, by headroom"));

  CommandResult json =
      RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 4 --ep 2 --device-memory 80GiB --output json"));
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"device_memory_bytes\": [\n   \"85899345920\"\n  ]"));
  EXPECT_THAT(json.out, HasSubstr("\"ns_workspace_bytes\": \""));

  CommandResult refused = RunCtl(
      absl::StrCat("plan --manifest ", manifest, " --world-size 2 --ep 2 --policy balanced --device-memory 30MiB"));
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_THAT(refused.err, HasSubstr("error: topology.device_memory_bytes: rank "));
  EXPECT_THAT(refused.err, HasSubstr("(largest term: grad "));
  EXPECT_THAT(refused.err, HasSubstr("hint: needs at least 4 ranks at pp 1, ep 2, tp 1 (--world-size 4)"));
  CommandResult fits = RunCtl(
      absl::StrCat("plan --manifest ", manifest, " --world-size 4 --ep 2 --policy balanced --device-memory 30MiB"));
  EXPECT_EQ(fits.exit_code, 0) << fits.err;

  CommandResult never = RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 2 --device-memory 1MiB"));
  EXPECT_EQ(never.exit_code, 2);
  EXPECT_THAT(never.err, HasSubstr("hint: no world size fits: rank 0's model copy and gradient buffers alone"));

  CommandResult bad = RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 2 --device-memory 80GB,x"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("flag --device-memory: item 1: \"x\""));
  CommandResult count = RunCtl(absl::StrCat("plan --manifest ", manifest, " --world-size 4 --device-memory 1GiB,1GiB"));
  EXPECT_EQ(count.exit_code, 2);
  EXPECT_THAT(count.err, HasSubstr("give one value or world_size = 4 values, got 2"));
}

}  // namespace
}  // namespace muonshard
