// FaultInjectionEnv (tests/testing/fault_injection_env.h): rules fail the
// calls they name as the POSIX Env would report them, and SimulateCrash
// leaves exactly what was made durable. Then the env checks WriteFileAtomic
// and CreateDirsDurably at every step.
#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_injection_env.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace muonshard::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// gmock's Optional() for a StatusOr.
MATCHER_P(IsOkAndHolds, value_matcher, "") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

class FaultInjectionEnvTest : public ::testing::Test {
 protected:
  FaultInjectionEnvTest() : env_(Env::Default(), root_.Join("trash")) {
    Env::Default()->CreateDirs(dir_).IgnoreError();
  }

  std::string Path(absl::string_view name) const { return absl::StrCat(dir_, "/", name); }

  absl::Status Write(const std::string& path, absl::string_view data, bool sync) {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = env_.NewWritableFile(path);
    if (!file.ok()) return file.status();
    absl::Status s = (*file)->Append(data);
    if (s.ok() && sync) s = (*file)->Sync();
    if (s.ok()) s = (*file)->Close();
    return s;
  }

  absl::StatusOr<std::string> Read(const std::string& path) { return Env::Default()->ReadFileToString(path); }
  bool Exists(const std::string& path) { return *Env::Default()->FileExists(path); }

  const TempDir root_;
  const std::string dir_ = root_.Join("d");
  FaultInjectionEnv env_;
};

TEST_F(FaultInjectionEnvTest, RulePicksTheNthMatchingCall_AndFailsItLikePosix) {
  env_.AddRule({FaultKind::kError, ENOSPC, FsOp::kAppend, "b.txt\"", 2});
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> a, env_.NewWritableFile(Path("a.txt")));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> b, env_.NewWritableFile(Path("b.txt")));
  MUONSHARD_EXPECT_OK(a->Append("1"));
  MUONSHARD_EXPECT_OK(a->Append("2"));
  MUONSHARD_EXPECT_OK(b->Append("1"));
  EXPECT_THAT(b->Append("2"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr(Path("b.txt") + "\": No space left on device")));
  MUONSHARD_EXPECT_OK(b->Append("3"));
  EXPECT_EQ(env_.injected(), 1);
  EXPECT_EQ(env_.calls().size(), 7u);
  EXPECT_EQ(DescribeCall(env_.calls()[5]), "write \"" + Path("b.txt") + "\"");
}

TEST_F(FaultInjectionEnvTest, EveryMatch_WithNthZero) {
  env_.AddRule({FaultKind::kError, EIO, FsOp::kStat, "", 0});
  EXPECT_THAT(env_.FileExists(dir_), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("Input/output error")));
  EXPECT_THAT(env_.IsDirectory(dir_), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(dir_)));
  EXPECT_EQ(env_.injected(), 2);
}

TEST_F(FaultInjectionEnvTest, RenameRule_MatchesSourceOrTarget) {
  MUONSHARD_ASSERT_OK(Write(Path("from"), "x", true));
  env_.AddRule({FaultKind::kError, EIO, FsOp::kRename, "-> \"" + Path("to"), 1});
  EXPECT_THAT(env_.RenameFile(Path("from"), Path("to")),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("\"" + Path("from") + "\" to \"" + Path("to") + "\"")));
  EXPECT_TRUE(Exists(Path("from")));
}

TEST_F(FaultInjectionEnvTest, ShortWrite_WritesHalfThenFails) {
  env_.AddRule({FaultKind::kShortWrite, ENOSPC, FsOp::kAppend, "", 1});
  EXPECT_THAT(Write(Path("f"), "abcdefgh", true), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr(Path("f"))));
  EXPECT_THAT(Read(Path("f")), IsOkAndHolds(std::string("abcd")));
}

TEST_F(FaultInjectionEnvTest, ShortRead_LooksLikeATruncatedFile) {
  MUONSHARD_ASSERT_OK(Write(Path("f"), "abcdefgh", true));
  env_.AddRule({FaultKind::kShortRead, 0, FsOp::kRead, "", 1});
  env_.AddRule({FaultKind::kShortRead, 0, FsOp::kReadFile, "", 1});
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RandomAccessFile> file, env_.NewRandomAccessFile(Path("f")));
  char buf[8];
  EXPECT_THAT(file->ReadAt(0, buf, 8), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  MUONSHARD_EXPECT_OK(file->ReadAt(0, buf, 8));
  EXPECT_THAT(env_.ReadFileToString(Path("f")), IsOkAndHolds(std::string("abcd")));
}

// A random-access file's stats go through the rules like the env's.
TEST_F(FaultInjectionEnvTest, RandomAccessFile_StatsAreRecordedAndCanFail) {
  MUONSHARD_ASSERT_OK(Write(Path("f"), "abcdefgh", true));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RandomAccessFile> file, env_.NewRandomAccessFile(Path("f")));
  EXPECT_THAT(file->IsRegularFile(), IsOkAndHolds(true));
  EXPECT_THAT(file->Size(), IsOkAndHolds(8));
  env_.AddRule({FaultKind::kError, EIO, FsOp::kStat, "", 1});
  EXPECT_THAT(file->IsRegularFile(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(Path("f"))));
  EXPECT_THAT(file->IsRegularFile(), IsOkAndHolds(true));
  EXPECT_THAT(env_.NewRandomAccessFile(Path("missing")), StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
  const std::vector<FsCall> calls = env_.calls();
  ASSERT_GE(calls.size(), 4u);
  EXPECT_EQ(calls[calls.size() - 4].op, FsOp::kStat);
  EXPECT_EQ(calls[calls.size() - 3].op, FsOp::kStat);
}

TEST_F(FaultInjectionEnvTest, Crash_FailsThatCallAndEveryLaterOne_UntilSimulateCrash) {
  env_.AddRule({FaultKind::kCrash, 0, FsOp::kSync, "", 1});
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, env_.NewWritableFile(Path("f")));
  MUONSHARD_EXPECT_OK(file->Append("abc"));
  EXPECT_THAT(file->Sync(), StatusIs(absl::StatusCode::kAborted, HasSubstr("simulated crash: fsync")));
  EXPECT_TRUE(env_.crashed());
  EXPECT_THAT(file->Append("def"), StatusIs(absl::StatusCode::kAborted, HasSubstr("never ran")));
  EXPECT_THAT(env_.RemoveTree(Path("f")), StatusIs(absl::StatusCode::kAborted, HasSubstr("never ran")));
  file.reset();
  MUONSHARD_ASSERT_OK(env_.SimulateCrash(CrashMode::kProcess));
  EXPECT_FALSE(env_.crashed());
  EXPECT_THAT(Read(Path("f")), IsOkAndHolds(std::string("abc")));  // a process death loses nothing written
  MUONSHARD_EXPECT_OK(env_.FileExists(Path("f")).status());
}

TEST_F(FaultInjectionEnvTest, DropUnsyncedData_KeepsTheSyncedPrefix) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, env_.NewWritableFile(Path("f")));
  MUONSHARD_ASSERT_OK(file->Append("abc"));
  MUONSHARD_ASSERT_OK(file->Sync());
  MUONSHARD_ASSERT_OK(file->Append("def"));
  MUONSHARD_ASSERT_OK(file->Close());
  MUONSHARD_ASSERT_OK(Write(Path("never-synced"), "xyz", false));
  MUONSHARD_ASSERT_OK(env_.SimulateCrash(CrashMode::kDropUnsyncedData));
  EXPECT_THAT(Read(Path("f")), IsOkAndHolds(std::string("abc")));
  EXPECT_THAT(Read(Path("never-synced")), IsOkAndHolds(std::string("")));
}

TEST_F(FaultInjectionEnvTest, DropAllUnsynced_UndoesEntryChangesNoSyncDirCovered) {
  // Before the env saw anything: durable.
  MUONSHARD_ASSERT_OK(Env::Default()->CreateDirs(Path("old-dir")));
  MUONSHARD_ASSERT_OK(WriteFileAtomic(Env::Default(), Path("target"), "old"));
  MUONSHARD_ASSERT_OK(WriteFileAtomic(Env::Default(), Path("removed"), "kept"));
  // Unsynced: a creation, a rename over a file, a removal, a new directory.
  MUONSHARD_ASSERT_OK(Write(Path("created"), "c", true));
  MUONSHARD_ASSERT_OK(Write(Path("new"), "new", true));
  MUONSHARD_ASSERT_OK(env_.RenameFile(Path("new"), Path("target")));
  MUONSHARD_ASSERT_OK(env_.RemoveTree(Path("removed")));
  MUONSHARD_ASSERT_OK(env_.RemoveTree(Path("old-dir")));
  MUONSHARD_ASSERT_OK(env_.CreateDirs(Path("n1/n2")));
  EXPECT_THAT(Env::Default()->GetChildren(dir_), IsOkAndHolds(ElementsAre("created", "n1", "target")));
  MUONSHARD_ASSERT_OK(env_.SimulateCrash(CrashMode::kDropAllUnsynced));
  EXPECT_THAT(Env::Default()->GetChildren(dir_), IsOkAndHolds(ElementsAre("old-dir", "removed", "target")));
  EXPECT_THAT(Read(Path("target")), IsOkAndHolds(std::string("old")));
  EXPECT_THAT(Read(Path("removed")), IsOkAndHolds(std::string("kept")));
}

TEST_F(FaultInjectionEnvTest, SyncDir_MakesTheChangesInThatDirectoryDurable) {
  MUONSHARD_ASSERT_OK(WriteFileAtomic(Env::Default(), Path("target"), "old"));
  MUONSHARD_ASSERT_OK(WriteFileAtomic(Env::Default(), Path("removed"), "gone"));
  MUONSHARD_ASSERT_OK(env_.CreateDirs(Path("sub")));
  MUONSHARD_ASSERT_OK(Write(Path("sub/f"), "f", true));
  MUONSHARD_ASSERT_OK(Write(Path("new"), "new", true));
  MUONSHARD_ASSERT_OK(env_.RenameFile(Path("new"), Path("target")));
  MUONSHARD_ASSERT_OK(env_.RemoveFile(Path("removed")));
  MUONSHARD_ASSERT_OK(env_.SyncDir(dir_));  // not sub: sub/f stays unsynced
  MUONSHARD_ASSERT_OK(env_.SimulateCrash(CrashMode::kDropAllUnsynced));
  EXPECT_THAT(Env::Default()->GetChildren(dir_), IsOkAndHolds(ElementsAre("sub", "target")));
  EXPECT_THAT(Env::Default()->GetChildren(Path("sub")), IsOkAndHolds(ElementsAre()));
  EXPECT_THAT(Read(Path("target")), IsOkAndHolds(std::string("new")));
}

TEST_F(FaultInjectionEnvTest, RenamedDirectory_IsSyncedUnderItsNewName) {
  MUONSHARD_ASSERT_OK(env_.CreateDirs(Path("a.tmp")));
  MUONSHARD_ASSERT_OK(Write(Path("a.tmp/f"), "f", true));
  MUONSHARD_ASSERT_OK(env_.RenameFile(Path("a.tmp"), Path("a")));
  MUONSHARD_ASSERT_OK(env_.SyncDir(Path("a")));
  MUONSHARD_ASSERT_OK(env_.SyncDir(dir_));
  MUONSHARD_ASSERT_OK(env_.SimulateCrash(CrashMode::kDropAllUnsynced));
  EXPECT_THAT(Read(Path("a/f")), IsOkAndHolds(std::string("f")));
}

// WriteFileAtomic, failed at each of its calls with each fault: an error
// naming the file, the old content in place and no temporary left.
TEST_F(FaultInjectionEnvTest, WriteFileAtomic_EveryFailingCall_KeepsTheOldContentAndNoTemporary) {
  MUONSHARD_ASSERT_OK(WriteFileAtomic(Env::Default(), Path("f"), "old"));
  MUONSHARD_ASSERT_OK(WriteFileAtomic(&env_, Path("f"), "new"));
  const std::vector<FsCall> calls = env_.calls();
  ASSERT_EQ(calls.size(), 6u);  // create, write, fsync, close, rename, fsync directory
  for (int i = 1; i <= static_cast<int>(calls.size()); ++i) {
    for (int err : {EIO, ENOSPC}) {
      SCOPED_TRACE(absl::StrCat(DescribeCall(calls[i - 1]), " errno ", err));
      MUONSHARD_ASSERT_OK(WriteFileAtomic(Env::Default(), Path("f"), "old"));
      FaultInjectionEnv env(Env::Default(), root_.Join("trash2"));
      env.AddRule({FaultKind::kError, err, std::nullopt, "", i});
      absl::Status s = WriteFileAtomic(&env, Path("f"), "new");
      EXPECT_FALSE(s.ok());
      // The file, or for the final fsync its directory.
      EXPECT_THAT(s.message(), HasSubstr(calls[i - 1].op == FsOp::kSyncDir ? dir_ : Path("f")));
      // Failing the final fsync of the directory: the rename is done (and
      // the caller told it may not be durable).
      EXPECT_THAT(Read(Path("f")), IsOkAndHolds(std::string(calls[i - 1].op == FsOp::kSyncDir ? "new" : "old")));
      EXPECT_THAT(Env::Default()->GetChildren(dir_), IsOkAndHolds(ElementsAre("f")));
    }
  }
}

// A crash before each call, and after the last: the old or the new content,
// never anything else; the new one once WriteFileAtomic returned OK.
TEST_F(FaultInjectionEnvTest, WriteFileAtomic_CrashAnywhere_LeavesOldOrNew) {
  for (CrashMode mode : {CrashMode::kProcess, CrashMode::kDropUnsyncedData, CrashMode::kDropAllUnsynced}) {
    for (int i = 1; i <= 7; ++i) {
      SCOPED_TRACE(absl::StrCat("mode ", static_cast<int>(mode), ", crash before call ", i));
      MUONSHARD_ASSERT_OK(WriteFileAtomic(Env::Default(), Path("f"), "old"));
      FaultInjectionEnv env(Env::Default(), root_.Join("trash2"));
      env.AddRule({FaultKind::kCrash, 0, std::nullopt, "", i});
      const bool ok = WriteFileAtomic(&env, Path("f"), "new").ok();
      EXPECT_EQ(ok, i == 7);
      MUONSHARD_ASSERT_OK(env.SimulateCrash(mode));
      MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string got, Read(Path("f")));
      EXPECT_THAT(got, ::testing::AnyOf("old", "new"));
      if (ok) {
        EXPECT_EQ(got, "new");
      }
      // A process death leaves the temporary for the caller's clean-up
      // (checkpoint: RemoveLeftovers); a power loss drops it.
      MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, Env::Default()->GetChildren(dir_));
      for (const std::string& name : names) {
        if (name != "f") Env::Default()->RemoveFile(Path(name)).IgnoreError();
      }
    }
  }
}

// Directories made by CreateDirs alone vanish in a power loss;
// CreateDirsDurably's survive.
TEST_F(FaultInjectionEnvTest, CreateDirsDurably_SurvivesACrash_CreateDirsAloneDoesNot) {
  MUONSHARD_ASSERT_OK(Env::Default()->CreateDirs(Path("other")));
  MUONSHARD_ASSERT_OK(env_.CreateDirs(Path("other/plain/x")));
  MUONSHARD_ASSERT_OK(CreateDirsDurably(&env_, Path("durable/x/y")));
  MUONSHARD_ASSERT_OK(env_.SimulateCrash(CrashMode::kDropAllUnsynced));
  EXPECT_FALSE(Exists(Path("other/plain")));
  EXPECT_TRUE(Exists(Path("durable/x/y")));
}

}  // namespace
}  // namespace muonshard::testing
