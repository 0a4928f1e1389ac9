// The POSIX Env (Env::Default()): round trips, the errors it reports (codes
// and paths) and the helpers on top of it.
#include "common/env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace muonshard {
namespace {

using ::muonshard::testing::StatusIs;
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

class PosixEnvTest : public ::testing::Test {
 protected:
  absl::Status Write(const std::string& path, absl::string_view data) {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = env_->NewWritableFile(path);
    if (!file.ok()) return file.status();
    absl::Status s = (*file)->Append(data);
    if (s.ok()) s = (*file)->Sync();
    if (s.ok()) s = (*file)->Close();
    return s;
  }

  Env* const env_ = Env::Default();
  const muonshard::testing::TempDir dir_;
};

TEST_F(PosixEnvTest, WrittenFile_ReadsBackAtAnyOffset) {
  const std::string path = dir_.Join("f");
  MUONSHARD_ASSERT_OK(Write(path, "0123456789"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RandomAccessFile> file, env_->NewRandomAccessFile(path));
  EXPECT_EQ(file->path(), path);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(int64_t size, file->Size());
  EXPECT_EQ(size, 10);
  char buf[4] = {};
  MUONSHARD_ASSERT_OK(file->ReadAt(3, buf, 4));
  EXPECT_EQ(std::string(buf, 4), "3456");
  MUONSHARD_ASSERT_OK_AND_ASSIGN(int64_t got, file->ReadUpTo(8, buf, 4));
  EXPECT_EQ(got, 2);
  EXPECT_THAT(file->ReadAt(8, buf, 4),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path + "\" ends before byte 12 (truncated)")));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string all, env_->ReadFileToString(path));
  EXPECT_EQ(all, "0123456789");
  MUONSHARD_ASSERT_OK_AND_ASSIGN(int64_t stat_size, env_->GetFileSize(path));
  EXPECT_EQ(stat_size, 10);
}

TEST_F(PosixEnvTest, NewWritableFile_ReplacesWhatWasThere) {
  const std::string path = dir_.Join("f");
  MUONSHARD_ASSERT_OK(Write(path, "a long first version"));
  MUONSHARD_ASSERT_OK(Write(path, "short"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string got, env_->ReadFileToString(path));
  EXPECT_EQ(got, "short");
}

TEST_F(PosixEnvTest, ReadFileToString_LargeFilesAndFilesWithoutASize) {
  std::string big(300 * 1024 + 7, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31);
  MUONSHARD_ASSERT_OK(Write(dir_.Join("big"), big));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string got, env_->ReadFileToString(dir_.Join("big")));
  EXPECT_TRUE(got == big);
  // stat says 0 bytes: read to the end all the same.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::string status, env_->ReadFileToString("/proc/self/status"));
  EXPECT_THAT(status, HasSubstr("Name:"));
}

TEST_F(PosixEnvTest, MissingFiles_AreNotFoundNamingThePath) {
  const std::string path = dir_.Join("missing");
  EXPECT_THAT(env_->NewRandomAccessFile(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(env_->ReadFileToString(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(env_->GetFileSize(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(env_->RemoveFile(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(env_->GetChildren(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(env_->SyncDir(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(env_->RenameFile(path, dir_.Join("to")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot rename \"" + path + "\" to \"")));
  EXPECT_THAT(env_->NewWritableFile(dir_.Join("no/such/dir")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot create")));
}

// What opens but is not a regular file is told apart; a FIFO opens at once
// rather than waiting for a writer.
TEST_F(PosixEnvTest, RandomAccessFile_IsRegularFile) {
  MUONSHARD_ASSERT_OK(Write(dir_.Join("file"), "x"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RandomAccessFile> file, env_->NewRandomAccessFile(dir_.Join("file")));
  EXPECT_THAT(file->IsRegularFile(), IsOkAndHolds(true));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RandomAccessFile> dir, env_->NewRandomAccessFile(dir_.path()));
  EXPECT_THAT(dir->IsRegularFile(), IsOkAndHolds(false));
  const std::string fifo = dir_.Join("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RandomAccessFile> pipe, env_->NewRandomAccessFile(fifo));
  EXPECT_THAT(pipe->IsRegularFile(), IsOkAndHolds(false));
}

// Reads at and past the end: ReadUpTo returns what is there, ReadAt is
// DATA_LOSS naming the file.
TEST_F(PosixEnvTest, RandomAccessFile_ShortReadsAtTheEnd) {
  const std::string path = dir_.Join("short");
  MUONSHARD_ASSERT_OK(Write(path, "abc"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RandomAccessFile> file, env_->NewRandomAccessFile(path));
  char buf[8] = {};
  EXPECT_THAT(file->ReadUpTo(0, buf, 8), IsOkAndHolds(3));
  EXPECT_EQ(std::string(buf, 3), "abc");
  EXPECT_THAT(file->ReadUpTo(3, buf, 8), IsOkAndHolds(0));
  EXPECT_THAT(file->ReadUpTo(100, buf, 8), IsOkAndHolds(0));
  EXPECT_THAT(file->ReadAt(1, buf, 3),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path + "\" ends before byte 4 (truncated)")));
  MUONSHARD_EXPECT_OK(file->ReadAt(1, buf, 2));
  EXPECT_EQ(std::string(buf, 2), "bc");
}

TEST_F(PosixEnvTest, ExistsAndIsDirectory) {
  MUONSHARD_ASSERT_OK(Write(dir_.Join("file"), "x"));
  EXPECT_THAT(env_->FileExists(dir_.Join("file")), IsOkAndHolds(true));
  EXPECT_THAT(env_->FileExists(dir_.path()), IsOkAndHolds(true));
  EXPECT_THAT(env_->FileExists(dir_.Join("missing")), IsOkAndHolds(false));
  EXPECT_THAT(env_->FileExists(dir_.Join("file/below")), IsOkAndHolds(false));  // ENOTDIR
  EXPECT_THAT(env_->IsDirectory(dir_.Join("file")), IsOkAndHolds(false));
  EXPECT_THAT(env_->IsDirectory(dir_.path()), IsOkAndHolds(true));
  EXPECT_THAT(env_->IsDirectory(dir_.Join("missing")), IsOkAndHolds(false));
}

TEST_F(PosixEnvTest, DirectoriesAreCreatedListedRenamedAndRemoved) {
  MUONSHARD_ASSERT_OK(env_->CreateDirs(dir_.Join("a/b/c")));
  MUONSHARD_ASSERT_OK(env_->CreateDirs(dir_.Join("a/b/c")));  // exists: OK
  MUONSHARD_ASSERT_OK(Write(dir_.Join("a/z"), "z"));
  MUONSHARD_ASSERT_OK(Write(dir_.Join("a/b/c/f"), "f"));
  EXPECT_THAT(env_->GetChildren(dir_.Join("a")), IsOkAndHolds(ElementsAre("b", "z")));
  MUONSHARD_ASSERT_OK(env_->RenameFile(dir_.Join("a/b"), dir_.Join("a/y")));
  EXPECT_THAT(env_->GetChildren(dir_.Join("a")), IsOkAndHolds(ElementsAre("y", "z")));
  MUONSHARD_ASSERT_OK(env_->SyncDir(dir_.Join("a")));
  MUONSHARD_ASSERT_OK(env_->RemoveTree(dir_.Join("a/y")));
  MUONSHARD_ASSERT_OK(env_->RemoveTree(dir_.Join("a/y")));  // gone: OK
  MUONSHARD_ASSERT_OK(env_->RemoveFile(dir_.Join("a/z")));
  EXPECT_THAT(env_->GetChildren(dir_.Join("a")), IsOkAndHolds(ElementsAre()));
}

TEST_F(PosixEnvTest, RenameFile_ReplacesTheTarget) {
  MUONSHARD_ASSERT_OK(Write(dir_.Join("new"), "new"));
  MUONSHARD_ASSERT_OK(Write(dir_.Join("old"), "old"));
  MUONSHARD_ASSERT_OK(env_->RenameFile(dir_.Join("new"), dir_.Join("old")));
  EXPECT_THAT(env_->ReadFileToString(dir_.Join("old")), IsOkAndHolds(std::string("new")));
  EXPECT_THAT(env_->FileExists(dir_.Join("new")), IsOkAndHolds(false));
}

// A device that is always full: write(2) fails with ENOSPC.
TEST_F(PosixEnvTest, FullDevice_IsResourceExhaustedNamingTheFile) {
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full";
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, env_->NewWritableFile("/dev/full"));
  EXPECT_THAT(file->Append("x"), StatusIs(absl::StatusCode::kResourceExhausted,
                                          HasSubstr("cannot write \"/dev/full\": No space left on device")));
}

TEST(IoErrorTest, MapsErrnoToCodes) {
  EXPECT_THAT(IoError(ENOENT, "cannot open", "/p"),
              StatusIs(absl::StatusCode::kNotFound, "cannot open \"/p\": No such file or directory"));
  EXPECT_THAT(IoError(EACCES, "x", "/p"), StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("/p")));
  EXPECT_THAT(IoError(EPERM, "x", "/p"), StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("/p")));
  for (int err : {ENOSPC, EDQUOT, EFBIG}) {
    EXPECT_THAT(IoError(err, "x", "/p"), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("/p")));
  }
  // Never UNAVAILABLE: the worker takes that for a broken group and retries.
  EXPECT_THAT(IoError(EIO, "cannot fsync", "/p"),
              StatusIs(absl::StatusCode::kDataLoss, "cannot fsync \"/p\": Input/output error"));
  EXPECT_THAT(IoError(EBADF, "x", "/p"), StatusIs(absl::StatusCode::kInternal, HasSubstr("/p")));
}

TEST(DirNameTest, ParentOfAPath) {
  EXPECT_EQ(DirName("a/b/c"), "a/b");
  EXPECT_EQ(DirName("/a"), "/");
  EXPECT_EQ(DirName("a"), ".");
}

TEST_F(PosixEnvTest, WriteFileAtomic_ReplacesAndLeavesNoTemporary) {
  const std::string path = dir_.Join("f");
  MUONSHARD_ASSERT_OK(WriteFileAtomic(env_, path, "first"));
  MUONSHARD_ASSERT_OK(WriteFileAtomic(env_, path, "second"));
  EXPECT_THAT(env_->ReadFileToString(path), IsOkAndHolds(std::string("second")));
  EXPECT_THAT(env_->GetChildren(dir_.path()), IsOkAndHolds(ElementsAre("f")));
  // Into a directory that is not there: nothing is left anywhere.
  EXPECT_THAT(WriteFileAtomic(env_, dir_.Join("missing/f"), "x"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing/f.tmp.")));
}

TEST_F(PosixEnvTest, CreateDirsDurably_CreatesEveryLevel) {
  MUONSHARD_ASSERT_OK(CreateDirsDurably(env_, dir_.Join("x/y/z/")));
  EXPECT_THAT(env_->IsDirectory(dir_.Join("x/y/z")), IsOkAndHolds(true));
  MUONSHARD_ASSERT_OK(CreateDirsDurably(env_, dir_.Join("x/y/z")));
  MUONSHARD_ASSERT_OK(Write(dir_.Join("file"), "x"));
  EXPECT_THAT(CreateDirsDurably(env_, dir_.Join("file/below")),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("file/below")));
}

}  // namespace
}  // namespace muonshard
