#ifndef MUONSHARD_TESTS_TESTING_FAULT_INJECTION_ENV_H_
#define MUONSHARD_TESTS_TESTING_FAULT_INJECTION_ENV_H_

// FaultInjectionEnv: an Env (common/env.h) over another one (the real file
// system under a test's scratch directory) that
//  - records every call (op and path), so a test can enumerate the steps of
//    an operation and fail each one in turn;
//  - fails calls by rule (op, call substring, n-th match): an errno (ENOSPC,
//    EIO, ... as the POSIX Env would report it), a short write (part of the
//    data written, then ENOSPC), a short read (the file seems to end
//    early), or a crash: the call and every later one fail, nothing more
//    reaches the disk, and no cleanup runs;
//  - tracks what is durable, like leveldb's FaultInjectionTestEnv: the bytes
//    of each file it wrote up to its last Sync, and each creation, rename
//    and removal of a directory entry until a SyncDir of that directory.
//    SimulateCrash then leaves the file system as a crash at that point
//    could: a process death keeps everything, a power loss truncates files
//    to their synced size and (pessimistically) also undoes every entry
//    change no SyncDir covered.
//
// Removed entries, and files a rename replaced, wait in `trash_dir` until
// their removal is durable, so that a crash can bring them back; it must be
// on the same file system as the files and outside the directories under
// test. Sync and SyncDir only update the model (not forwarded: the model is
// what the tests check, and fsync is slow). Thread-safe.

#include <cerrno>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"

namespace muonshard::testing {

enum class FsOp {
  kNewWritableFile,
  kAppend,
  kSync,
  kClose,
  kNewRandomAccessFile,
  kRead,      // RandomAccessFile::ReadUpTo
  kReadFile,  // Env::ReadFileToString
  kStat,      // FileExists, IsDirectory, GetFileSize, RandomAccessFile::Size and ::IsRegularFile
  kGetChildren,
  kCreateDirs,
  kRename,
  kRemoveFile,
  kRemoveTree,
  kSyncDir,
};
absl::string_view FsOpName(FsOp op);

struct FsCall {
  FsOp op;
  std::string path;
  std::string to;  // kRename's target
};
std::string DescribeCall(const FsCall& call);  // `rename "a" -> "b"`

enum class FaultKind {
  kError,       // the call fails with `err`; nothing is done
  kShortWrite,  // kAppend: the first half of the data is written, then `err`
  kShortRead,   // kRead, kReadFile: half of what was asked for, as if the file ended
  kCrash,       // the process dies before the call: it and every later call fail
};

struct FaultRule {
  FaultKind kind = FaultKind::kError;
  int err = EIO;
  // The calls it applies to: of `op` (any when unset) whose DescribeCall
  // contains `call_substr` (e.g. `/latest"`, or `.tmp" -> ` for a rename
  // from a name ending in .tmp).
  std::optional<FsOp> op;
  std::string call_substr;
  // The n-th such call (1-based) fails; 0: every one.
  int nth = 1;
};

enum class CrashMode {
  kProcess,           // the process died: the kernel keeps what it was handed
  kDropUnsyncedData,  // power loss: files back to their synced size, entries kept
  kDropAllUnsynced,   // power loss: and every unsynced creation, rename and removal undone
};

class FaultInjectionEnv final : public Env {
 public:
  FaultInjectionEnv(Env* base, std::string trash_dir);
  ~FaultInjectionEnv() override;

  void AddRule(FaultRule rule);
  // Every call so far, in order (failed ones included).
  std::vector<FsCall> calls() const;
  int injected() const;  // faults injected so far (a crash counts once)
  bool crashed() const;

  // Leaves the file system as a crash now could, then forgets the rules and
  // the model: what is on disk afterwards counts as durable, and the env
  // works again (a restarted process).
  absl::Status SimulateCrash(CrashMode mode);

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override;
  absl::StatusOr<std::string> ReadFileToString(const std::string& path) override;
  absl::StatusOr<bool> FileExists(const std::string& path) override;
  absl::StatusOr<bool> IsDirectory(const std::string& path) override;
  absl::StatusOr<int64_t> GetFileSize(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override;
  absl::Status CreateDirs(const std::string& dir) override;
  absl::Status RenameFile(const std::string& from, const std::string& to) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status RemoveTree(const std::string& path) override;
  absl::Status SyncDir(const std::string& dir) override;

 private:
  friend class FaultWritableFile;
  friend class FaultRandomAccessFile;

  // A fault decided for one call.
  struct Decision {
    absl::Status status;  // OK: go ahead (possibly short)
    bool short_io = false;
  };
  // An entry change not yet made durable by a SyncDir.
  struct EntryChange {
    enum Kind { kCreate, kRename, kRemove } kind;
    std::string path;               // created, removed, or the rename's source
    std::string to;                 // the rename's target
    std::string trash;              // where the removed or replaced entry waits ("" when none)
    std::vector<std::string> dirs;  // current names of the directories to sync
  };
  struct FileState {
    int64_t size = 0;
    int64_t synced = 0;
  };

  // Records the call and applies the rules.
  Decision Check(FsOp op, const std::string& path, const std::string& to = "") ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NewTrashPath() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-keys the model's paths at or under `from` to `to`.
  void MovePaths(const std::string& from, const std::string& to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetPaths(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `path` to the trash and records its removal.
  absl::Status Trash(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MakeDurable(const EntryChange& change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Undo(const EntryChange& change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DropUnsyncedData() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // For the files it hands out.
  absl::Status OnAppend(const std::string& path, WritableFile& base, absl::string_view data);
  absl::Status OnSync(const std::string& path);
  absl::Status OnClose(const std::string& path, WritableFile& base);
  absl::StatusOr<int64_t> OnRead(const RandomAccessFile& base, int64_t offset, char* dst, int64_t n);
  absl::StatusOr<int64_t> OnSize(const RandomAccessFile& base);
  absl::StatusOr<bool> OnIsRegularFile(const RandomAccessFile& base);

  Env* const base_;
  const std::string trash_dir_;
  mutable absl::Mutex mu_;
  std::vector<FaultRule> rules_ ABSL_GUARDED_BY(mu_);
  std::vector<int> matches_ ABSL_GUARDED_BY(mu_);  // per rule
  std::vector<FsCall> calls_ ABSL_GUARDED_BY(mu_);
  int injected_ ABSL_GUARDED_BY(mu_) = 0;
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_trash_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, FileState> files_ ABSL_GUARDED_BY(mu_);
  std::vector<EntryChange> unsynced_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muonshard::testing

#endif  // MUONSHARD_TESTS_TESTING_FAULT_INJECTION_ENV_H_
