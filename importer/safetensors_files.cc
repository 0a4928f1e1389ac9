#include "importer/safetensors_files.h"

#include <filesystem>
#include <memory>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/env.h"
#include "common/ordered_json.h"
#include "common/safetensors_header.h"
#include "common/status_macros.h"

namespace muonshard::importer {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kSingleFile = "model.safetensors";
constexpr absl::string_view kIndexFile = "model.safetensors.index.json";

// A regular file opened read-only through the Env; only ever read at given
// offsets.
class ReadOnlyFile {
 public:
  static absl::StatusOr<ReadOnlyFile> Open(Env* env, const std::string& path) {
    MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->NewRandomAccessFile(path));
    MUONSHARD_ASSIGN_OR_RETURN(const bool regular, file->IsRegularFile());
    if (!regular) return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
    MUONSHARD_ASSIGN_OR_RETURN(const int64_t size, file->Size());
    return ReadOnlyFile(std::move(file), size);
  }

  int64_t size() const { return size_; }

  // Exactly `n` bytes from `offset`.
  absl::StatusOr<std::string> ReadAt(int64_t offset, int64_t n) const {
    std::string out(static_cast<size_t>(n), '\0');
    MUONSHARD_ASSIGN_OR_RETURN(const int64_t got, file_->ReadUpTo(offset, out.data(), n));
    if (got < n) return absl::DataLossError(absl::StrCat(file_->path(), ": file shrank while being read"));
    return out;
  }

 private:
  ReadOnlyFile(std::unique_ptr<RandomAccessFile> file, int64_t size) : file_(std::move(file)), size_(size) {}

  std::unique_ptr<RandomAccessFile> file_;
  int64_t size_ = 0;
};

// The 8-byte length and the N-byte JSON header of `path`, nothing more.
absl::StatusOr<SafetensorsFileHeader> ReadHeader(Env* env, const std::string& path, std::string name) {
  MUONSHARD_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::Open(env, path));
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

absl::StatusOr<std::string> ReadIndexFile(Env* env, const std::string& path) {
  MUONSHARD_ASSIGN_OR_RETURN(ReadOnlyFile file, ReadOnlyFile::Open(env, path));
  if (file.size() > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", file.size(), " bytes, more than an index may hold (",
                                                   kMaxSafetensorsHeaderBytes, ")"));
  }
  return file.ReadAt(0, file.size());
}

// False too when the file system cannot tell.
bool IsDirectory(Env* env, const std::string& path) {
  absl::StatusOr<bool> is_directory = env->IsDirectory(path);
  return is_directory.ok() && *is_directory;
}

bool Exists(Env* env, const std::string& path) {
  absl::StatusOr<bool> exists = env->FileExists(path);
  return exists.ok() && *exists;
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

absl::StatusOr<SafetensorsImport> ImportSingle(Env* env, const std::string& path,
                                               const SafetensorsImportOptions& options) {
  MUONSHARD_ASSIGN_OR_RETURN(SafetensorsFileHeader header, ReadHeader(env, path, FileName(path)));
  return ImportSafetensorsHeaders({std::move(header)}, nullptr, options);
}

absl::StatusOr<SafetensorsImport> ImportSharded(Env* env, const std::string& index_path,
                                                const SafetensorsImportOptions& options) {
  MUONSHARD_ASSIGN_OR_RETURN(std::string json, ReadIndexFile(env, index_path));
  MUONSHARD_ASSIGN_OR_RETURN(SafetensorsIndex index, ParseSafetensorsIndex(json, index_path));
  const std::string dir = DirectoryOf(index_path);
  std::vector<SafetensorsFileHeader> headers;
  headers.reserve(index.files.size());
  for (const std::string& file : index.files) {
    const std::string shard = absl::StrCat(dir, "/", file);
    absl::StatusOr<SafetensorsFileHeader> header = ReadHeader(env, shard, file);
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
  return ImportSafetensors(Env::Default(), path, std::move(options));
}

absl::StatusOr<SafetensorsImport> ImportSafetensors(Env* env, const std::string& path,
                                                    SafetensorsImportOptions options) {
  const std::string trimmed = WithoutTrailingSlashes(path);
  const bool is_directory = IsDirectory(env, trimmed);
  if (!is_directory && !Exists(env, trimmed)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
  }
  if (options.default_name.empty()) options.default_name = DefaultName(trimmed, is_directory);
  if (!is_directory) {
    return absl::EndsWith(trimmed, ".index.json") ? ImportSharded(env, trimmed, options)
                                                  : ImportSingle(env, trimmed, options);
  }
  const std::string single = absl::StrCat(trimmed, "/", kSingleFile);
  if (Exists(env, single)) return ImportSingle(env, single, options);
  const std::string index = absl::StrCat(trimmed, "/", kIndexFile);
  if (Exists(env, index)) return ImportSharded(env, index, options);
  return absl::NotFoundError(absl::StrCat(path, ": holds neither ", kSingleFile, " nor ", kIndexFile));
}

}  // namespace muonshard::importer
