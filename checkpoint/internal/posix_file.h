#ifndef MUONSHARD_CHECKPOINT_INTERNAL_POSIX_FILE_H_
#define MUONSHARD_CHECKPOINT_INTERNAL_POSIX_FILE_H_

// File-system primitives of the checkpoint library: an owning file
// descriptor with whole-buffer pread/write loops, directory helpers and zlib's
// crc32. Errors name the path. Not thread-safe per File; distinct Files are
// independent.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonshard::checkpoint::internal {

class File {
 public:
  // O_RDONLY. NOT_FOUND when missing.
  static absl::StatusOr<File> OpenForRead(const std::string& path);
  // O_WRONLY | O_CREAT | O_TRUNC: a fresh file, replacing any leftover.
  static absl::StatusOr<File> Create(const std::string& path);

  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::string& path() const { return path_; }
  absl::StatusOr<int64_t> Size() const;
  // Appends all of `data` (retrying short writes and EINTR).
  absl::Status Write(absl::string_view data);
  // Reads exactly n bytes at `offset`; DATA_LOSS when the file ends first.
  absl::Status ReadAt(int64_t offset, char* dst, int64_t n) const;
  absl::Status Sync();
  // Closes now, reporting the error close() may return after a write.
  absl::Status Close();
  // Hints the kernel to drop this file's cached pages (benchmarks: cold reads).
  void DropCache();

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

uint32_t Crc32(uint32_t crc, const void* data, int64_t n);
// crc32 of A followed by B, from crc32(A), crc32(B) and B's length.
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, int64_t length_b);

absl::StatusOr<bool> Exists(const std::string& path);
absl::StatusOr<bool> IsDirectory(const std::string& path);
// mkdir -p.
absl::Status MakeDirs(const std::string& dir);
// Names in `dir` (not "." or ".."), sorted.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir);
// rm -rf; OK when `path` does not exist.
absl::Status RemoveTree(const std::string& path);
absl::Status Rename(const std::string& from, const std::string& to);
absl::StatusOr<int64_t> FileSize(const std::string& path);

}  // namespace muonshard::checkpoint::internal

#endif  // MUONSHARD_CHECKPOINT_INTERNAL_POSIX_FILE_H_
