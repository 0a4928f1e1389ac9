#include "common/flags.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/quote.h"

namespace muonshard {
namespace {

// Flag names a message may print as they are; anything else is quoted.
constexpr size_t kMaxPlainName = 64;

std::string Normalize(absl::string_view name) { return absl::StrReplaceAll(name, {{"_", "-"}}); }

bool IsPlainName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxPlainName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

// "--polcy", or the quoted, bounded form of a name a terminal should not
// see raw (binary, or huge).
std::string Spelled(absl::string_view dashes, absl::string_view name) {
  std::string spelled = absl::StrCat(dashes, name);
  return IsPlainName(name) ? spelled : QuoteBounded(spelled);
}

// Optimal string alignment distance (Levenshtein plus adjacent
// transpositions).
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// A negative number ("-1", "-0.5") is an argument, not a flag.
bool IsNegativeNumber(absl::string_view arg) {
  return arg.size() >= 2 && arg[0] == '-' && (absl::ascii_isdigit(static_cast<unsigned char>(arg[1])) || arg[1] == '.');
}

}  // namespace

std::string ClosestMatch(absl::string_view typed, const std::vector<std::string>& candidates) {
  std::vector<const std::string*> extensions;  // candidates `typed` is a prefix of
  if (typed.size() >= 2) {
    for (const std::string& c : candidates) {
      if (absl::StartsWith(c, typed)) extensions.push_back(&c);
    }
  }
  if (extensions.size() == 1) return *extensions[0];
  const size_t max_distance = std::min<size_t>(2, typed.size() / 2);
  std::string best;
  size_t best_distance = max_distance + 1;
  for (const std::string& c : candidates) {
    const size_t gap = c.size() > typed.size() ? c.size() - typed.size() : typed.size() - c.size();
    if (gap > max_distance) continue;  // also keeps huge inputs cheap
    const size_t d = EditDistance(typed, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

void FlagSet::Add(absl::string_view name, absl::string_view help, std::string default_text, bool is_bool,
                  std::function<absl::Status(absl::string_view)> assign) {
  Flag f;
  f.name = Normalize(name);
  f.help = std::string(help);
  f.default_text = std::move(default_text);
  f.is_bool = is_bool;
  f.assign = std::move(assign);
  flags_.push_back(std::move(f));
}

void FlagSet::String(absl::string_view name, std::string* target, absl::string_view help) {
  Add(name, help, *target, false, [target](absl::string_view v) {
    *target = std::string(v);
    return absl::OkStatus();
  });
}

void FlagSet::Int(absl::string_view name, int64_t* target, absl::string_view help) {
  std::string n(name);
  Add(name, help, absl::StrCat(*target), false, [target, n](absl::string_view v) {
    if (!absl::SimpleAtoi(v, target)) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", Normalize(n), ": ", QuoteBounded(v), " is not an integer"));
    }
    return absl::OkStatus();
  });
}

void FlagSet::Int(absl::string_view name, int* target, absl::string_view help) {
  std::string n(name);
  Add(name, help, absl::StrCat(*target), false, [target, n](absl::string_view v) {
    if (!absl::SimpleAtoi(v, target)) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", Normalize(n), ": ", QuoteBounded(v), " is not a 32-bit integer"));
    }
    return absl::OkStatus();
  });
}

void FlagSet::Double(absl::string_view name, double* target, absl::string_view help) {
  std::string n(name);
  Add(name, help, absl::StrCat(*target), false, [target, n](absl::string_view v) {
    if (!absl::SimpleAtod(v, target)) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", Normalize(n), ": ", QuoteBounded(v), " is not a number"));
    }
    return absl::OkStatus();
  });
}

void FlagSet::Bool(absl::string_view name, bool* target, absl::string_view help) {
  std::string n(name);
  Add(name, help, *target ? "true" : "false", true, [target, n](absl::string_view v) {
    if (!absl::SimpleAtob(v, target)) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", Normalize(n), ": ", QuoteBounded(v), " is not a boolean"));
    }
    return absl::OkStatus();
  });
}

void FlagSet::StringList(absl::string_view name, std::vector<std::string>* target, absl::string_view help) {
  Add(name, help, absl::StrJoin(*target, ","), false, [target](absl::string_view v) {
    target->emplace_back(v);
    return absl::OkStatus();
  });
}

void FlagSet::Required(absl::string_view name) {
  if (Flag* f = Find(name); f != nullptr) f->required = true;
}

void FlagSet::Alias(absl::string_view old_name, absl::string_view name) {
  const Flag* target = Find(name);
  if (target == nullptr) return;
  Flag f;
  f.name = Normalize(old_name);
  f.alias_of = static_cast<int>(target - flags_.data());
  f.is_bool = target->is_bool;
  f.deprecation = absl::StrCat("use --", target->name);
  flags_.push_back(std::move(f));
}

void FlagSet::Deprecate(absl::string_view name, absl::string_view advice) {
  if (Flag* f = Find(name); f != nullptr) f->deprecation = std::string(advice);
}

void FlagSet::Hide(absl::string_view name) {
  if (Flag* f = Find(name); f != nullptr) f->hidden = true;
}

FlagSet::Flag* FlagSet::Find(absl::string_view name) {
  std::string n = Normalize(name);
  for (Flag& f : flags_) {
    if (f.name == n) return &f;
  }
  return nullptr;
}

const FlagSet::Flag* FlagSet::Find(absl::string_view name) const { return const_cast<FlagSet*>(this)->Find(name); }

bool FlagSet::WasSet(absl::string_view name) const {
  const Flag* f = Find(name);
  return f != nullptr && f->set;
}

absl::Status FlagSet::UnknownFlag(absl::string_view dashes, absl::string_view name) const {
  std::string message = absl::StrCat("unknown flag ", Spelled(dashes, name));
  if (!IsPlainName(name)) return absl::InvalidArgumentError(message);
  // Visible names, and aliases standing for the names they set.
  std::vector<std::string> names = {"help"};
  std::vector<std::string> shown = {"help"};
  for (const Flag& f : flags_) {
    if ((!f.deprecation.empty() && f.alias_of < 0) || f.hidden) continue;
    names.push_back(f.name);
    shown.push_back(f.alias_of < 0 ? f.name : flags_[f.alias_of].name);
  }
  const std::string near = ClosestMatch(Normalize(name), names);
  for (size_t i = 0; i < names.size() && !near.empty(); ++i) {
    if (names[i] != near) continue;
    absl::StrAppend(&message, " (did you mean --", shown[i], "?)");
    break;
  }
  return absl::InvalidArgumentError(message);
}

absl::StatusOr<FlagSet::Flag*> FlagSet::Resolve(absl::string_view name) {
  Flag* flag = Find(name);
  if (flag == nullptr) return UnknownFlag("--", name);
  if (!flag->deprecation.empty()) {
    warnings_.push_back(absl::StrCat("flag --", flag->name, " is deprecated: ", flag->deprecation));
  }
  if (flag->alias_of >= 0) flag = &flags_[flag->alias_of];
  return flag;
}

absl::Status FlagSet::CheckRequired() const {
  std::vector<std::string> missing;
  for (const Flag& f : flags_) {
    if (f.required && !f.set) missing.push_back(absl::StrCat("--", f.name));
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      missing.size() == 1 ? "missing required flag " : "missing required flags ", absl::StrJoin(missing, ", ")));
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  warnings_.clear();
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--") {
      positional.insert(positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-' || IsNegativeNumber(arg)) {
      positional.emplace_back(arg);
      continue;
    }
    if (arg[1] != '-') {  // -w, -world-size: one dash is a typo
      arg.remove_prefix(1);
      return UnknownFlag("-", arg.substr(0, arg.find('=')));
    }
    arg.remove_prefix(2);
    absl::string_view name = arg;
    absl::string_view value;
    bool has_value = false;
    if (auto eq = arg.find('='); eq != absl::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    if (name == "help") {
      help_requested_ = true;
      continue;
    }
    if (name == "version" && Find(name) == nullptr) {
      version_requested_ = true;
      continue;
    }
    absl::StatusOr<Flag*> resolved = Resolve(name);
    if (!resolved.ok()) return resolved.status();
    Flag* flag = *resolved;
    if (!has_value) {
      if (flag->is_bool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", flag->name, " needs a value"));
      }
    }
    absl::Status s = flag->assign(value);
    if (!s.ok()) return s;
    flag->set = true;
  }
  if (help_requested_ || version_requested_) return positional;
  if (absl::Status s = CheckRequired(); !s.ok()) return s;
  return positional;
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat(usage_, "\n\nFlags:\n");
  for (const Flag& f : flags_) {
    if (!f.deprecation.empty() || f.hidden) continue;
    absl::StrAppend(&out, "  --", f.name, f.is_bool ? "" : " VALUE", "\n      ", f.help);
    if (f.required) {
      absl::StrAppend(&out, " (required)");
    } else if (!f.default_text.empty() && !absl::StrContains(f.help, "(default")) {  // the help may say it better
      absl::StrAppend(&out, " (default: ", f.default_text, ")");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string FlagSet::CommandName() const {
  absl::string_view line = usage_;
  line = line.substr(0, line.find('\n'));
  if (!absl::ConsumePrefix(&line, "usage: ")) return "";
  std::vector<absl::string_view> words;
  for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    const bool lower_word =
        absl::ascii_islower(static_cast<unsigned char>(word[0])) && std::all_of(word.begin(), word.end(), [](char c) {
          return absl::ascii_islower(static_cast<unsigned char>(c)) ||
                 absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '_';
        });
    if (!lower_word) break;
    words.push_back(word);
  }
  return absl::StrJoin(words, " ");
}

std::string FlagSet::UsageHint() const {
  const std::string name = CommandName();
  if (name.empty()) return "run with --help for usage";
  return absl::StrCat("run '", name, " --help' for usage");
}

std::vector<FlagSet::Info> FlagSet::Describe() const {
  std::vector<Info> out;
  for (const Flag& f : flags_) {
    Info info;
    info.name = f.name;
    info.help = f.help;
    info.is_bool = f.is_bool;
    info.required = f.required;
    info.hidden = !f.deprecation.empty() || f.hidden;
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<std::string> ArgsOf(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return args;
}

}  // namespace muonshard
