// A save through FaultInjectionEnv (tests/testing/fault_injection_env.h),
// failed at every one of its file-system calls in turn: each write, fsync,
// rename, removal and listing of both ranks' files and of the commit, with
// each fault that call can meet (EIO, ENOSPC, a short write, a short read)
// and with a crash before it (a process death, a power loss dropping
// unsynced data, a power loss also undoing unsynced directory changes);
// saving a new step, and saving over a complete step `latest` does not name
// (which the commit first moves aside). Whatever fails, and wherever it
// crashes:
//  - the save reports an error naming the file or directory (or succeeds,
//    when only best-effort clean-up failed, and then it committed);
//  - `latest` names the previous step, or the new one only once it is
//    complete; the previous step stays whole and loads;
//  - no step-N directory is ever torn: each one opens, verifies and loads;
//  - a failed save leaves no *.tmp behind (unless removing it was what
//    failed), and the next save succeeds and leaves none anywhere.
// Plus the defects the env found: a first save into a new directory that a
// power loss took away after the commit, and a save over `latest`'s step
// that moved that step aside when `latest` could not be read.
#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "checkpoint/verify.h"
#include "checkpoint/writer.h"
#include "common/env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/testing/fault_injection_env.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::muonshard::testing::CrashMode;
using ::muonshard::testing::DescribeCall;
using ::muonshard::testing::FaultInjectionEnv;
using ::muonshard::testing::FaultKind;
using ::muonshard::testing::FaultRule;
using ::muonshard::testing::FsCall;
using ::muonshard::testing::FsOp;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kWorld = 2;

struct Fault {
  const char* name;
  FaultKind kind;
  int err;
  CrashMode crash;  // kCrash only
};

void PrintTo(const Fault& f, std::ostream* os) { *os << f.name; }

// What DIR holds besides steps 5 and 10 (`latest`) when step 20 is saved.
enum class Scenario {
  kNewStep,
  // A complete step-20 that `latest` does not name (a crash between the
  // rename and `latest`): the commit moves it aside first.
  kOverUncommittedStep,
};

void PrintTo(Scenario s, std::ostream* os) { *os << (s == Scenario::kNewStep ? "new step" : "over uncommitted step"); }

bool WritesOrRenames(FsOp op) {
  return op == FsOp::kNewWritableFile || op == FsOp::kAppend || op == FsOp::kSync || op == FsOp::kClose ||
         op == FsOp::kCreateDirs || op == FsOp::kRename || op == FsOp::kSyncDir;
}

// Whether `fault` is one `call` can meet.
bool Applies(const Fault& fault, const FsCall& call) {
  switch (fault.kind) {
    case FaultKind::kShortWrite:
      return call.op == FsOp::kAppend;
    case FaultKind::kShortRead:
      return call.op == FsOp::kRead || call.op == FsOp::kReadFile;
    case FaultKind::kError:
      return fault.err != ENOSPC || WritesOrRenames(call.op);
    case FaultKind::kCrash:
      return true;
  }
  return false;
}

// Every name under `dir` (recursively) containing ".tmp".
std::vector<std::string> TmpLeftovers(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (absl::StrContains(it->path().filename().string(), ".tmp")) out.push_back(it->path().string());
  }
  return out;
}

class SaveFaultFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(p_, testing::MakePlan(testing::SmallDenseManifest(), kWorld));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(state_, testing::SyntheticState(p_.plan));
    // Steps 5 and 10 committed, `latest` = step-10; copied for every case.
    MUONSHARD_ASSERT_OK(Save(Env::Default(), baseline_, 5));
    MUONSHARD_ASSERT_OK(Save(Env::Default(), baseline_, 10));
    std::error_code ec;
    fs::copy(baseline_, baseline_over_, fs::copy_options::recursive, ec);
    ASSERT_FALSE(ec) << ec.message();
    MUONSHARD_ASSERT_OK(Save(Env::Default(), baseline_over_, 20));
    MUONSHARD_ASSERT_OK(testing::WriteAll(absl::StrCat(baseline_over_, "/latest"), "step-10\n"));
  }

  // keep_last 2: a save of step 20 that commits removes step 5 last.
  absl::Status Save(Env* env, const std::string& dir, int64_t step, bool* renamed = nullptr) {
    WriteOptions write;
    write.env = env;
    CommitOptions commit;
    commit.env = env;
    commit.keep_last = 2;
    commit.on_stage = [renamed](absl::string_view stage) {
      if (renamed != nullptr && stage == "renamed") *renamed = true;
    };
    return SaveCheckpoint(dir, step, p_.plan, p_.request, testing::ShardLists(state_), testing::SyntheticScalars(step),
                          write, commit);
  }

  void ResetDir(Scenario scenario = Scenario::kNewStep) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    fs::copy(scenario == Scenario::kNewStep ? baseline_ : baseline_over_, dir_, fs::copy_options::recursive, ec);
    ASSERT_FALSE(ec) << ec.message();
  }

  // The calls of a save of step 20 that meets no fault.
  std::vector<FsCall> RecordSave(Scenario scenario) {
    ResetDir(scenario);
    FaultInjectionEnv env(Env::Default(), trash_);
    absl::Status s = Save(&env, dir_, 20);
    EXPECT_THAT(s, muonshard::testing::IsOk());
    return env.calls();
  }

  // Opens step `step` (the latest when unset), verifies every byte and loads
  // every rank, checking the values.
  absl::StatusOr<int64_t> LoadAndCheck(std::optional<int64_t> step = std::nullopt) {
    absl::StatusOr<Checkpoint> c = OpenCheckpoint(dir_, step);
    if (!c.ok()) return c.status();
    absl::Status s = VerifyCheckpoint(*c).status();
    for (int r = 0; r < kWorld && s.ok(); ++r) {
      absl::StatusOr<std::unique_ptr<testing::RankBuffers>> rank = testing::AllocateRank(p_.plan, r);
      if (!rank.ok()) return rank.status();
      s = LoadRankState(*c, (*rank)->shards).status();
      if (s.ok()) s = testing::CheckSynthetic(**rank);
    }
    if (!s.ok()) return s;
    return c->index.step();
  }

  // The loadable state every fault must leave; returns the step `latest`
  // names.
  int64_t ExpectNothingTorn() {
    absl::StatusOr<int64_t> latest = LatestStep(dir_);
    EXPECT_THAT(latest, testing::IsOkAndHolds(::testing::AnyOf(10, 20)));
    // The previous step is whole whatever happened to the new one, and so
    // is any step directory: never a torn step-N (`latest`'s included).
    EXPECT_TRUE(fs::is_directory(absl::StrCat(dir_, "/step-10")));
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      if (std::optional<int64_t> step = ParseStepDirName(e.path().filename().string())) {
        EXPECT_THAT(LoadAndCheck(*step), testing::IsOkAndHolds(*step)) << e.path();
      }
    }
    return latest.ok() ? *latest : -1;
  }

  // The job goes on: the next save succeeds and leaves no *.tmp anywhere.
  void ExpectNextSaveCleans(int64_t latest) {
    const int64_t next = latest == 20 ? 30 : 20;
    FaultInjectionEnv env(Env::Default(), trash_);
    MUONSHARD_ASSERT_OK(Save(&env, dir_, next));
    EXPECT_THAT(LoadAndCheck(), testing::IsOkAndHolds(next));
    EXPECT_THAT(TmpLeftovers(dir_), ::testing::IsEmpty());
  }

  void RunFailedSave(const Fault& fault, Scenario scenario, const FsCall& call, int index) {
    ResetDir(scenario);
    bool renamed = false;
    absl::Status saved;
    {
      FaultInjectionEnv env(Env::Default(), trash_);
      env.AddRule({fault.kind, fault.err, std::nullopt, "", index});
      saved = Save(&env, dir_, 20, &renamed);
      ASSERT_EQ(env.injected(), 1);
      // A crash in the clean-up after the commit: the save had succeeded.
      if (fault.kind == FaultKind::kCrash) {
        MUONSHARD_ASSERT_OK(env.SimulateCrash(fault.crash));
      }
    }
    if (fault.kind != FaultKind::kCrash) {
      if (saved.ok()) {
        ++tolerated_;  // best-effort clean-up failed: the step is committed
        EXPECT_THAT(LoadAndCheck(), testing::IsOkAndHolds(20));
      } else {
        EXPECT_THAT(saved.message(), HasSubstr(dir_)) << saved;
        // `latest` moves only after the step is renamed in and fsynced (a
        // step renamed in whose fsync failed is complete: checked below).
        if (!renamed) {
          EXPECT_THAT(testing::ReadAll(absl::StrCat(dir_, "/latest")), testing::IsOkAndHolds(std::string("step-10\n")));
        }
        // What could not be removed stays for the next save to remove; so
        // does the step-20 moved aside before a failed rename.
        const bool removal = call.op == FsOp::kRemoveTree || call.op == FsOp::kRemoveFile;
        if (!removal) {
          EXPECT_THAT(TmpLeftovers(dir_), ::testing::Each(::testing::EndsWith("/step-20.replaced.tmp")));
        }
      }
    }
    const int64_t latest = ExpectNothingTorn();
    if (saved.ok()) {
      EXPECT_EQ(latest, 20);  // committed, and durably so
    }
    if (latest == 20) {
      EXPECT_TRUE(saved.ok() || renamed || fault.kind == FaultKind::kCrash);
    }
    ExpectNextSaveCleans(latest);
  }

  testing::ScratchDir root_;
  const std::string baseline_ = root_.Sub("baseline");
  const std::string baseline_over_ = root_.Sub("baseline-over");
  const std::string dir_ = root_.Sub("ckpt");
  const std::string trash_ = root_.Sub("trash");
  testing::PlanAndRequest p_;
  std::vector<std::unique_ptr<testing::RankBuffers>> state_;
  int tolerated_ = 0;
};

class CheckpointSaveFaultTest : public SaveFaultFixture,
                                public ::testing::WithParamInterface<std::tuple<Fault, Scenario>> {};

TEST_P(CheckpointSaveFaultTest, EveryCallOfASave_PreviousStaysIntact_NothingTornOrLeaked) {
  const auto [fault, scenario] = GetParam();
  const std::vector<FsCall> calls = RecordSave(scenario);
  ASSERT_GT(calls.size(), 50u);
  int cases = 0;
  for (int i = 1; i <= static_cast<int>(calls.size()); ++i) {
    if (!Applies(fault, calls[i - 1])) continue;
    SCOPED_TRACE(absl::StrCat(fault.name, " at call ", i, " of ", calls.size(), ": ", DescribeCall(calls[i - 1])));
    RunFailedSave(fault, scenario, calls[i - 1], i);
    ++cases;
    if (HasFailure()) break;  // one report, not hundreds
  }
  EXPECT_GT(cases, 0);
  ::testing::Test::RecordProperty("cases", cases);
  ::testing::Test::RecordProperty("tolerated", tolerated_);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, CheckpointSaveFaultTest,
    ::testing::Combine(::testing::Values(Fault{"Eio", FaultKind::kError, EIO, CrashMode::kProcess},
                                         Fault{"Enospc", FaultKind::kError, ENOSPC, CrashMode::kProcess},
                                         Fault{"ShortWrite", FaultKind::kShortWrite, ENOSPC, CrashMode::kProcess},
                                         Fault{"ShortRead", FaultKind::kShortRead, 0, CrashMode::kProcess},
                                         Fault{"ProcessDeath", FaultKind::kCrash, 0, CrashMode::kProcess},
                                         Fault{"PowerLossData", FaultKind::kCrash, 0, CrashMode::kDropUnsyncedData},
                                         Fault{"PowerLossAll", FaultKind::kCrash, 0, CrashMode::kDropAllUnsynced}),
                       ::testing::Values(Scenario::kNewStep, Scenario::kOverUncommittedStep)),
    [](const ::testing::TestParamInfo<std::tuple<Fault, Scenario>>& info) {
      return absl::StrCat(std::get<0>(info.param).name,
                          std::get<1>(info.param) == Scenario::kNewStep ? "_NewStep" : "_OverUncommittedStep");
    });

class CheckpointCrashTest : public SaveFaultFixture {};

// A save that returned OK is durable: a crash right after loses nothing.
TEST_F(CheckpointCrashTest, CompletedSave_SurvivesEveryKindOfCrash) {
  for (CrashMode mode : {CrashMode::kProcess, CrashMode::kDropUnsyncedData, CrashMode::kDropAllUnsynced}) {
    SCOPED_TRACE(static_cast<int>(mode));
    ResetDir();
    FaultInjectionEnv env(Env::Default(), trash_);
    MUONSHARD_ASSERT_OK(Save(&env, dir_, 20));
    MUONSHARD_ASSERT_OK(env.SimulateCrash(mode));
    EXPECT_THAT(LoadAndCheck(), testing::IsOkAndHolds(20));
  }
}

// The first save into a directory that does not exist yet: the directory
// itself must be made durable (its parent fsynced), or a power loss after
// the commit takes the whole checkpoint away.
TEST_F(CheckpointCrashTest, FirstSaveIntoANewDirectory_SurvivesAPowerLoss) {
  const std::string dir = root_.Sub("new/ckpt");
  FaultInjectionEnv env(Env::Default(), trash_);
  MUONSHARD_ASSERT_OK(Save(&env, dir, 1));
  MUONSHARD_ASSERT_OK(env.SimulateCrash(CrashMode::kDropAllUnsynced));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint c, OpenCheckpoint(dir));
  EXPECT_EQ(c.index.step(), 1);
  MUONSHARD_EXPECT_OK(VerifyCheckpoint(c).status());
}

// Saving the step `latest` names again is refused; when `latest` cannot be
// read the save must not assume there is none and move that step aside: a
// crash before the new one is renamed in would leave `latest` naming nothing.
TEST_F(CheckpointCrashTest, UnreadableLatest_NeverMovesTheLatestStepAside) {
  ResetDir();
  FaultInjectionEnv env(Env::Default(), trash_);
  env.AddRule({FaultKind::kError, EIO, FsOp::kReadFile, "/latest", 1});
  env.AddRule({FaultKind::kCrash, 0, FsOp::kRename, "/step-10.tmp\" -> ", 1});  // the commit's rename
  EXPECT_THAT(Save(&env, dir_, 10), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(dir_ + "/latest")));
  MUONSHARD_ASSERT_OK(env.SimulateCrash(CrashMode::kProcess));
  EXPECT_THAT(LoadAndCheck(), testing::IsOkAndHolds(10));
  EXPECT_THAT(TmpLeftovers(dir_), ::testing::IsEmpty());
}

}  // namespace
}  // namespace muonshard::checkpoint
