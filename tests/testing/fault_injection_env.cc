#include "tests/testing/fault_injection_env.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace muonshard::testing {
namespace {

// "a/b/" and "a//b" name the same directory as "a/b".
std::string Normalize(const std::string& path) {
  std::string out = std::filesystem::path(path).lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

// `path` is `prefix` or lies under it.
bool AtOrUnder(const std::string& path, const std::string& prefix) {
  return path == prefix || absl::StartsWith(path, absl::StrCat(prefix, "/"));
}

std::string Rebase(const std::string& path, const std::string& from, const std::string& to) {
  return absl::StrCat(to, absl::string_view(path).substr(from.size()));
}

bool Exists(Env* env, const std::string& path) {
  absl::StatusOr<bool> exists = env->FileExists(path);
  return exists.ok() && *exists;
}

}  // namespace

absl::string_view FsOpName(FsOp op) {
  switch (op) {
    case FsOp::kNewWritableFile:
      return "create";
    case FsOp::kAppend:
      return "write";
    case FsOp::kSync:
      return "fsync";
    case FsOp::kClose:
      return "close";
    case FsOp::kNewRandomAccessFile:
      return "open";
    case FsOp::kRead:
      return "read";
    case FsOp::kReadFile:
      return "read file";
    case FsOp::kStat:
      return "stat";
    case FsOp::kGetChildren:
      return "list";
    case FsOp::kCreateDirs:
      return "create directory";
    case FsOp::kRename:
      return "rename";
    case FsOp::kRemoveFile:
      return "remove";
    case FsOp::kRemoveTree:
      return "remove tree";
    case FsOp::kSyncDir:
      return "fsync directory";
  }
  return "?";
}

std::string DescribeCall(const FsCall& call) {
  std::string out = absl::StrCat(FsOpName(call.op), " \"", call.path, "\"");
  if (call.op == FsOp::kRename) absl::StrAppend(&out, " -> \"", call.to, "\"");
  return out;
}

class FaultWritableFile final : public WritableFile {
 public:
  FaultWritableFile(FaultInjectionEnv* env, std::unique_ptr<WritableFile> base) : env_(env), base_(std::move(base)) {}

  const std::string& path() const override { return base_->path(); }
  absl::Status Append(absl::string_view data) override { return env_->OnAppend(path(), *base_, data); }
  absl::Status Sync() override { return env_->OnSync(path()); }
  absl::Status Close() override { return env_->OnClose(path(), *base_); }

 private:
  FaultInjectionEnv* const env_;
  const std::unique_ptr<WritableFile> base_;
};

class FaultRandomAccessFile final : public RandomAccessFile {
 public:
  FaultRandomAccessFile(FaultInjectionEnv* env, std::unique_ptr<RandomAccessFile> base)
      : env_(env), base_(std::move(base)) {}

  const std::string& path() const override { return base_->path(); }
  absl::StatusOr<int64_t> Size() const override { return env_->OnSize(*base_); }
  absl::StatusOr<bool> IsRegularFile() const override { return env_->OnIsRegularFile(*base_); }
  absl::StatusOr<int64_t> ReadUpTo(int64_t offset, char* dst, int64_t n) const override {
    return env_->OnRead(*base_, offset, dst, n);
  }
  void DropCache() override { base_->DropCache(); }

 private:
  FaultInjectionEnv* const env_;
  const std::unique_ptr<RandomAccessFile> base_;
};

FaultInjectionEnv::FaultInjectionEnv(Env* base, std::string trash_dir) : base_(base), trash_dir_(std::move(trash_dir)) {
  base_->CreateDirs(trash_dir_).IgnoreError();
}

FaultInjectionEnv::~FaultInjectionEnv() { base_->RemoveTree(trash_dir_).IgnoreError(); }

void FaultInjectionEnv::AddRule(FaultRule rule) {
  absl::MutexLock lock(&mu_);
  rules_.push_back(std::move(rule));
  matches_.push_back(0);
}

std::vector<FsCall> FaultInjectionEnv::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

int FaultInjectionEnv::injected() const {
  absl::MutexLock lock(&mu_);
  return injected_;
}

bool FaultInjectionEnv::crashed() const {
  absl::MutexLock lock(&mu_);
  return crashed_;
}

FaultInjectionEnv::Decision FaultInjectionEnv::Check(FsOp op, const std::string& path, const std::string& to) {
  const FsCall call{op, path, to};
  calls_.push_back(call);
  if (crashed_) return {absl::AbortedError(absl::StrCat("simulated crash: ", DescribeCall(call), " never ran"))};
  const std::string described = DescribeCall(call);
  int fired = -1;
  for (size_t i = 0; i < rules_.size(); ++i) {
    const FaultRule& r = rules_[i];
    if (r.op.has_value() && *r.op != op) continue;
    if (!absl::StrContains(described, r.call_substr)) continue;
    ++matches_[i];
    if (fired < 0 && (r.nth == 0 || matches_[i] == r.nth)) fired = static_cast<int>(i);
  }
  if (fired < 0) return {};
  ++injected_;
  const FaultRule& r = rules_[fired];
  const std::string where = to.empty() ? path : absl::StrCat(path, "\" to \"", to);
  const bool read = op == FsOp::kRead || op == FsOp::kReadFile;
  switch (r.kind) {
    case FaultKind::kCrash:
      crashed_ = true;
      return {absl::AbortedError(absl::StrCat("simulated crash: ", DescribeCall(call), " never ran"))};
    case FaultKind::kShortRead:
      if (read) return {absl::OkStatus(), /*short_io=*/true};
      break;
    case FaultKind::kShortWrite:
      if (op == FsOp::kAppend) {
        return {IoError(r.err, "cannot write (injected after a short write)", where), /*short_io=*/true};
      }
      break;
    case FaultKind::kError:
      break;
  }
  return {IoError(r.err, absl::StrCat("cannot ", FsOpName(op), " (injected)"), where)};
}

std::string FaultInjectionEnv::NewTrashPath() { return absl::StrCat(trash_dir_, "/", next_trash_++); }

void FaultInjectionEnv::MovePaths(const std::string& from, const std::string& to) {
  std::map<std::string, FileState> moved;
  for (auto it = files_.begin(); it != files_.end();) {
    if (AtOrUnder(it->first, from)) {
      moved[Rebase(it->first, from, to)] = it->second;
      it = files_.erase(it);
    } else {
      ++it;
    }
  }
  files_.merge(moved);
  const std::string norm_from = Normalize(from);
  for (EntryChange& change : unsynced_) {
    for (std::string& dir : change.dirs) {
      if (AtOrUnder(dir, norm_from)) dir = Rebase(dir, norm_from, Normalize(to));
    }
  }
}

void FaultInjectionEnv::ForgetPaths(const std::string& path) {
  for (auto it = files_.begin(); it != files_.end();) {
    it = AtOrUnder(it->first, path) ? files_.erase(it) : std::next(it);
  }
}

absl::Status FaultInjectionEnv::Trash(const std::string& path) {
  const std::string trash = NewTrashPath();
  absl::Status s = base_->RenameFile(path, trash);
  if (!s.ok()) return s;
  MovePaths(path, trash);
  unsynced_.push_back({EntryChange::kRemove, path, "", trash, {Normalize(DirName(path))}});
  return absl::OkStatus();
}

void FaultInjectionEnv::MakeDurable(const EntryChange& change) {
  if (change.trash.empty()) return;
  base_->RemoveTree(change.trash).IgnoreError();
  ForgetPaths(change.trash);
}

absl::Status FaultInjectionEnv::Undo(const EntryChange& change) {
  switch (change.kind) {
    case EntryChange::kCreate:
      ForgetPaths(change.path);
      return base_->RemoveTree(change.path);
    case EntryChange::kRename:
      if (Exists(base_, change.to)) {
        absl::Status s = base_->RenameFile(change.to, change.path);
        if (!s.ok()) return s;
        MovePaths(change.to, change.path);
      }
      break;
    case EntryChange::kRemove:
      break;
  }
  if (change.trash.empty()) return absl::OkStatus();
  const std::string back = change.kind == EntryChange::kRename ? change.to : change.path;
  absl::Status s = base_->RenameFile(change.trash, back);
  if (s.ok()) MovePaths(change.trash, back);
  return s;
}

absl::Status FaultInjectionEnv::DropUnsyncedData() {
  for (const auto& [path, state] : files_) {
    if (state.synced >= state.size || !Exists(base_, path)) continue;
    absl::StatusOr<std::string> content = base_->ReadFileToString(path);
    if (!content.ok()) return content.status();
    if (static_cast<int64_t>(content->size()) <= state.synced) continue;
    absl::StatusOr<std::unique_ptr<WritableFile>> file = base_->NewWritableFile(path);
    if (!file.ok()) return file.status();
    absl::Status s = (*file)->Append(absl::string_view(*content).substr(0, static_cast<size_t>(state.synced)));
    if (s.ok()) s = (*file)->Close();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::SimulateCrash(CrashMode mode) {
  absl::MutexLock lock(&mu_);
  absl::Status status;
  if (mode == CrashMode::kDropAllUnsynced) {
    for (auto it = unsynced_.rbegin(); it != unsynced_.rend(); ++it) status.Update(Undo(*it));
  } else {
    for (const EntryChange& change : unsynced_) MakeDurable(change);  // the kernel did them
  }
  if (mode != CrashMode::kProcess) status.Update(DropUnsyncedData());
  unsynced_.clear();
  files_.clear();
  rules_.clear();
  matches_.clear();
  crashed_ = false;
  return status;
}

// ---- Env ----

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kNewWritableFile, path); !d.status.ok()) return d.status;
  const bool existed = Exists(base_, path);
  absl::StatusOr<std::unique_ptr<WritableFile>> file = base_->NewWritableFile(path);
  if (!file.ok()) return file.status();
  if (!existed) unsynced_.push_back({EntryChange::kCreate, path, "", "", {Normalize(DirName(path))}});
  files_[path] = FileState{};
  return std::make_unique<FaultWritableFile>(this, *std::move(file));
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> FaultInjectionEnv::NewRandomAccessFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kNewRandomAccessFile, path); !d.status.ok()) return d.status;
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = base_->NewRandomAccessFile(path);
  if (!file.ok()) return file.status();
  return std::make_unique<FaultRandomAccessFile>(this, *std::move(file));
}

absl::StatusOr<std::string> FaultInjectionEnv::ReadFileToString(const std::string& path) {
  absl::MutexLock lock(&mu_);
  const Decision d = Check(FsOp::kReadFile, path);
  if (!d.status.ok()) return d.status;
  absl::StatusOr<std::string> content = base_->ReadFileToString(path);
  if (content.ok() && d.short_io) content->resize(content->size() / 2);
  return content;
}

absl::StatusOr<bool> FaultInjectionEnv::FileExists(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kStat, path); !d.status.ok()) return d.status;
  return base_->FileExists(path);
}

absl::StatusOr<bool> FaultInjectionEnv::IsDirectory(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kStat, path); !d.status.ok()) return d.status;
  return base_->IsDirectory(path);
}

absl::StatusOr<int64_t> FaultInjectionEnv::GetFileSize(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kStat, path); !d.status.ok()) return d.status;
  return base_->GetFileSize(path);
}

absl::StatusOr<std::vector<std::string>> FaultInjectionEnv::GetChildren(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kGetChildren, dir); !d.status.ok()) return d.status;
  return base_->GetChildren(dir);
}

absl::Status FaultInjectionEnv::CreateDirs(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kCreateDirs, dir); !d.status.ok()) return d.status;
  std::vector<std::string> missing;  // innermost first
  for (std::string p = Normalize(dir); !p.empty() && !Exists(base_, p);) {
    missing.push_back(p);
    std::string parent = DirName(p);
    if (parent == p) break;
    p = std::move(parent);
  }
  absl::Status s = base_->CreateDirs(dir);
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (Exists(base_, *it)) unsynced_.push_back({EntryChange::kCreate, *it, "", "", {Normalize(DirName(*it))}});
  }
  return s;
}

absl::Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kRename, from, to); !d.status.ok()) return d.status;
  // A file the rename replaces waits in the trash until the rename is durable.
  std::string displaced;
  absl::StatusOr<bool> to_is_dir = base_->IsDirectory(to);
  if (Exists(base_, from) && Exists(base_, to) && to_is_dir.ok() && !*to_is_dir) {
    displaced = NewTrashPath();
    absl::Status s = base_->RenameFile(to, displaced);
    if (!s.ok()) return s;
    MovePaths(to, displaced);
  }
  absl::Status s = base_->RenameFile(from, to);
  if (!s.ok()) {
    if (!displaced.empty() && base_->RenameFile(displaced, to).ok()) MovePaths(displaced, to);
    return s;
  }
  MovePaths(from, to);
  std::vector<std::string> dirs = {Normalize(DirName(to))};
  if (Normalize(DirName(from)) != dirs[0]) dirs.push_back(Normalize(DirName(from)));
  unsynced_.push_back({EntryChange::kRename, from, to, displaced, std::move(dirs)});
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::RemoveFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kRemoveFile, path); !d.status.ok()) return d.status;
  absl::StatusOr<bool> is_dir = base_->IsDirectory(path);
  if (!Exists(base_, path) || !is_dir.ok() || *is_dir) return base_->RemoveFile(path);  // its error
  return Trash(path);
}

absl::Status FaultInjectionEnv::RemoveTree(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kRemoveTree, path); !d.status.ok()) return d.status;
  if (!Exists(base_, path)) return base_->RemoveTree(path);
  return Trash(path);
}

absl::Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kSyncDir, dir); !d.status.ok()) return d.status;
  absl::StatusOr<bool> is_dir = base_->IsDirectory(dir);
  if (!is_dir.ok()) return is_dir.status();
  if (!*is_dir) return IoError(ENOENT, "cannot open directory", dir);
  const std::string norm = Normalize(dir);
  std::vector<EntryChange> still;
  for (EntryChange& change : unsynced_) {
    change.dirs.erase(std::remove(change.dirs.begin(), change.dirs.end(), norm), change.dirs.end());
    if (change.dirs.empty()) {
      MakeDurable(change);
    } else {
      still.push_back(std::move(change));
    }
  }
  unsynced_ = std::move(still);
  return absl::OkStatus();
}

// ---- Files ----

absl::Status FaultInjectionEnv::OnAppend(const std::string& path, WritableFile& base, absl::string_view data) {
  absl::MutexLock lock(&mu_);
  const Decision d = Check(FsOp::kAppend, path);
  if (!d.status.ok() && !d.short_io) return d.status;
  const absl::string_view written = d.short_io ? data.substr(0, data.size() / 2) : data;
  absl::Status s = base.Append(written);
  if (s.ok()) {
    auto it = files_.find(path);
    if (it != files_.end()) it->second.size += static_cast<int64_t>(written.size());
  }
  return d.status.ok() ? s : d.status;
}

absl::Status FaultInjectionEnv::OnSync(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kSync, path); !d.status.ok()) return d.status;
  auto it = files_.find(path);
  if (it != files_.end()) it->second.synced = it->second.size;
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::OnClose(const std::string& path, WritableFile& base) {
  absl::MutexLock lock(&mu_);
  const Decision d = Check(FsOp::kClose, path);
  absl::Status s = base.Close();  // the descriptor goes either way, as with close(2)
  return d.status.ok() ? s : d.status;
}

absl::StatusOr<int64_t> FaultInjectionEnv::OnRead(const RandomAccessFile& base, int64_t offset, char* dst, int64_t n) {
  absl::MutexLock lock(&mu_);
  const Decision d = Check(FsOp::kRead, base.path());
  if (!d.status.ok()) return d.status;
  return base.ReadUpTo(offset, dst, d.short_io ? n / 2 : n);
}

absl::StatusOr<int64_t> FaultInjectionEnv::OnSize(const RandomAccessFile& base) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kStat, base.path()); !d.status.ok()) return d.status;
  return base.Size();
}

absl::StatusOr<bool> FaultInjectionEnv::OnIsRegularFile(const RandomAccessFile& base) {
  absl::MutexLock lock(&mu_);
  if (Decision d = Check(FsOp::kStat, base.path()); !d.status.ok()) return d.status;
  return base.IsRegularFile();
}

}  // namespace muonshard::testing
