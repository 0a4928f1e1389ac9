// The real `muonshardctl ckpt inspect` and `muonshardctl reshard`: exit
// codes, output, and totals held against the planner's ComputeTransfers.
#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard_plan.h"
#include "checkpoint/verify.h"
#include "checkpoint/writer.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "importer/tp_split.h"
#include "plan/planner.h"
#include "plan/transfer.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::checkpoint {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using ::muonshard::testing::CommandResult;

class CkptCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(p_, testing::MakePlan(testing::SmallMoeManifest(), 4, 1, 2));
    auto state = testing::SyntheticState(p_.plan);
    ASSERT_TRUE(state.ok());
    ckpt_ = dir_.Sub("ckpt");
    MUONSHARD_ASSERT_OK(
        SaveCheckpoint(ckpt_, 30, p_.plan, p_.request, testing::ShardLists(*state), testing::SyntheticScalars(30)));
  }

  // `muonshardctl <args>` (shell text).
  CommandResult Ctl(const std::string& args) { return ::muonshard::testing::RunCtl(args); }

  testing::ScratchDir dir_;
  testing::PlanAndRequest p_;
  std::string ckpt_;
};

TEST_F(CkptCliTest, Inspect_SummaryPerRankBytesAndIntegrity) {
  CommandResult r = Ctl(absl::StrCat("ckpt inspect ", ckpt_));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("(step 30)"));
  EXPECT_THAT(r.out, HasSubstr(p_.plan.content_hash()));
  EXPECT_THAT(r.out, HasSubstr("world 4 (pp 1, ep 2)"));
  EXPECT_THAT(r.out, HasSubstr("integrity    OK"));
  EXPECT_THAT(r.out, HasSubstr("rank-00003-of-00004.safetensors"));
}

TEST_F(CkptCliTest, InspectJson_MatchesTheLibrarySummary) {
  CommandResult r = Ctl(absl::StrCat("ckpt inspect ", ckpt_, " --step 30 --output json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::CheckpointSummary printed;
  MUONSHARD_ASSERT_OK(FromJson(r.out, &printed, "stdout"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint c, OpenCheckpoint(ckpt_));
  v1::CheckpointSummary expected = SummarizeCheckpoint(c);
  expected.set_verified(true);
  EXPECT_EQ(SerializeDeterministic(printed), SerializeDeterministic(expected)) << r.out;
}

TEST_F(CkptCliTest, InspectCorrupt_ExitsOneNamingTheFile) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint c, OpenCheckpoint(ckpt_));
  const std::string file = c.step_dir + "/" + c.index.files(2).name();
  MUONSHARD_ASSERT_OK(testing::FlipByte(file, c.index.files(2).size_bytes() - 3));
  CommandResult r = Ctl(absl::StrCat("ckpt inspect ", ckpt_));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("rank-00002-of-00004.safetensors"));
  EXPECT_THAT(r.err, HasSubstr("DATA_LOSS"));
}

// One digit of an optimizer scalar in index.json: the index stays valid,
// only its checksum tells. inspect and reshard refuse it as damage.
TEST_F(CkptCliTest, InspectEditedIndexScalar_ExitsOneNamingTheIndex) {
  const std::string index_path = ckpt_ + "/step-30/index.json";
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string index, testing::ReadAll(index_path));
  const std::string key = "\"beta1_pow\":0.";
  const size_t at = index.find(key);
  ASSERT_NE(at, std::string::npos) << index;
  index[at + key.size()] = index[at + key.size()] == '9' ? '8' : '9';
  MUONSHARD_ASSERT_OK(testing::WriteAll(index_path, index));
  CommandResult r = Ctl(absl::StrCat("ckpt inspect ", ckpt_));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.err, HasSubstr("step-30/index.json"));
  EXPECT_THAT(r.err, HasSubstr("DATA_LOSS"));
  EXPECT_THAT(r.out, Not(HasSubstr("integrity")));
  CommandResult reshard = Ctl(absl::StrCat("reshard ", ckpt_, " --world-size 2 --dry-run"));
  EXPECT_EQ(reshard.exit_code, 1);
  EXPECT_THAT(reshard.err, HasSubstr("step-30/index.json"));
}

TEST_F(CkptCliTest, BadInput_ExitsTwo) {
  EXPECT_EQ(Ctl(absl::StrCat("ckpt inspect ", dir_.Sub("missing"))).exit_code, 2);
  EXPECT_EQ(Ctl(absl::StrCat("ckpt inspect ", ckpt_, " --step 31")).exit_code, 2);
  EXPECT_EQ(Ctl(absl::StrCat("ckpt inspect ", ckpt_, " --bogus")).exit_code, 2);
  EXPECT_EQ(Ctl(absl::StrCat("ckpt inspect ", ckpt_, " --output yaml")).exit_code, 2);
  EXPECT_EQ(Ctl("ckpt inspect").exit_code, 2);
  EXPECT_EQ(Ctl("ckpt frobnicate").exit_code, 2);
  EXPECT_EQ(Ctl("reshard --world-size 2 --dry-run").exit_code, 2);
  EXPECT_EQ(Ctl(absl::StrCat("reshard ", ckpt_, " --dry-run")).exit_code, 2);
  EXPECT_EQ(Ctl(absl::StrCat("reshard ", ckpt_, " --world-size 2")).exit_code, 2) << "no --out";
  EXPECT_EQ(Ctl(absl::StrCat("reshard ", ckpt_, " --world-size 3 --dry-run")).exit_code, 2)
      << "world 3 with the checkpoint's ep 2";
  EXPECT_EQ(Ctl(absl::StrCat("reshard ", dir_.Sub("missing"), " --world-size 2 --dry-run")).exit_code, 2);
  EXPECT_EQ(Ctl(absl::StrCat("reshard ", ckpt_, " --world-size 2 --out ", ckpt_)).exit_code, 2);
}

// DIR as the first argument and --world-size, as for `ckpt inspect DIR`;
// the 0.1 spellings (--checkpoint DIR, --to-world-size) work this release
// with a one-line warning each, and are left out of --help.
TEST_F(CkptCliTest, ReshardOldSpellings_WorkWithADeprecationWarning) {
  CommandResult now = Ctl(absl::StrCat("reshard ", ckpt_, " --world-size 2 --ep 1 --dry-run --output json"));
  ASSERT_EQ(now.exit_code, 0) << now.err;
  EXPECT_THAT(now.err, Not(HasSubstr("deprecated")));
  CommandResult old =
      Ctl(absl::StrCat("reshard --checkpoint ", ckpt_, " --to-world-size 2 --ep 1 --dry-run --output json"));
  ASSERT_EQ(old.exit_code, 0) << old.err;
  EXPECT_EQ(old.out, now.out);
  EXPECT_THAT(old.err, HasSubstr("warning: flag --checkpoint is deprecated: pass the checkpoint directory as the "
                                 "first argument\n"));
  EXPECT_THAT(old.err, HasSubstr("warning: flag --to-world-size is deprecated: use --world-size\n"));
  CommandResult both = Ctl(absl::StrCat("reshard ", ckpt_, " --checkpoint ", ckpt_, " --world-size 2 --dry-run"));
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_THAT(both.err, HasSubstr("reshard takes one checkpoint DIR"));
  CommandResult none = Ctl("reshard --world-size 2 --dry-run");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.err,
              HasSubstr("error: reshard needs the checkpoint DIR to read\nrun 'muonshardctl reshard --help'"));
  CommandResult help = Ctl("reshard --help");
  ASSERT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("usage: muonshardctl reshard DIR --world-size M"));
  EXPECT_THAT(help.out, HasSubstr("  --world-size VALUE\n      world size of the new layout (required)\n"));
  EXPECT_THAT(help.out, Not(HasSubstr("  --to-world-size")));
  EXPECT_THAT(help.out, Not(HasSubstr("  --checkpoint")));
  CommandResult missing = Ctl(absl::StrCat("reshard ", ckpt_, " --dry-run"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("error: missing required flag --world-size\n"));
}

TEST_F(CkptCliTest, ReshardDryRunJson_TransfersAreThePlannersAndNothingIsWritten) {
  CommandResult r = Ctl(absl::StrCat("reshard ", ckpt_, " --world-size 3 --ep 1 --dry-run --output json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::ReshardSummary printed;
  MUONSHARD_ASSERT_OK(FromJson(r.out, &printed, "stdout"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(testing::PlanAndRequest to, testing::MakePlan(testing::SmallMoeManifest(), 3));
  EXPECT_EQ(printed.to_plan_hash(), to.plan.content_hash());
  MUONSHARD_ASSERT_OK_AND_ASSIGN(planner::TransferSummary want, planner::ComputeTransfers(p_.plan, to.plan));
  EXPECT_EQ(printed.state_bytes(), want.state_bytes);
  EXPECT_EQ(printed.moved_bytes(), want.moved_bytes);
  ASSERT_EQ(printed.transfers_size(), static_cast<int>(want.transfers.size()));
  for (int i = 0; i < printed.transfers_size(); ++i) {
    EXPECT_EQ(printed.transfers(i).from(), want.transfers[i].from);
    EXPECT_EQ(printed.transfers(i).to(), want.transfers[i].to);
    EXPECT_EQ(printed.transfers(i).bytes(), want.transfers[i].bytes);
  }
  MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint c, OpenCheckpoint(ckpt_));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ReadTraffic traffic, ComputeReadTraffic(c.index, to.plan));
  EXPECT_EQ(printed.bytes_read(), traffic.verified_bytes);
  EXPECT_TRUE(printed.out_step_dir().empty());
  EXPECT_EQ(SerializeDeterministic(printed.to_topology()), SerializeDeterministic(to.plan.topology()));
}

TEST_F(CkptCliTest, ReshardDryRunTable_GridAndTotals) {
  CommandResult r = Ctl(absl::StrCat("reshard ", ckpt_, " --world-size 8 --policy balanced --dry-run"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(testing::PlanAndRequest to,
                                 testing::MakePlan(testing::SmallMoeManifest(), 8, 1, 2, v1::BALANCED));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(planner::TransferSummary want, planner::ComputeTransfers(p_.plan, to.plan));
  EXPECT_THAT(r.out, HasSubstr("world 8 (pp 1, ep 2), policy BALANCED"));
  EXPECT_THAT(r.out, HasSubstr("old\\new"));
  EXPECT_THAT(r.out, HasSubstr("total read"));
  std::string grouped;
  const std::string digits = absl::StrCat(want.state_bytes);
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("state        ", grouped, " bytes")));
  EXPECT_THAT(r.out, Not(HasSubstr("written")));
}

TEST_F(CkptCliTest, ReshardWrite_ThenInspectAndLoadUnderTheNewPlan) {
  const std::string out = dir_.Sub("w2");
  CommandResult r = Ctl(absl::StrCat("reshard ", ckpt_, " --world-size 2 --ep 1 --out ", out, " --key-style paddle"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("written      ", out, "/step-30")));
  EXPECT_THAT(r.err, HasSubstr("rank 2/2 written"));
  CommandResult inspect = Ctl(absl::StrCat("ckpt inspect ", out));
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_THAT(inspect.out, HasSubstr("world 2 (pp 1, ep 1)"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint c, OpenCheckpoint(out));
  EXPECT_EQ(c.index.key_style(), "paddle");
  MUONSHARD_ASSERT_OK_AND_ASSIGN(testing::PlanAndRequest to, testing::MakePlan(testing::SmallMoeManifest(), 2));
  EXPECT_EQ(c.index.plan_hash(), to.plan.content_hash());
  for (int rank = 0; rank < 2; ++rank) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<testing::RankBuffers> buffers, testing::AllocateRank(to.plan, rank));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(LoadResult loaded, LoadRankState(c, buffers->shards));
    MUONSHARD_EXPECT_OK(testing::CheckSynthetic(*buffers));
    EXPECT_EQ(loaded.scalars.beta1_pow, testing::SyntheticScalars(30).beta1_pow);
  }
}

// Saved with tp 2 (TP shards and replicated tensors), resharded by the CLI
// to tp 1 and to tp 4: every rank of the new plan loads the saved values.
TEST_F(CkptCliTest, ReshardAcrossTp_EveryRankOfTheNewPlanLoadsTheSavedState) {
  v1::ModelManifest manifest = muonshard::testing::DenseManifest(2, 64, 96, 128);
  importer::TpSplitOptions split;
  split.tp = 4;
  MUONSHARD_ASSERT_OK(importer::MarkTensorParallel(split, &manifest));
  auto plan_for = [&](int world, int tp) -> absl::StatusOr<testing::PlanAndRequest> {
    v1::PlanRequest request = muonshard::testing::MakeRequest(manifest, world);
    request.mutable_topology()->set_tp(tp);
    MUONSHARD_ASSIGN_OR_RETURN(request, planner::CanonicalizeRequest(request));
    MUONSHARD_ASSIGN_OR_RETURN(v1::Plan plan, planner::ComputePlan(request));
    return testing::PlanAndRequest{request, plan};
  };
  MUONSHARD_ASSERT_OK_AND_ASSIGN(testing::PlanAndRequest from, plan_for(4, 2));
  auto state = testing::SyntheticState(from.plan);
  ASSERT_TRUE(state.ok());
  const std::string saved = dir_.Sub("tp2");
  MUONSHARD_ASSERT_OK(
      SaveCheckpoint(saved, 7, from.plan, from.request, testing::ShardLists(*state), testing::SyntheticScalars(7)));
  CommandResult inspect = Ctl(absl::StrCat("ckpt inspect ", saved));
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_EQ(Ctl(absl::StrCat("reshard ", saved, " --world-size 4 --tp 1 --dry-run")).exit_code, 0);
  for (const auto& [world, tp] : {std::pair<int, int>{4, 1}, std::pair<int, int>{8, 4}}) {
    SCOPED_TRACE(absl::StrCat("world ", world, " tp ", tp));
    const std::string out = dir_.Sub(absl::StrCat("w", world, "tp", tp));
    CommandResult r = Ctl(absl::StrCat("reshard ", saved, " --world-size ", world, " --tp ", tp, " --out ", out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint c, OpenCheckpoint(out));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(testing::PlanAndRequest to, plan_for(world, tp));
    EXPECT_EQ(c.index.plan_hash(), to.plan.content_hash());
    // The dry run's matrix: every byte of the new plan's state, from some old rank.
    MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint source, OpenCheckpoint(saved));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::ReshardSummary summary, SummarizeReshard(source.index, source.plan, to.plan));
    int64_t state = 0, transferred = 0;
    for (int rank = 0; rank < world; ++rank) {
      MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<ShardSpec> specs, ExpectedShards(to.plan, rank));
      state += TotalNumel(specs) * 4;
    }
    for (const v1::RankTransferBytes& t : summary.transfers()) transferred += t.bytes();
    EXPECT_EQ(summary.state_bytes(), state);
    EXPECT_EQ(transferred, state);
    EXPECT_LE(summary.moved_bytes(), state);
    for (int rank = 0; rank < world; ++rank) {
      MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<testing::RankBuffers> buffers,
                                     testing::AllocateRank(to.plan, rank));
      MUONSHARD_ASSERT_OK(LoadRankState(c, buffers->shards).status());
      MUONSHARD_EXPECT_OK(testing::CheckSynthetic(*buffers)) << "rank " << rank;
    }
  }
  EXPECT_EQ(Ctl(absl::StrCat("reshard ", saved, " --world-size 4 --tp 3 --dry-run")).exit_code, 2);
}

}  // namespace
}  // namespace muonshard::checkpoint
