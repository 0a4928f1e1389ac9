// `muonshardctl simulate` as users run it: the real binary, exit codes 0/2,
// JSON that parses, an SVG with one band per rank, messages naming the bad
// input.
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/sim/xml_check.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace muonshard {
namespace {

using ::testing::HasSubstr;

using testing::CommandResult;
using testing::RunCtl;

std::string Dir() { return testing::ProcessTempDir(); }

std::string Write(const std::string& name, const std::string& text) {
  std::string path = absl::StrCat(Dir(), "/", name);
  std::ofstream(path) << text;
  return path;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string Manifest() {
  static const std::string path = Write("sim_moe.json", *ToJson(testing::MoeManifest(2, 64, 32, 4, 500)));
  return path;
}

std::string PlanArgs() { return absl::StrCat("--manifest ", Manifest(), " --world-size 4 --ep 2 --policy balanced"); }

TEST(SimulateCliTest, TablePrintsBothSchedules) {
  CommandResult r = RunCtl(absl::StrCat("simulate --cluster h200 ", PlanArgs()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("plan of model moe: world 4 (pp 1, ep 2, tp 1), policy BALANCED"));
  EXPECT_THAT(r.out, HasSubstr("muonshard sequential"));
  EXPECT_THAT(r.out, HasSubstr("muonshard pipelined"));
}

TEST(SimulateCliTest, JsonParsesAndAPlanFileGivesTheSameStep) {
  CommandResult direct =
      RunCtl(absl::StrCat("simulate --cluster h200 --schedule pipelined --format json ", PlanArgs()));
  ASSERT_EQ(direct.exit_code, 0) << direct.err;
  google::protobuf::Struct json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(direct.out, &json).ok()) << direct.out;
  const auto& schedules = json.fields().at("schedules").list_value();
  ASSERT_EQ(schedules.values_size(), 1);
  const auto& s = schedules.values(0).struct_value().fields();
  EXPECT_EQ(s.at("schedule").string_value(), "muonshard pipelined");
  EXPECT_EQ(s.at("ranks").list_value().values_size(), 4);
  EXPECT_GT(s.at("step_seconds").number_value(), 0);

  // A plan made with --manifest is made for the cluster's nodes (8 per H200
  // node): the same plan from a file gives the same step.
  CommandResult plan = RunCtl(absl::StrCat("plan --output json --gpus-per-node 8 ", PlanArgs()));
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const std::string plan_file = Write("sim_plan.json", plan.out);
  CommandResult from_file =
      RunCtl(absl::StrCat("simulate --cluster h200 --schedule pipelined --output json --plan ", plan_file));
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  EXPECT_TRUE(from_file.out == direct.out) << "the step differs between --manifest and --plan";
}

// A plan made for other nodes than the cluster's is refused, naming both.
TEST(SimulateCliTest, PlanForOtherNodesThanTheClusters_ExitTwoNamingBoth) {
  CommandResult plan = RunCtl(absl::StrCat("plan --output json --gpus-per-node 2 ", PlanArgs()));
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const std::string plan_file = Write("sim_plan_nodes2.json", plan.out);
  CommandResult r = RunCtl(absl::StrCat("simulate --cluster h200 --plan ", plan_file));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("the plan's topology.gpus_per_node is 2, the cluster's gpus_per_node 8"));
  CommandResult same = RunCtl(absl::StrCat("simulate --cluster h200 --gpus-per-node 2 --plan ", plan_file));
  EXPECT_EQ(same.exit_code, 0) << same.err;
}

double InterNodeBytes(const std::string& json_text) {
  google::protobuf::Struct json;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json_text, &json).ok()) << json_text;
  double bytes = 0;
  const auto& schedule = json.fields().at("schedules").list_value().values(0).struct_value().fields();
  for (const auto& rank : schedule.at("ranks").list_value().values()) {
    bytes += rank.struct_value().fields().at("wire_bytes").struct_value().fields().at("inter_node").number_value();
  }
  return bytes;
}

// --collectives flat runs the plan's owners and buckets as rings over each
// group's ranks, as the workers' --collectives flat: more bytes between the
// nodes than inside each node first, on the same plan.
TEST(SimulateCliTest, CollectivesFlatRunsThePlanAsRings) {
  CommandResult plan = RunCtl(absl::StrCat("plan --output json --gpus-per-node 2 ", PlanArgs()));
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const std::string plan_file = Write("sim_plan_flat.json", plan.out);
  const std::string args =
      absl::StrCat("simulate --cluster cpu --gpus-per-node 2 --schedule sequential --format json --plan ", plan_file);
  CommandResult grid = RunCtl(args);
  ASSERT_EQ(grid.exit_code, 0) << grid.err;
  CommandResult flat = RunCtl(absl::StrCat(args, " --collectives flat"));
  ASSERT_EQ(flat.exit_code, 0) << flat.err;
  CommandResult same = RunCtl(absl::StrCat(args, " --collectives auto"));
  EXPECT_EQ(same.out, grid.out);
  EXPECT_GT(InterNodeBytes(flat.out), 1.1 * InterNodeBytes(grid.out));

  CommandResult bad = RunCtl(absl::StrCat(args, " --collectives tree"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("flag --collectives: \"tree\" is not one of auto, flat"));
  bad = RunCtl(absl::StrCat("simulate --cluster cpu --collectives flat --strategies all ", PlanArgs()));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("flag --collectives flat: not with --strategies"));
}

// {schedule: step seconds} of `simulate --format json`.
std::map<std::string, double> StepSeconds(const std::string& json_text) {
  google::protobuf::Struct json;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json_text, &json).ok()) << json_text;
  std::map<std::string, double> out;
  for (const auto& s : json.fields().at("schedules").list_value().values()) {
    out[s.struct_value().fields().at("schedule").string_value()] =
        s.struct_value().fields().at("step_seconds").number_value();
  }
  return out;
}

// NOTE [Muon batches] (plan/ns_batches.h): --muon-batch-mib is the workers'.
// Batched across buckets, a rank's expert matrices go into fewer, larger
// Newton-Schulz calls, which a GPU runs faster (NOTE [Batched NS cost]); the
// pipelined step, bucket by bucket, does not change.
TEST(SimulateCliTest, MuonBatchMibBatchesTheSequentialStepAcrossBuckets) {
  const std::string manifest = Write("sim_moe_buckets.json", *ToJson(testing::MoeManifest(4, 128, 256, 8, 80)));
  const std::string args =
      absl::StrCat("simulate --cluster h200 --format json --manifest ", manifest, " --world-size 1 --comm-buffer-mb 1");
  CommandResult batched = RunCtl(args);
  ASSERT_EQ(batched.exit_code, 0) << batched.err;
  CommandResult by_bucket = RunCtl(absl::StrCat(args, " --muon-batch-mib 0"));
  ASSERT_EQ(by_bucket.exit_code, 0) << by_bucket.err;
  const std::map<std::string, double> a = StepSeconds(batched.out), b = StepSeconds(by_bucket.out);
  EXPECT_LT(a.at("muonshard sequential"), 0.95 * b.at("muonshard sequential"));
  EXPECT_EQ(a.at("muonshard pipelined"), b.at("muonshard pipelined"));
  CommandResult bad = RunCtl(absl::StrCat(args, " --muon-batch-mib -1"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("flag --muon-batch-mib: -1 is not >= 0"));
}

TEST(SimulateCliTest, SvgHasOneBandPerRank) {
  const std::string svg = absl::StrCat(Dir(), "/step.svg");
  CommandResult r = RunCtl(
      absl::StrCat("simulate --cluster cpu --gpus-per-node 2 --schedule sequential --svg ", svg, " ", PlanArgs()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string text = Read(svg);
  EXPECT_EQ(testing::CheckWellFormedXml(text), "");
  EXPECT_EQ(testing::CountOf(text, "<g class=\"rank\""), 4);
  EXPECT_THAT(text, HasSubstr("rank 3 (node 1)"));
}

TEST(SimulateCliTest, BadInputExitsTwoNamingIt) {
  CommandResult r = RunCtl(absl::StrCat("simulate --cluster h300 ", PlanArgs()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("flag --cluster: \"h300\" is neither a preset (h100, h200, gb200, gb300, cpu)"));

  const std::string file = Write("bad_cluster.json", R"({"preset": "h100", "inter_node": {"bandwidth_gb_s": -5}})");
  r = RunCtl(absl::StrCat("simulate --cluster ", file, " ", PlanArgs()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("cluster.inter_node.bandwidth_gb_s: must be > 0, got -5"));

  r = RunCtl(absl::StrCat("simulate --cluster h200 --nodes 1 --gpus-per-node 2 ", PlanArgs()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("the plan's world size 4 does not fit 1 node(s) x 2 GPUs per node"));

  r = RunCtl(absl::StrCat("simulate --cluster h200 --intra-bandwidth 0 ", PlanArgs()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("cluster.intra_node.bandwidth_gb_s: must be > 0, got 0"));

  r = RunCtl(absl::StrCat("simulate --cluster h200 --schedule eager ", PlanArgs()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("flag --schedule: \"eager\""));

  r = RunCtl("simulate --cluster h200");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("give either --plan PLAN.json or --manifest M.json --world-size W"));

  r = RunCtl(absl::StrCat("simulate ", PlanArgs()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--cluster"));
}

TEST(SimulateCliTest, StrategiesPrintsEveryStrategySideBySide) {
  CommandResult r = RunCtl(absl::StrCat("simulate --cluster h200 --strategies all ", PlanArgs()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name :
       {"muonshard-seed", "muonshard-balanced", "paddle-seed", "megatron-duplicated", "megatron-distributed",
        "megatron-blockwise", "megatron-layer-sharded", "kj-round-robin", "dion-all-to-all", "zero1-muon"}) {
    EXPECT_THAT(r.out, HasSubstr(name));
  }
  EXPECT_THAT(r.out, HasSubstr("best muonshard"));
  EXPECT_THAT(r.out, HasSubstr("(goal <= 0.80)"));

  r = RunCtl(absl::StrCat("simulate --cluster h200 --format json --schedule pipelined ",
                          "--strategies muonshard-balanced,zero1-muon,kj-round-robin ", PlanArgs()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  google::protobuf::Struct json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &json).ok()) << r.out;
  const auto& rows = json.fields().at("strategies").list_value();
  ASSERT_EQ(rows.values_size(), 3);
  EXPECT_EQ(rows.values(0).struct_value().fields().at("schedule").string_value(), "pipelined");
  EXPECT_EQ(rows.values(1).struct_value().fields().at("strategy").string_value(), "zero1-muon");
  const double ours = json.fields().at("best_muonshard").struct_value().fields().at("step_seconds").number_value();
  const double peer = json.fields().at("best_peer").struct_value().fields().at("step_seconds").number_value();
  EXPECT_NEAR(json.fields().at("ratio").number_value(), ours / peer, 1e-5);
}

double StepOf(const google::protobuf::Struct& json, const std::string& strategy) {
  for (const auto& row : json.fields().at("strategies").list_value().values()) {
    const auto& f = row.struct_value().fields();
    if (f.at("strategy").string_value() == strategy) return f.at("step_seconds").number_value();
  }
  ADD_FAILURE() << "no row " << strategy;
  return 0;
}

// Paddle has no sharded Newton-Schulz: under --tp-muon sharded its row is
// the seed plan of the distributed mode, which muonshard's own seed row
// (sharded) no longer is.
TEST(SimulateCliTest, PaddleGathersTpShardsWhateverTheTpMode) {
  v1::ModelManifest m = testing::DenseManifest(2, 64, 96, 80);
  for (v1::TensorSpec& t : *m.mutable_tensors()) {
    if (t.shape_size() == 2) t.set_tp_split(v1::TP_COLUMN);
  }
  const std::string args = absl::StrCat("simulate --cluster h200 --format json --schedule sequential ",
                                        "--strategies muonshard-seed,paddle-seed --manifest ",
                                        Write("sim_tp.json", *ToJson(m)), " --world-size 4 --tp 2 --tp-muon ");
  std::map<std::string, google::protobuf::Struct> json;
  for (const char* mode : {"distributed", "sharded"}) {
    CommandResult r = RunCtl(args + mode);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &json[mode]).ok()) << r.out;
  }
  EXPECT_EQ(StepOf(json["distributed"], "paddle-seed"), StepOf(json["distributed"], "muonshard-seed"));
  EXPECT_EQ(StepOf(json["sharded"], "paddle-seed"), StepOf(json["distributed"], "paddle-seed"));
  EXPECT_NE(StepOf(json["sharded"], "muonshard-seed"), StepOf(json["distributed"], "muonshard-seed"));
}

// Paddle reduces every Muon bucket to its owner, so --muon-reduce
// scatter-rounds changes muonshard's step and not Paddle's.
TEST(SimulateCliTest, PaddleReducesToOwnersWhateverTheMuonReduce) {
  const std::string args =
      absl::StrCat("simulate --cluster h200 --gpus-per-node 1 --format json --schedule sequential ",
                   "--strategies muonshard-seed,paddle-seed --manifest ",
                   Write("sim_rounds.json", *ToJson(testing::DenseManifest(4, 256, 512, 1000))),
                   " --world-size 4 --comm-buffer-mb 1 --muon-reduce ");
  std::map<std::string, google::protobuf::Struct> json;
  for (const char* mode : {"owner", "scatter-rounds"}) {
    CommandResult r = RunCtl(args + mode);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &json[mode]).ok()) << r.out;
  }
  EXPECT_EQ(StepOf(json["scatter-rounds"], "paddle-seed"), StepOf(json["owner"], "paddle-seed"));
  EXPECT_LT(StepOf(json["scatter-rounds"], "muonshard-seed"), StepOf(json["owner"], "muonshard-seed"));

  CommandResult r = RunCtl(absl::StrCat("plan --manifest ", Manifest(), " --world-size 4 --ep 2 --comm-buffer-mb 1 ",
                                        "--muon-reduce scatter-rounds"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("muon reduce +scatter rounds: [0-9]+ shared Muon buckets in [0-9]+ "
                                              "reduce-scatters, [0-9]+ to their owners"));

  r = RunCtl(absl::StrCat("simulate --cluster h200 ", PlanArgs(), " --muon-reduce scatter"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("flag --muon-reduce: \"scatter\" is not one of owner, scatter-rounds"));
  r = RunCtl(absl::StrCat("plan --manifest ", Manifest(), " --world-size 4 --tp 2 --muon-reduce scatter-rounds"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("flag --muon-reduce: scatter-rounds needs --tp 1, got --tp 2"));
}

TEST(SimulateCliTest, BadStrategiesExitTwoNamingThem) {
  CommandResult r = RunCtl(absl::StrCat("simulate --cluster h200 --strategies foo,zero1-muon,megatron ", PlanArgs()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("flag --strategies: unknown strategy \"foo\", \"megatron\" (known: all, "));

  r = RunCtl(absl::StrCat("simulate --cluster h200 --strategies , ", PlanArgs()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("(none given)"));

  CommandResult plan = RunCtl(absl::StrCat("plan --output json ", PlanArgs()));
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const std::string plan_file = Write("sim_strategies_plan.json", plan.out);
  r = RunCtl(absl::StrCat("simulate --cluster h200 --strategies paddle-seed --plan ", plan_file));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("the plan file's policy is BALANCED; a SEED plan needs --manifest"));
  r = RunCtl(
      absl::StrCat("simulate --cluster h200 --strategies muonshard-balanced,dion-all-to-all --plan ", plan_file));
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace muonshard
