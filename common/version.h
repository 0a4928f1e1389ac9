#ifndef MUONSHARD_COMMON_VERSION_H_
#define MUONSHARD_COMMON_VERSION_H_

#include <string>

#include "absl/strings/string_view.h"

namespace muonshard {

// The project's version: CMakeLists.txt's project(... VERSION ...).
absl::string_view ProjectVersion();

// The short git commit the build was configured from; "unknown" outside a
// git checkout (a tarball).
absl::string_view GitCommit();

// "muonshardctl 0.1.0 (git 1a2b3c4d5e6f)": what every binary's --version
// prints.
std::string VersionLine(absl::string_view program);

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_VERSION_H_
