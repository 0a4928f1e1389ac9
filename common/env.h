#ifndef MUONSHARD_COMMON_ENV_H_
#define MUONSHARD_COMMON_ENV_H_

// The file-system seam (after leveldb's Env): every file the checkpoint
// library and common/file_util read or write goes through an Env, so tests
// can substitute one that injects faults (tests/testing/
// fault_injection_env.h: ENOSPC, EIO, short writes and reads, fsync
// failures, and a crash that drops whatever was not synced).
// Env::Default() is the POSIX implementation, the one POSIX I/O layer of the
// project.
//
// Errors are absl::Status naming the path, the operation and strerror (see
// IoError for the codes). Env::Default() is thread-safe; one WritableFile or
// RandomAccessFile is thread-compatible (RandomAccessFile::ReadAt is const
// and safe to call concurrently on the POSIX one).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonshard {

// A file being written from its start: appends, then Sync and Close. The
// destructor closes without reporting; call Close to learn of errors.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual const std::string& path() const = 0;
  // Appends all of `data` (retrying short writes and EINTR).
  virtual absl::Status Append(absl::string_view data) = 0;
  // Makes everything appended so far durable (fsync).
  virtual absl::Status Sync() = 0;
  // Closes now, reporting the error close() may return after a write.
  virtual absl::Status Close() = 0;
};

// A file read at offsets.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  virtual const std::string& path() const = 0;
  virtual absl::StatusOr<int64_t> Size() const = 0;
  // False for what opens but is not a regular file (a directory, a FIFO, a
  // device): callers that need one refuse the rest.
  virtual absl::StatusOr<bool> IsRegularFile() const = 0;
  // Reads up to `n` bytes at `offset` into `dst`; fewer only when the file
  // ends first. Returns the bytes read.
  virtual absl::StatusOr<int64_t> ReadUpTo(int64_t offset, char* dst, int64_t n) const = 0;
  // Hints that the file's cached pages may go (benchmarks: cold reads).
  virtual void DropCache() {}

  // Reads exactly `n` bytes at `offset`; DATA_LOSS naming the file when it
  // ends first (truncated).
  absl::Status ReadAt(int64_t offset, char* dst, int64_t n) const;
};

class Env {
 public:
  virtual ~Env() = default;

  // The POSIX file system; never destroyed.
  static Env* Default();

  // A fresh file (created, or truncated when it exists), for writing.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // NOT_FOUND when missing. Opening never blocks (a FIFO opens at once; see
  // RandomAccessFile::IsRegularFile).
  virtual absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) = 0;
  // The whole file, read front to back (FIFOs and /proc files too); NOT_FOUND
  // when missing.
  virtual absl::StatusOr<std::string> ReadFileToString(const std::string& path) = 0;

  // False when `path` (or a directory on the way) does not exist.
  virtual absl::StatusOr<bool> FileExists(const std::string& path) = 0;
  virtual absl::StatusOr<bool> IsDirectory(const std::string& path) = 0;
  virtual absl::StatusOr<int64_t> GetFileSize(const std::string& path) = 0;
  // Names in `dir` (not "." or ".."), sorted.
  virtual absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) = 0;

  // mkdir -p; OK when `dir` exists. The new entries are durable only after
  // SyncDir of their parents (CreateDirsDurably).
  virtual absl::Status CreateDirs(const std::string& dir) = 0;
  // rename(2): replaces a file at `to`. Durable after SyncDir of `to`'s
  // directory.
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  // unlink(2); NOT_FOUND when missing.
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // rm -rf; OK when `path` does not exist.
  virtual absl::Status RemoveTree(const std::string& path) = 0;
  // fsync of a directory: makes the creations, renames and removals of
  // entries in it durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
};

// The status of a failed file-system call: "<what> "<path>": <strerror>".
// ENOENT: NOT_FOUND; EACCES, EPERM: PERMISSION_DENIED; ENOSPC, EDQUOT and
// EFBIG (a file-size limit is a full disk for that file):
// RESOURCE_EXHAUSTED; EIO: DATA_LOSS (the medium lost the bytes; not
// UNAVAILABLE, which callers such as the worker read as "retry" or "the group
// broke", and an fsync that failed must never be retried as if nothing was
// lost); anything else INTERNAL.
absl::Status IoError(int err, absl::string_view what, absl::string_view path);

// The directory part of `path`: "." without a slash, "/" for "/x".
std::string DirName(const std::string& path);

// Writes `path` atomically: `path`.tmp.<pid> written, synced and closed,
// renamed over `path`, then its directory synced. A failure before the
// rename removes the temporary; a crash leaves the old or the new content.
absl::Status WriteFileAtomic(Env* env, const std::string& path, absl::string_view contents);

// CreateDirs, then SyncDir of the parent of every directory it created, so
// that the directories survive a crash (a first save into a new checkpoint
// directory).
absl::Status CreateDirsDurably(Env* env, const std::string& dir);

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_ENV_H_
