#ifndef MUONSHARD_COMMON_FILE_UTIL_H_
#define MUONSHARD_COMMON_FILE_UTIL_H_

// Whole-file helpers on Env::Default() (common/env.h), for callers that
// need no other file system.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonshard {

// Whole-file read; NOT_FOUND when missing, naming the path.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes atomically: temp file in the same directory, fsync, rename, fsync of
// the directory. A crash leaves either the old or the new content.
absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents);

// fsync of a directory (after renames inside it).
absl::Status SyncDirectory(const std::string& dir);

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_FILE_UTIL_H_
