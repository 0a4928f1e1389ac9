// A save that fails (a disk filling up: here RLIMIT_FSIZE, so every write
// past the limit fails with EFBIG as ENOSPC would) leaves no step-N.tmp
// behind to keep the disk full: the failing rank removes its own file, the
// committer (or the one process writing every rank) the whole directory,
// and rank 0 removes what earlier runs left before it writes. The previous
// checkpoint and `latest` stay intact throughout.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "checkpoint/reshard_plan.h"
#include "checkpoint/verify.h"
#include "checkpoint/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/planner.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::checkpoint {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Far below one rank file of the small model: the write fails mid-file.
constexpr int64_t kFullDiskBytes = 4096;

class CheckpointFailedSaveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(p_, testing::MakePlan(testing::SmallDenseManifest(), 2));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(state_, testing::SyntheticState(p_.plan));
    MUONSHARD_ASSERT_OK(Save(10));
  }

  absl::Status Save(int64_t step, const WriteOptions& write = {}) {
    return SaveCheckpoint(dir_.path(), step, p_.plan, p_.request, testing::ShardLists(state_),
                          testing::SyntheticScalars(step), write);
  }

  absl::Status WriteRank(int64_t step, int rank, const WriteOptions& write = {}) {
    RankFileTarget target{dir_.path(), step, p_.plan.content_hash(), rank, 2, ""};
    return WriteRankFile(target, state_[rank]->shards, testing::SyntheticScalars(step), write).status();
  }

  std::vector<std::string> Names(const std::string& dir) const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  // Step 10 is still `latest`, whole and loadable.
  void ExpectStep10Intact() {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string latest, testing::ReadAll(dir_.Sub("latest")));
    EXPECT_EQ(latest, "step-10\n");
    MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint c, OpenCheckpoint(dir_.path()));
    EXPECT_EQ(c.index.step(), 10);
    MUONSHARD_EXPECT_OK(VerifyCheckpoint(c).status());
    for (int r = 0; r < 2; ++r) {
      MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<testing::RankBuffers> rank, testing::AllocateRank(p_.plan, r));
      MUONSHARD_ASSERT_OK(LoadRankState(c, rank->shards).status());
      MUONSHARD_EXPECT_OK(testing::CheckSynthetic(*rank));
    }
  }

  testing::ScratchDir dir_;
  testing::PlanAndRequest p_;
  std::vector<std::unique_ptr<testing::RankBuffers>> state_;
};

// The case: a save dies of a full disk, and so does the next run's.
TEST_F(CheckpointFailedSaveTest, DiskFullTwice_LeavesNoTmpAndTheLastCheckpointIntact) {
  for (int64_t step : {20, 30}) {
    testing::ScopedFileSizeLimit full_disk(kFullDiskBytes);
    EXPECT_THAT(Save(step), StatusIs(absl::StatusCode::kResourceExhausted,
                                     HasSubstr(absl::StrCat("step-", step, ".tmp/rank-00000-of-00002.safetensors"))));
  }
  EXPECT_THAT(Names(dir_.path()), ElementsAre("latest", "step-10"));
  ExpectStep10Intact();
  // Space again: the next save succeeds.
  MUONSHARD_ASSERT_OK(Save(30));
  EXPECT_THAT(Names(dir_.path()), ElementsAre("latest", "step-10", "step-30"));
}

// Ranks are separate processes in a job: a rank whose write fails removes
// what it wrote and nothing else (other ranks of the save may be writing into
// step-N.tmp); the committer, finding the save incomplete, removes it all.
TEST_F(CheckpointFailedSaveTest, FailingRankRemovesOnlyItsOwnFile_TheCommitterTheRest) {
  MUONSHARD_ASSERT_OK(WriteRank(20, 1));
  {
    testing::ScopedFileSizeLimit full_disk(kFullDiskBytes);
    EXPECT_THAT(WriteRank(20, 0), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("rank-00000-of-00002")));
  }
  EXPECT_THAT(Names(dir_.Sub("step-20.tmp")),
              ElementsAre("rank-00001-of-00002.json", "rank-00001-of-00002.safetensors"));
  EXPECT_THAT(CommitCheckpoint(dir_.path(), 20, p_.plan, p_.request),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 0 has not written")));
  EXPECT_THAT(Names(dir_.path()), ElementsAre("latest", "step-10"));
  ExpectStep10Intact();
}

// A retry of a rank's write that fails at its very last byte: the rank's
// files of the earlier attempt (record included) go too, the other rank's
// stay.
TEST_F(CheckpointFailedSaveTest, FailingLastWrite_RemovesTheRanksFilesOnly) {
  MUONSHARD_ASSERT_OK(WriteRank(20, 1));
  const int64_t rank1_bytes =
      static_cast<int64_t>(std::filesystem::file_size(dir_.Sub("step-20.tmp/rank-00001-of-00002.safetensors")));
  MUONSHARD_ASSERT_OK(WriteRank(20, 0));
  {
    testing::ScopedFileSizeLimit full_disk(rank1_bytes - 1);
    EXPECT_THAT(WriteRank(20, 1), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("rank-00001-of-00002")));
  }
  EXPECT_THAT(Names(dir_.Sub("step-20.tmp")),
              ElementsAre("rank-00000-of-00002.json", "rank-00000-of-00002.safetensors"));
}

TEST_F(CheckpointFailedSaveTest, FailedCommit_RemovesTheTmpDirectory) {
  MUONSHARD_ASSERT_OK(WriteRank(20, 0));
  MUONSHARD_ASSERT_OK(WriteRank(20, 1));
  // The commit refuses a request of another plan after every rank wrote.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(testing::PlanAndRequest other, testing::MakePlan(testing::SmallDenseManifest(), 4));
  EXPECT_THAT(CommitCheckpoint(dir_.path(), 20, p_.plan, other.request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not the plan's")));
  EXPECT_THAT(Names(dir_.path()), ElementsAre("latest", "step-10"));
  // Saving over the step `latest` names.
  EXPECT_THAT(Save(10), StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("step-10")));
  EXPECT_THAT(Names(dir_.path()), ElementsAre("latest", "step-10"));
  ExpectStep10Intact();
}

// What earlier runs left (a save of another step that died, a step moved
// aside) is removed by rank 0 before it writes a byte, so a nearly full disk
// has that space back for this save; the save's own step-N.tmp, where other
// ranks are already writing, is left alone.
TEST_F(CheckpointFailedSaveTest, RankZero_RemovesEarlierRunsLeftoversBeforeWriting) {
  MUONSHARD_ASSERT_OK(WriteRank(5, 1));   // a save that died before rank 0 wrote
  MUONSHARD_ASSERT_OK(WriteRank(25, 1));  // a later step, abandoned by a resume from step 10
  std::filesystem::create_directory(dir_.Sub("step-7.replaced.tmp"));
  MUONSHARD_ASSERT_OK(testing::WriteAll(dir_.Sub("latest.tmp.12345"), "step-7\n"));
  MUONSHARD_ASSERT_OK(WriteRank(20, 1));  // this save: rank 1 came first
  EXPECT_TRUE(std::filesystem::exists(dir_.Sub("step-5.tmp")));
  bool checked = false;
  WriteOptions write;
  write.on_piece_written = [&](const WriteProgress& progress) {
    if (progress.piece != 1) return;
    checked = true;
    EXPECT_THAT(Names(dir_.path()), ElementsAre("latest", "step-10", "step-20.tmp"));
    EXPECT_TRUE(std::filesystem::exists(dir_.Sub("step-20.tmp/rank-00001-of-00002.safetensors")));
  };
  MUONSHARD_ASSERT_OK(WriteRank(20, 0, write));
  EXPECT_TRUE(checked);
  MUONSHARD_ASSERT_OK(CommitCheckpoint(dir_.path(), 20, p_.plan, p_.request));
  EXPECT_THAT(Names(dir_.path()), ElementsAre("latest", "step-10", "step-20"));
}

// One cleaner, rank 0 (the committer): W ranks would race to remove the
// same directories.
TEST_F(CheckpointFailedSaveTest, OtherRanks_LeaveEarlierRunsLeftoversToRankZero) {
  MUONSHARD_ASSERT_OK(WriteRank(5, 0));
  MUONSHARD_ASSERT_OK(WriteRank(20, 1));
  EXPECT_TRUE(std::filesystem::exists(dir_.Sub("step-5.tmp/rank-00000-of-00002.safetensors")));
}

TEST_F(CheckpointFailedSaveTest, AbandonSave_RemovesOnlyTheTmpDirectory) {
  MUONSHARD_ASSERT_OK(WriteRank(20, 1));
  MUONSHARD_ASSERT_OK(AbandonSave(dir_.path(), 20));
  MUONSHARD_ASSERT_OK(AbandonSave(dir_.path(), 20));  // nothing left: still OK
  MUONSHARD_ASSERT_OK(AbandonSave(dir_.path(), 10));  // a committed step is not a save in progress
  EXPECT_THAT(Names(dir_.path()), ElementsAre("latest", "step-10"));
  ExpectStep10Intact();
}

TEST_F(CheckpointFailedSaveTest, FailedReshard_LeavesNoTmpInTheOutputDirectory) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint source, OpenCheckpoint(dir_.path()));
  v1::Topology topology = source.request.topology();
  topology.set_world_size(3);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::PlanRequest request, RequestForTopology(source.request, topology, std::nullopt));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan to, planner::ComputePlan(request));
  const std::string out = dir_.Sub("resharded");
  {
    testing::ScopedFileSizeLimit full_disk(kFullDiskBytes);
    EXPECT_THAT(ReshardCheckpoint(source, to, request, out),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("resharded/step-10.tmp")));
  }
  EXPECT_TRUE(Names(out).empty());
  MUONSHARD_EXPECT_OK(ReshardCheckpoint(source, to, request, out).status());
  EXPECT_THAT(Names(out), ElementsAre("latest", "step-10"));
}

}  // namespace
}  // namespace muonshard::checkpoint
