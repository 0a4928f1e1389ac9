#include "common/env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace muonshard {
namespace {

namespace fs = std::filesystem;

// One syscall moves at most 1 GiB, below Linux's 0x7ffff000 cap.
constexpr int64_t kMaxIo = int64_t{1} << 30;
// ReadFileToString's read size when the file's size says nothing (FIFOs,
// /proc).
constexpr int64_t kReadBlock = int64_t{64} << 10;

absl::Status FsError(const std::error_code& ec, absl::string_view what, absl::string_view path) {
  return IoError(ec.value(), what, path);
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  PosixWritableFile(const PosixWritableFile&) = delete;
  PosixWritableFile& operator=(const PosixWritableFile&) = delete;
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  const std::string& path() const override { return path_; }

  absl::Status Append(absl::string_view data) override {
    const char* p = data.data();
    int64_t left = static_cast<int64_t>(data.size());
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, static_cast<size_t>(std::min(left, kMaxIo)));
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoError(errno, "cannot write", path_);
      }
      p += n;
      left -= n;
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (::fsync(fd_) != 0) return IoError(errno, "cannot fsync", path_);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0) return IoError(errno, "cannot close", path_);
    return absl::OkStatus();
  }

 private:
  int fd_;
  const std::string path_;
};

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  PosixRandomAccessFile(const PosixRandomAccessFile&) = delete;
  PosixRandomAccessFile& operator=(const PosixRandomAccessFile&) = delete;
  ~PosixRandomAccessFile() override { ::close(fd_); }

  const std::string& path() const override { return path_; }

  absl::StatusOr<int64_t> Size() const override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return IoError(errno, "cannot stat", path_);
    return static_cast<int64_t>(st.st_size);
  }

  absl::StatusOr<bool> IsRegularFile() const override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return IoError(errno, "cannot stat", path_);
    return S_ISREG(st.st_mode);
  }

  absl::StatusOr<int64_t> ReadUpTo(int64_t offset, char* dst, int64_t n) const override {
    int64_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, dst + done, static_cast<size_t>(std::min(n - done, kMaxIo)), offset + done);
      if (got < 0) {
        if (errno == EINTR) continue;
        return IoError(errno, "cannot read", path_);
      }
      if (got == 0) break;
      done += got;
    }
    return done;
  }

  void DropCache() override { ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED); }

 private:
  const int fd_;
  const std::string path_;
};

// read(2) front to back into `out`.
absl::Status ReadAll(int fd, const std::string& path, std::string* out) {
  struct stat st;
  const int64_t hint = ::fstat(fd, &st) == 0 && st.st_size > 0 ? static_cast<int64_t>(st.st_size) : 0;
  out->reserve(static_cast<size_t>(hint));
  for (;;) {
    const int64_t want = std::min(std::max(hint + 1 - static_cast<int64_t>(out->size()), kReadBlock), kMaxIo);
    const size_t at = out->size();
    out->resize(at + static_cast<size_t>(want));
    const ssize_t got = ::read(fd, out->data() + at, static_cast<size_t>(want));
    if (got < 0 && errno == EINTR) {
      out->resize(at);
      continue;
    }
    if (got < 0) return IoError(errno, "cannot read", path);
    out->resize(at + static_cast<size_t>(got));
    if (got == 0) return absl::OkStatus();
  }
}

class PosixEnv final : public Env {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return IoError(errno, "cannot create", path);
    return std::make_unique<PosixWritableFile>(fd, path);
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    // O_NONBLOCK: a FIFO must not block the open. Reads then block as
    // always.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return IoError(errno, "cannot open", path);
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
      const int err = errno;
      ::close(fd);
      return IoError(err, "cannot open", path);
    }
    return std::make_unique<PosixRandomAccessFile>(fd, path);
  }

  absl::StatusOr<std::string> ReadFileToString(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return IoError(errno, "cannot open", path);
    std::string content;
    absl::Status s = ReadAll(fd, path, &content);
    ::close(fd);
    if (!s.ok()) return s;
    return content;
  }

  absl::StatusOr<bool> FileExists(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return IoError(errno, "cannot stat", path);
  }

  absl::StatusOr<bool> IsDirectory(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return IoError(errno, "cannot stat", path);
  }

  absl::StatusOr<int64_t> GetFileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return IoError(errno, "cannot stat", path);
    return static_cast<int64_t>(st.st_size);
  }

  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    std::error_code ec;
    std::vector<std::string> names;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      names.push_back(it->path().filename().string());
    }
    if (ec) return FsError(ec, "cannot list", dir);
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::Status CreateDirs(const std::string& dir) override {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return FsError(ec, "cannot create directory", dir);
    return absl::OkStatus();
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return IoError(errno, "cannot rename", absl::StrCat(from, "\" to \"", to));
    }
    return absl::OkStatus();
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return IoError(errno, "cannot remove", path);
    return absl::OkStatus();
  }

  absl::Status RemoveTree(const std::string& path) override {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) return FsError(ec, "cannot remove", path);
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return IoError(errno, "cannot open directory", dir);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return IoError(err, "cannot fsync directory", dir);
    return absl::OkStatus();
  }
};

absl::Status WriteTemp(Env* env, const std::string& tmp, absl::string_view contents) {
  absl::StatusOr<std::unique_ptr<WritableFile>> file = env->NewWritableFile(tmp);
  if (!file.ok()) return file.status();
  absl::Status s = (*file)->Append(contents);
  if (s.ok()) s = (*file)->Sync();
  if (s.ok()) s = (*file)->Close();
  return s;
}

std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

}  // namespace

absl::Status RandomAccessFile::ReadAt(int64_t offset, char* dst, int64_t n) const {
  absl::StatusOr<int64_t> got = ReadUpTo(offset, dst, n);
  if (!got.ok()) return got.status();
  if (*got < n) {
    return absl::DataLossError(absl::StrCat("\"", path(), "\" ends before byte ", offset + n, " (truncated)"));
  }
  return absl::OkStatus();
}

Env* Env::Default() {
  static Env* const env = new PosixEnv();
  return env;
}

absl::Status IoError(int err, absl::string_view what, absl::string_view path) {
  std::string msg = absl::StrCat(what, " \"", path, "\": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(msg);
    case EIO:
      return absl::DataLossError(msg);
    default:
      return absl::InternalError(msg);
  }
}

std::string DirName(const std::string& path) {
  const auto pos = path.find_last_of('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return path.substr(0, pos);
}

absl::Status WriteFileAtomic(Env* env, const std::string& path, absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  absl::Status s = WriteTemp(env, tmp, contents);
  if (s.ok()) s = env->RenameFile(tmp, path);
  if (!s.ok()) {
    env->RemoveFile(tmp).IgnoreError();  // NOT_FOUND when it was never created
    return s;
  }
  return env->SyncDir(DirName(path));
}

absl::Status CreateDirsDurably(Env* env, const std::string& dir) {
  // The directories missing now, innermost first.
  std::vector<std::string> missing;
  for (std::string p = StripTrailingSlashes(dir); !p.empty();) {
    absl::StatusOr<bool> exists = env->FileExists(p);
    if (!exists.ok() || *exists) break;  // CreateDirs reports a real error
    missing.push_back(p);
    std::string parent = DirName(p);
    if (parent == p) break;
    p = std::move(parent);
  }
  absl::Status s = env->CreateDirs(dir);
  if (!s.ok()) return s;
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    s = env->SyncDir(DirName(*it));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace muonshard
