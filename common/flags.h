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
// `-` and `_` are interchangeable in names. `--` ends the flags.
class FlagSet {
 public:
  explicit FlagSet(std::string usage) : usage_(std::move(usage)) {}

  void String(absl::string_view name, std::string* target, absl::string_view help);
  void Int(absl::string_view name, int64_t* target, absl::string_view help);
  void Int(absl::string_view name, int* target, absl::string_view help);
  void Double(absl::string_view name, double* target, absl::string_view help);
  void Bool(absl::string_view name, bool* target, absl::string_view help);
  // Repeatable flag: every occurrence is appended.
  void StringList(absl::string_view name, std::vector<std::string>* target,
                  absl::string_view help);

  // Parses args (without the program name); returns the positional arguments.
  // INVALID_ARGUMENT names the offending flag. `--help` sets help_requested().
  absl::StatusOr<std::vector<std::string>> Parse(const std::vector<std::string>& args);

  // True when the flag appeared on the command line.
  bool WasSet(absl::string_view name) const;
  bool help_requested() const { return help_requested_; }
  std::string Usage() const;

 private:
  struct Flag {
    std::string name;
    std::string help;
    std::string default_text;
    bool is_bool = false;
    bool set = false;
    std::function<absl::Status(absl::string_view)> assign;
  };
  void Add(absl::string_view name, absl::string_view help, std::string default_text,
           bool is_bool, std::function<absl::Status(absl::string_view)> assign);
  Flag* Find(absl::string_view name);
  const Flag* Find(absl::string_view name) const;

  std::string usage_;
  std::vector<Flag> flags_;
  bool help_requested_ = false;
};

// argv[1..] as strings.
std::vector<std::string> ArgsOf(int argc, char** argv);

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_FLAGS_H_
