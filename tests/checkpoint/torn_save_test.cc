// A save killed with SIGKILL mid-write (a real child process, stopped at a
// known point of the protocol before the kill, so nothing depends on timing)
// leaves the previous checkpoint loadable and the torn one rejected; the
// next save of that step succeeds and cleans up. One real process, to check
// the model against the kernel: save_faults_test crashes a save through
// FaultInjectionEnv before every one of its calls (process death and power
// loss) without a subprocess.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "checkpoint/verify.h"
#include "checkpoint/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::checkpoint {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

// Safety net only: the child signals as soon as it reaches its stop point.
constexpr int kReadyTimeoutMs = 120'000;

class TornSaveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(p_, testing::MakePlan(testing::SmallDenseManifest(), 4));
    auto state = testing::SyntheticState(p_.plan);
    ASSERT_TRUE(state.ok());
    MUONSHARD_ASSERT_OK(SaveCheckpoint(dir_.path(), 10, p_.plan, p_.request, testing::ShardLists(*state),
                                       testing::SyntheticScalars(10)));
  }

  // Runs ckpt_torn_writer for step 20 until it reports its stop point, then
  // kills it with SIGKILL.
  void RunWriterAndKill(const std::string& pause_flag) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const std::string binary = testing::BinaryPath("ckpt_torn_writer");
    std::vector<std::string> args = {binary,    "--dir", dir_.path(), "--step",     "20",
                                     "--world", "4",     pause_flag,  "--ready-fd", absl::StrCat(fds[1])};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      ::execv(binary.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    pollfd ready{fds[0], POLLIN, 0};
    const int polled = ::poll(&ready, 1, kReadyTimeoutMs);
    char byte = 0;
    const bool stopped = polled == 1 && ::read(fds[0], &byte, 1) == 1 && byte == 'p';
    ::close(fds[0]);
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(stopped) << "the writer never reached " << pause_flag << " (exit status " << status << ")";
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  }

  void ExpectStep10Intact() {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint c, OpenCheckpoint(dir_.path()));
    EXPECT_EQ(c.index.step(), 10);
    MUONSHARD_EXPECT_OK(VerifyCheckpoint(c).status());
    for (int r = 0; r < 4; ++r) {
      MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<testing::RankBuffers> rank, testing::AllocateRank(p_.plan, r));
      MUONSHARD_ASSERT_OK(LoadRankState(c, rank->shards).status());
      MUONSHARD_EXPECT_OK(testing::CheckSynthetic(*rank));
    }
  }

  testing::ScratchDir dir_;
  testing::PlanAndRequest p_;
};

// Killed after the third piece of rank 2's file: step-20.tmp is torn.
TEST_F(TornSaveTest, KilledMidWrite_PreviousStaysLoadableTornIsRejected) {
  RunWriterAndKill("--pause-after-piece=2:3");
  ExpectStep10Intact();
  EXPECT_TRUE(std::filesystem::exists(dir_.Sub("step-20.tmp")));
  EXPECT_THAT(OpenCheckpoint(dir_.path(), 20),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("step-20.tmp was never committed")));
  // The job restarts from step 10 and saves step 20 again.
  auto state = testing::SyntheticState(p_.plan);
  ASSERT_TRUE(state.ok());
  MUONSHARD_ASSERT_OK(
      SaveCheckpoint(dir_.path(), 20, p_.plan, p_.request, testing::ShardLists(*state), testing::SyntheticScalars(20)));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint c, OpenCheckpoint(dir_.path()));
  EXPECT_EQ(c.index.step(), 20);
  MUONSHARD_EXPECT_OK(VerifyCheckpoint(c).status());
  EXPECT_FALSE(std::filesystem::exists(dir_.Sub("step-20.tmp")));
}

}  // namespace
}  // namespace muonshard::checkpoint
