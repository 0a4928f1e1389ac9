#ifndef MUONSHARD_CLI_COMPLETION_H_
#define MUONSHARD_CLI_COMPLETION_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/flags.h"

namespace muonshard::cli {

// One command (or one subcommand of it) as shell completion sees it.
struct CompletionEntry {
  std::string command;
  std::string subcommand;  // "" when the command has none
  std::vector<FlagSet::Info> flags;
};

// A bash completion script for `program` (a function _<program> and its
// `complete -F` line): command names, subcommands, and each command's flags
// (hidden ones left out); a flag that takes a value completes file names.
// Built from `entries`, which the caller reads off the commands' FlagSets.
std::string BashCompletion(absl::string_view program, const std::vector<CompletionEntry>& entries);

}  // namespace muonshard::cli

#endif  // MUONSHARD_CLI_COMPLETION_H_
