#include "importer/safetensors_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/ordered_json.h"
#include "common/safetensors_header.h"
#include "common/status_macros.h"

namespace muonshard::importer {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kSingleFile = "model.safetensors";
constexpr absl::string_view kIndexFile = "model.safetensors.index.json";
// One pread moves at most 1 GiB, below Linux's 0x7ffff000 cap.
constexpr int64_t kMaxIo = int64_t{1} << 30;

// A regular file opened read-only; only ever read at given offsets.
class ReadOnlyFile {
 public:
  static absl::StatusOr<ReadOnlyFile> Open(const std::string& path) {
    // O_NONBLOCK: a FIFO must not block the open; it is refused below.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
    ReadOnlyFile file(fd, path);
    struct stat st;
    if (::fstat(fd, &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path));
    if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
    file.size_ = static_cast<int64_t>(st.st_size);
    return file;
  }

  ReadOnlyFile(ReadOnlyFile&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), size_(other.size_), path_(std::move(other.path_)) {}
  ReadOnlyFile& operator=(ReadOnlyFile&&) = delete;
  ~ReadOnlyFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  int64_t size() const { return size_; }

  // Exactly `n` bytes from `offset`.
  absl::StatusOr<std::string> ReadAt(int64_t offset, int64_t n) const {
    std::string out(static_cast<size_t>(n), '\0');
    int64_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, out.data() + done, static_cast<size_t>(std::min(n - done, kMaxIo)),
                                  static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path_));
      if (got == 0) return absl::DataLossError(absl::StrCat(path_, ": file shrank while being read"));
      done += got;
    }
    return out;
  }

 private:
  ReadOnlyFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  int fd_ = -1;
  int64_t size_ = 0;
  std::string path_;
};

// The 8-byte length and the N-byte JSON header of `path`, nothing more.
absl::StatusOr<SafetensorsFileHeader> ReadHeader(const std::string& path, std::string name) {
  MUONSHARD_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::Open(path));
  SafetensorsFileHeader header;
  header.name = std::move(name);
  header.path = path;
  header.file_size = file.size();
  std::string first8;
  if (file.size() >= 8) {
    MUONSHARD_ASSIGN_OR_RETURN(first8, file.ReadAt(0, 8));
  }
  absl::StatusOr<int64_t> length = SafetensorsHeaderLength(first8, file.size());
  if (!length.ok()) return Annotate(length.status(), path);
  MUONSHARD_ASSIGN_OR_RETURN(header.json, file.ReadAt(8, *length));
  return header;
}

absl::StatusOr<std::string> ReadIndexFile(const std::string& path) {
  MUONSHARD_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::Open(path));
  if (file.size() > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", file.size(), " bytes, more than an index may hold (",
                                                   kMaxSafetensorsHeaderBytes, ")"));
  }
  return file.ReadAt(0, file.size());
}

bool IsDirectory(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

bool Exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

// The name of the directory `path` names (as spelled, symlinks unresolved).
std::string DirectoryName(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) p = path;
  p = p.lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

std::string DefaultName(const std::string& path, bool is_directory) {
  if (is_directory) return DirectoryName(path);
  absl::string_view base = path;
  if (const size_t slash = base.rfind('/'); slash != absl::string_view::npos) base.remove_prefix(slash + 1);
  if (base == kSingleFile || base == kIndexFile) {
    return DirectoryName(fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string());
  }
  if (!absl::ConsumeSuffix(&base, ".safetensors.index.json") && !absl::ConsumeSuffix(&base, ".index.json")) {
    absl::ConsumeSuffix(&base, ".safetensors");
  }
  return std::string(base);
}

// "dir/" -> "dir"; "/" stays.
std::string WithoutTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string FileName(const std::string& path) { return fs::path(path).filename().string(); }

std::string DirectoryOf(const std::string& path) {
  const std::string dir = fs::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

absl::StatusOr<SafetensorsImport> ImportSingle(const std::string& path, const SafetensorsImportOptions& options) {
  MUONSHARD_ASSIGN_OR_RETURN(SafetensorsFileHeader header, ReadHeader(path, FileName(path)));
  return ImportSafetensorsHeaders({std::move(header)}, nullptr, options);
}

absl::StatusOr<SafetensorsImport> ImportSharded(const std::string& index_path,
                                                const SafetensorsImportOptions& options) {
  MUONSHARD_ASSIGN_OR_RETURN(std::string json, ReadIndexFile(index_path));
  MUONSHARD_ASSIGN_OR_RETURN(SafetensorsIndex index, ParseSafetensorsIndex(json, index_path));
  const std::string dir = DirectoryOf(index_path);
  std::vector<SafetensorsFileHeader> headers;
  headers.reserve(index.files.size());
  for (const std::string& file : index.files) {
    const std::string shard = absl::StrCat(dir, "/", file);
    absl::StatusOr<SafetensorsFileHeader> header = ReadHeader(shard, file);
    if (absl::IsNotFound(header.status())) {
      return absl::NotFoundError(
          absl::StrCat(index_path, " names ", QuoteForMessage(file), ", which does not exist: ", shard));
    }
    if (!header.ok()) return header.status();
    headers.push_back(*std::move(header));
  }
  MUONSHARD_ASSIGN_OR_RETURN(SafetensorsImport out, ImportSafetensorsHeaders(headers, &index, options));
  out.bytes_read += static_cast<int64_t>(json.size());
  return out;
}

}  // namespace

absl::StatusOr<SafetensorsImport> ImportSafetensors(const std::string& path, SafetensorsImportOptions options) {
  const std::string trimmed = WithoutTrailingSlashes(path);
  const bool is_directory = IsDirectory(trimmed);
  if (!is_directory && !Exists(trimmed)) return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
  if (options.default_name.empty()) options.default_name = DefaultName(trimmed, is_directory);
  if (!is_directory) {
    return absl::EndsWith(trimmed, ".index.json") ? ImportSharded(trimmed, options) : ImportSingle(trimmed, options);
  }
  const std::string single = absl::StrCat(trimmed, "/", kSingleFile);
  if (Exists(single)) return ImportSingle(single, options);
  const std::string index = absl::StrCat(trimmed, "/", kIndexFile);
  if (Exists(index)) return ImportSharded(index, options);
  return absl::NotFoundError(absl::StrCat(path, ": holds neither ", kSingleFile, " nor ", kIndexFile));
}

}  // namespace muonshard::importer
