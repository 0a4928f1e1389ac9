#include "common/version.h"

#include "absl/strings/str_cat.h"

// Set by common/CMakeLists.txt on this file alone, so that a new commit
// recompiles one file.
#ifndef MUONSHARD_VERSION
#define MUONSHARD_VERSION "0.0.0"
#endif
#ifndef MUONSHARD_GIT_COMMIT
#define MUONSHARD_GIT_COMMIT "unknown"
#endif

namespace muonshard {

absl::string_view ProjectVersion() { return MUONSHARD_VERSION; }

absl::string_view GitCommit() { return MUONSHARD_GIT_COMMIT; }

std::string VersionLine(absl::string_view program) {
  return absl::StrCat(program, " ", ProjectVersion(), " (git ", GitCommit(), ")");
}

}  // namespace muonshard
