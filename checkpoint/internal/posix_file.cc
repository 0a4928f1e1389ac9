#include "checkpoint/internal/posix_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace muonshard::checkpoint::internal {
namespace {

namespace fs = std::filesystem;

absl::Status ErrnoStatus(int err, absl::string_view what, const std::string& path) {
  std::string msg = absl::StrCat(what, " \"", path, "\": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  // EFBIG: a file-size limit (RLIMIT_FSIZE, the file system's maximum) is a
  // full disk for this file.
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::Status FsStatus(const std::error_code& ec, absl::string_view what, const std::string& path) {
  return ErrnoStatus(ec.value(), what, path);
}

// One syscall moves at most 1 GiB, below Linux's 0x7ffff000 cap.
constexpr int64_t kMaxIo = int64_t{1} << 30;

}  // namespace

absl::StatusOr<File> File::OpenForRead(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  return File(fd, path);
}

absl::StatusOr<File> File::Create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot create", path);
  return File(fd, path);
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<int64_t> File::Size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoStatus(errno, "cannot stat", path_);
  return static_cast<int64_t>(st.st_size);
}

absl::Status File::Write(absl::string_view data) {
  const char* p = data.data();
  int64_t left = static_cast<int64_t>(data.size());
  while (left > 0) {
    ssize_t n = ::write(fd_, p, static_cast<size_t>(std::min(left, kMaxIo)));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot write", path_);
    }
    p += n;
    left -= n;
  }
  return absl::OkStatus();
}

absl::Status File::ReadAt(int64_t offset, char* dst, int64_t n) const {
  while (n > 0) {
    ssize_t got = ::pread(fd_, dst, static_cast<size_t>(std::min(n, kMaxIo)), offset);
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read", path_);
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrCat("\"", path_, "\" ends before byte ", offset + n, " (truncated)"));
    }
    dst += got;
    offset += got;
    n -= got;
  }
  return absl::OkStatus();
}

absl::Status File::Sync() {
  if (::fsync(fd_) != 0) return ErrnoStatus(errno, "cannot fsync", path_);
  return absl::OkStatus();
}

absl::Status File::Close() {
  int fd = fd_;
  fd_ = -1;
  if (fd >= 0 && ::close(fd) != 0) return ErrnoStatus(errno, "cannot close", path_);
  return absl::OkStatus();
}

void File::DropCache() { ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED); }

uint32_t Crc32(uint32_t crc, const void* data, int64_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const int64_t len = std::min<int64_t>(n, kMaxIo);
    crc = static_cast<uint32_t>(::crc32_z(crc, p, static_cast<z_size_t>(len)));
    p += len;
    n -= len;
  }
  return crc;
}

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, int64_t length_b) {
  return static_cast<uint32_t>(::crc32_combine(crc_a, crc_b, static_cast<z_off_t>(length_b)));
}

absl::StatusOr<bool> Exists(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  return ErrnoStatus(errno, "cannot stat", path);
}

absl::StatusOr<bool> IsDirectory(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
  if (errno == ENOENT || errno == ENOTDIR) return false;
  return ErrnoStatus(errno, "cannot stat", path);
}

absl::Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return FsStatus(ec, "cannot create directory", dir);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> names;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) return FsStatus(ec, "cannot list", dir);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return FsStatus(ec, "cannot remove", path);
  return absl::OkStatus();
}

absl::Status Rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoStatus(errno, "cannot rename", absl::StrCat(from, "\" to \"", to));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  return static_cast<int64_t>(st.st_size);
}

}  // namespace muonshard::checkpoint::internal
