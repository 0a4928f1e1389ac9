#include "common/file_util.h"

#include "common/env.h"

namespace muonshard {

absl::StatusOr<std::string> ReadFile(const std::string& path) { return Env::Default()->ReadFileToString(path); }

absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents) {
  return WriteFileAtomic(Env::Default(), path, contents);
}

absl::Status SyncDirectory(const std::string& dir) { return Env::Default()->SyncDir(dir); }

}  // namespace muonshard
