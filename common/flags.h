#ifndef MUONSHARD_COMMON_FLAGS_H_
#define MUONSHARD_COMMON_FLAGS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonshard {

// Command-line flags for the project's binaries. absl/flags was not used: its
// flag names cannot contain '-' (the documented CLI spells `--world-size`),
// flags are process-global (each muonshardctl subcommand has its own set),
// and it exits with status 1 on bad usage where the house rule is 2.
//
// Accepts `--name value`, `--name=value`, and for booleans `--name` alone;
// `-` and `_` are interchangeable in names. `--` ends the flags. `--help`
// and `-h` ask for the usage; `--version` asks for the version unless the
// set has a flag of that name. Any other argument starting with a single
// '-' is an unknown flag (`-w 4` is a typo, not two positional arguments),
// except "-" itself and negative numbers.
class FlagSet {
 public:
  explicit FlagSet(std::string usage) : usage_(std::move(usage)) {}

  void String(absl::string_view name, std::string* target, absl::string_view help);
  void Int(absl::string_view name, int64_t* target, absl::string_view help);
  void Int(absl::string_view name, int* target, absl::string_view help);
  void Double(absl::string_view name, double* target, absl::string_view help);
  void Bool(absl::string_view name, bool* target, absl::string_view help);
  // Repeatable flag: every occurrence is appended.
  void StringList(absl::string_view name, std::vector<std::string>* target, absl::string_view help);

  // Marks the registered flag `name` required: Parse fails with "missing
  // required flag --name" when it is absent (unless --help was given), and
  // the usage says "(required)" instead of its default.
  void Required(absl::string_view name);
  // `old_name` as a hidden, deprecated spelling of the registered flag
  // `name`: it sets that flag and adds a warning (warnings()).
  void Alias(absl::string_view old_name, absl::string_view name);
  // Hides the registered flag `name` from the usage and completions; using
  // it adds the warning "flag --name is deprecated: <advice>".
  void Deprecate(absl::string_view name, absl::string_view advice);
  // Hides the registered flag `name` from the usage, completions and
  // suggestions: a shared flag a command takes only to refuse it.
  void Hide(absl::string_view name);

  // Parses args (without the program name); returns the positional arguments.
  // INVALID_ARGUMENT names the offending flag; an unknown one comes with the
  // closest registered name ("did you mean --policy?"). `--help` sets
  // help_requested(), `--version` version_requested().
  absl::StatusOr<std::vector<std::string>> Parse(const std::vector<std::string>& args);

  // True when the flag appeared on the command line (or an alias of it).
  bool WasSet(absl::string_view name) const;
  bool help_requested() const { return help_requested_; }
  bool version_requested() const { return version_requested_; }
  // One line per deprecated spelling the last Parse met, for stderr.
  const std::vector<std::string>& warnings() const { return warnings_; }
  // The usage line and each visible flag: its help, then "(required)" or its
  // default (unless the help gives one itself).
  std::string Usage() const;
  // The command the usage line names: its words after "usage: " up to the
  // first that is not a lowercase word (a flag, a placeholder, "["), e.g.
  // "muonshardctl ckpt inspect"; "" when the usage has no such line.
  std::string CommandName() const;
  // "run 'muonshardctl plan --help' for usage": what follows a usage error.
  std::string UsageHint() const;

  // A registered flag as completions and help generators see it.
  struct Info {
    std::string name;  // without "--"
    std::string help;
    bool is_bool = false;
    bool required = false;
    bool hidden = false;  // a deprecated spelling
  };
  std::vector<Info> Describe() const;

 private:
  struct Flag {
    std::string name;
    std::string help;
    std::string default_text;
    bool is_bool = false;
    bool set = false;
    bool required = false;
    std::string deprecation;  // non-empty: hidden, warns when used
    bool hidden = false;      // Hide(): not shown, not suggested
    int alias_of = -1;        // index into flags_ of the flag this one sets
    std::function<absl::Status(absl::string_view)> assign;
  };
  void Add(absl::string_view name, absl::string_view help, std::string default_text, bool is_bool,
           std::function<absl::Status(absl::string_view)> assign);
  Flag* Find(absl::string_view name);
  const Flag* Find(absl::string_view name) const;
  // The flag an argument names, its alias resolved; warns for deprecated
  // spellings. INVALID_ARGUMENT for an unknown name.
  absl::StatusOr<Flag*> Resolve(absl::string_view name);
  absl::Status UnknownFlag(absl::string_view dashes, absl::string_view name) const;
  absl::Status CheckRequired() const;

  std::string usage_;
  std::vector<Flag> flags_;
  bool help_requested_ = false;
  bool version_requested_ = false;
  std::vector<std::string> warnings_;
};

// What `typed` was probably meant to be: the one candidate it is a prefix of
// (at least 2 characters typed), else the candidate closest by edit distance
// (insertions, deletions, substitutions, transpositions) if within
// min(2, |typed| / 2), else "".
std::string ClosestMatch(absl::string_view typed, const std::vector<std::string>& candidates);

// argv[1..] as strings.
std::vector<std::string> ArgsOf(int argc, char** argv);

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_FLAGS_H_
