// muonshardctl: plans, manifests and (with --coordinator) the running service.
//
// `muonshardctl [flags] COMMAND [flags]`: flags before the command are the
// command's, moved after it (kubectl's global flags); the connection flags
// also come from the environment (client::kEnvironmentFlags).
#include <algorithm>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/cli_common.h"
#include "cli/commands.h"
#include "cli/completion.h"
#include "cli/simulate_command.h"
#include "client/coordinator_client.h"
#include "common/flags.h"
#include "common/quote.h"
#include "common/version.h"

namespace muonshard::cli {
namespace {

constexpr char kProgram[] = "muonshardctl";

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
  // Words the first argument must be (subcommands), or nullptr;
  // nullptr-terminated.
  const char* const* subcommands;
};

int RunVersion(const std::vector<std::string>& args);
int RunCompletion(const std::vector<std::string>& args);

constexpr const char* kCkptSubcommands[] = {"inspect", nullptr};
constexpr const char* kShells[] = {"bash", nullptr};

constexpr Command kCommands[] = {
    {"plan", "compute a partition plan locally and print it", RunPlan, nullptr},
    {"import-hf", "build a manifest from a HuggingFace config.json", RunImportHf, nullptr},
    {"import-safetensors", "build a manifest from a safetensors checkpoint's headers", RunImportSafetensors, nullptr},
    {"compare", "seed vs balanced plans of a manifest, side by side", RunCompare, nullptr},
    {"simulate", "predict a plan's optimizer step on a cluster (table, JSON, SVG)", RunSimulate, nullptr},
    {"submit", "submit a plan request to the coordinator", RunSubmit, nullptr},
    {"get", "print a stored plan, or one rank's view", RunGet, nullptr},
    {"list", "list the coordinator's plan versions", RunList, nullptr},
    {"watch", "stream new plan versions and job events", RunWatch, nullptr},
    {"diff", "tensors that change owner or slice between two versions", RunDiff, nullptr},
    {"workers", "list jobs and their workers", RunWorkers, nullptr},
    {"health", "check the coordinator's grpc.health.v1 status", RunHealth, nullptr},
    {"ckpt", "inspect a sharded checkpoint: summary and integrity check", RunCkpt, kCkptSubcommands},
    {"reshard", "reshard a checkpoint to another topology (or --dry-run)", RunReshard, nullptr},
    {"completion", "print a shell completion script (completion bash)", RunCompletion, kShells},
    {"version", "print the version", RunVersion, nullptr},
};

const Command* FindCommand(const std::string& name) {
  for (const Command& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

bool IsSubcommand(const Command& c, const std::string& word) {
  for (const char* const* s = c.subcommands; s != nullptr && *s != nullptr; ++s) {
    if (word == *s) return true;
  }
  return false;
}

void PrintUsage(std::ostream& out) {
  size_t width = 0;
  for (const Command& c : kCommands) width = std::max(width, std::string(c.name).size());
  out << "usage: muonshardctl [flags] COMMAND [flags]\n\nCommands:\n";
  for (const Command& c : kCommands) out << absl::StrFormat("  %-*s  %s\n", width, c.name, c.summary);
  out << "\nFlags belong to a command and may also come before it: `muonshardctl --coordinator H list`\n"
         "is `muonshardctl list --coordinator H`. --help prints a command's flags, --version the version.\n"
         "\nEnvironment (a flag given wins):\n";
  for (const client::EnvironmentFlag& e : client::kEnvironmentFlags) {
    out << absl::StrFormat("  %-22s --%s\n", e.variable, e.flag);
  }
  out << "\nRun 'muonshardctl COMMAND --help' for a command's flags.\n";
}

// ---- what the commands take, read off their FlagSets

// The flags of `c` (after `subcommand`, if it has them), from its FlagSet.
std::vector<FlagSet::Info> DescribeCommand(const Command& c, const char* subcommand) {
  std::vector<FlagSet::Info> flags;
  ScopedFlagSetObserver observer([&flags](const FlagSet& set) { flags = set.Describe(); });
  std::vector<std::string> args;
  if (subcommand != nullptr) args.emplace_back(subcommand);
  c.run(args);
  return flags;
}

std::vector<CompletionEntry> DescribeAll() {
  std::vector<CompletionEntry> entries;
  for (const Command& c : kCommands) {
    if (c.subcommands == nullptr) {
      entries.push_back({c.name, "", DescribeCommand(c, nullptr)});
      continue;
    }
    for (const char* const* s = c.subcommands; *s != nullptr; ++s) {
      entries.push_back({c.name, *s, DescribeCommand(c, *s)});
    }
  }
  return entries;
}

// Names of the flags that take a value in some command.
std::set<std::string> ValueFlagNames() {
  std::set<std::string> names;
  for (const CompletionEntry& e : DescribeAll()) {
    for (const FlagSet::Info& f : e.flags) {
      if (!f.is_bool) names.insert(f.name);
    }
  }
  return names;
}

// ---- global flags: before the command

struct Invocation {
  std::vector<std::string> leading;  // flags (and their values) before the command
  const Command* command = nullptr;
  std::string command_word;  // as typed; empty when none was given
  std::vector<std::string> rest;
};

// Whether `flag` ("--name" without "=value") takes the next argument: a flag
// some command takes a value for does; an unknown one does unless the next
// argument is a command (the command then reports the flag).
bool TakesValue(const std::string& flag, const std::string& next, const std::set<std::string>& value_flags) {
  if (flag.rfind("--", 0) != 0 || flag.find('=') != std::string::npos) return FindCommand(next) == nullptr;
  const std::string name = flag.substr(2);
  if (name == "help") return false;
  if (value_flags.count(name) > 0) return true;
  return FindCommand(next) == nullptr;
}

Invocation SplitInvocation(const std::vector<std::string>& args) {
  Invocation inv;
  std::set<std::string> value_flags;
  size_t i = 0;
  if (!args.empty() && args[0].size() > 1 && args[0][0] == '-') value_flags = ValueFlagNames();
  for (; i < args.size() && args[i].size() > 1 && args[i][0] == '-' && args[i] != "--"; ++i) {
    inv.leading.push_back(args[i]);
    const bool bare =
        args[i].find('=') == std::string::npos && args[i] != "-h" && args[i] != "--help" && args[i] != "--version";
    if (bare && i + 1 < args.size() && TakesValue(args[i], args[i + 1], value_flags)) {
      inv.leading.push_back(args[++i]);
    }
  }
  if (i == args.size()) return inv;
  inv.command_word = args[i];
  inv.command = FindCommand(args[i]);
  inv.rest.assign(args.begin() + i + 1, args.end());
  return inv;
}

// The command's arguments: the leading flags go right after the command (and
// its subcommand), before anything else, so a later `--` still ends them.
std::vector<std::string> CommandArgs(const Invocation& inv) {
  std::vector<std::string> out = inv.rest;
  size_t at = 0;
  if (!out.empty() && IsSubcommand(*inv.command, out[0])) at = 1;
  out.insert(out.begin() + at, inv.leading.begin(), inv.leading.end());
  return out;
}

bool Contains(const std::vector<std::string>& v, const char* word) {
  return std::find(v.begin(), v.end(), word) != v.end();
}

int UnknownCommand(const std::string& word) {
  std::vector<std::string> names;
  for (const Command& c : kCommands) names.emplace_back(c.name);
  std::cerr << "error: unknown command " << QuoteBounded(word);
  if (std::string near = ClosestMatch(word, names); !near.empty()) std::cerr << " (did you mean \"" << near << "\"?)";
  std::cerr << "\nrun 'muonshardctl --help' for usage\n";
  return kExitUsage;
}

int NoCommand(const Invocation& inv) {
  if (Contains(inv.leading, "--help") || Contains(inv.leading, "-h")) {
    PrintUsage(std::cout);
    return kExitOk;
  }
  if (Contains(inv.leading, "--version")) return RunVersion({});
  std::cerr << "error: no command given\nrun 'muonshardctl --help' for usage\n";
  return kExitUsage;
}

// ---- version, completion

int RunVersion(const std::vector<std::string>& args) {
  FlagSet flags("usage: muonshardctl version\nPrints the version and the git commit it was built from.");
  std::vector<std::string> positional;
  if (int rc = ParseFlagsOrExit(flags, args, &positional); rc >= 0) return rc;
  if (!positional.empty()) return UsageError(flags, "version takes no arguments");
  std::cout << VersionLine(kProgram) << "\n";
  return kExitOk;
}

int RunCompletion(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl completion bash\n"
      "Prints a bash completion script of the commands and their flags. Load it with\n"
      "  source <(muonshardctl completion bash)");
  std::vector<std::string> positional;
  if (int rc = ParseFlagsOrExit(flags, args, &positional); rc >= 0) return rc;
  if (positional.size() != 1 || positional[0] != "bash") {
    return UsageError(flags, "completion takes one shell: bash");
  }
  std::cout << BashCompletion(kProgram, DescribeAll());
  return kExitOk;
}

int Main(const std::vector<std::string>& args) {
  if (args.empty()) {
    PrintUsage(std::cerr);
    return kExitUsage;
  }
  if (args[0] == "--version") return RunVersion({});
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    if (args[0] == "help" && args.size() > 1 && FindCommand(args[1]) != nullptr) {
      return FindCommand(args[1])->run({"--help"});
    }
    PrintUsage(std::cout);
    return kExitOk;
  }
  const Invocation inv = SplitInvocation(args);
  if (inv.command_word.empty()) return NoCommand(inv);
  if (inv.command == nullptr) return UnknownCommand(inv.command_word);
  return inv.command->run(CommandArgs(inv));
}

}  // namespace
}  // namespace muonshard::cli

int main(int argc, char** argv) { return muonshard::cli::Main(std::vector<std::string>(argv + 1, argv + argc)); }
