#include "common/flags.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/quote.h"

namespace muonshard {
namespace {

std::string Normalize(absl::string_view name) {
  return absl::StrReplaceAll(name, {{"_", "-"}});
}

}  // namespace

void FlagSet::Add(absl::string_view name, absl::string_view help, std::string default_text,
                  bool is_bool, std::function<absl::Status(absl::string_view)> assign) {
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

void FlagSet::StringList(absl::string_view name, std::vector<std::string>* target,
                         absl::string_view help) {
  Add(name, help, absl::StrJoin(*target, ","), false, [target](absl::string_view v) {
    target->emplace_back(v);
    return absl::OkStatus();
  });
}

FlagSet::Flag* FlagSet::Find(absl::string_view name) {
  std::string n = Normalize(name);
  for (Flag& f : flags_) {
    if (f.name == n) return &f;
  }
  return nullptr;
}

const FlagSet::Flag* FlagSet::Find(absl::string_view name) const {
  return const_cast<FlagSet*>(this)->Find(name);
}

bool FlagSet::WasSet(absl::string_view name) const {
  const Flag* f = Find(name);
  return f != nullptr && f->set;
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(
    const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--") {
      positional.insert(positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 3 || arg.substr(0, 2) != "--") {
      positional.emplace_back(arg);
      continue;
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
    Flag* flag = Find(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", QuoteBounded(absl::StrCat("--", name))));
    }
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
  return positional;
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat(usage_, "\n\nFlags:\n");
  for (const Flag& f : flags_) {
    absl::StrAppend(&out, "  --", f.name, f.is_bool ? "" : " VALUE", "\n      ", f.help);
    if (!f.default_text.empty()) absl::StrAppend(&out, " (default: ", f.default_text, ")");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::vector<std::string> ArgsOf(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return args;
}

}  // namespace muonshard
