#include "plan/name_scanner.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "re2/re2.h"

namespace muonshard::planner {
namespace {

// The literal a pattern stands for, if it is one.
std::optional<std::string> AsLiteral(absl::string_view p, bool* at_start, bool* at_end) {
  *at_start = absl::ConsumePrefix(&p, "^");
  *at_end = false;
  if (p.size() >= 2 && p.back() == '$' && p[p.size() - 2] != '\\') {
    *at_end = true;
    p.remove_suffix(1);
  }
  std::string out;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size() || absl::ascii_isalnum(p[i + 1])) return std::nullopt;  // \d, \w, ...
      out.push_back(p[++i]);
    } else if (absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '/' || c == ':' || c == ' ') {
      out.push_back(absl::ascii_tolower(c));
    } else {
      return std::nullopt;
    }
  }
  if (out.empty()) return std::nullopt;
  for (char& c : out) c = absl::ascii_tolower(c);
  return out;
}

// Whether any of the eight bytes is an ASCII digit: each byte XOR '0' is
// below 10 exactly for digits, and the has-less-than bit trick (exact for
// "any byte", not per byte) tests that.
bool HasDigitByte(uint64_t word) {
  constexpr uint64_t kOnes = 0x0101010101010101ULL;
  constexpr uint64_t kHigh = 0x8080808080808080ULL;
  const uint64_t x = word ^ (kOnes * '0');
  return ((x - kOnes * 10) & ~x & kHigh) != 0;
}

// The ordinal of the digit run that IndexAfter(name, token) would read, found
// on the name's skeleton (each digit run is one '0'); -1 if none. `token`
// holds no digit, so its occurrences and their neighbours are the same in
// the name and in its skeleton.
int RunAfter(absl::string_view skeleton, absl::string_view token) {
  size_t pos = 0;
  while ((pos = skeleton.find(token, pos)) != absl::string_view::npos) {
    const bool boundary = pos == 0 || skeleton[pos - 1] == '.';
    const size_t i = pos + token.size();
    if (boundary && i < skeleton.size() && skeleton[i] == '0' && (i + 1 == skeleton.size() || skeleton[i + 1] == '.')) {
      return static_cast<int>(std::count(skeleton.begin(), skeleton.begin() + i, '0'));
    }
    pos += token.size();
  }
  return -1;
}

}  // namespace

int IndexAfter(absl::string_view name, absl::string_view token) {
  size_t pos = 0;
  while ((pos = name.find(token, pos)) != absl::string_view::npos) {
    bool boundary = pos == 0 || name[pos - 1] == '.';
    size_t i = pos + token.size();
    if (boundary && i < name.size() && absl::ascii_isdigit(name[i])) {
      int64_t v = 0;
      while (i < name.size() && absl::ascii_isdigit(name[i]) && v < (1 << 30)) {
        v = v * 10 + (name[i] - '0');
        ++i;
      }
      if (i == name.size() || name[i] == '.') return static_cast<int>(v);
    }
    pos += token.size();
  }
  return -1;
}

bool IsExpertStackName(absl::string_view name) {
  size_t pos = 0;
  constexpr absl::string_view kToken = "experts.";
  while ((pos = name.find(kToken, pos)) != absl::string_view::npos) {
    bool boundary = pos == 0 || name[pos - 1] == '.';
    size_t i = pos + kToken.size();
    if (boundary && i < name.size() && !absl::ascii_isdigit(name[i])) return true;
    pos += kToken.size();
  }
  return false;
}

NameScanner::Facts NameScanner::Scan(absl::string_view name, bool need_excluded) {
  BuildSkeleton(name);
  SkeletonInfo& info = Lookup(name);
  Facts f;
  f.expert_stack = info.expert_stack;
  if (need_excluded) f.excluded = excludes_.digit_agnostic() ? info.excluded : excludes_.Matches(name);
  if (long_run_ || info.layer_run >= kMaxRuns || info.expert_run >= kMaxRuns) {
    f.layer = IndexAfter(name, "layers.");  // values past 9 digits: the parser's own limits
    f.expert = IndexAfter(name, "experts.");
  } else {
    f.layer = info.layer_run >= 0 ? run_value_[info.layer_run] : -1;
    f.expert = info.expert_run >= 0 ? run_value_[info.expert_run] : -1;
  }
  if (packable_ && !long_run_ && runs_ <= kMaxRuns) {
    f.duplicate = SeenDigits(info.digits);
  } else {
    f.duplicate = !unpacked_.insert(name).second;
  }
  return f;
}

// Whether this name's digits were seen under its skeleton; records them.
// Strictly increasing run values cannot repeat, so while they increase the
// packed digits are only kept, to fill the set should the order break.
bool NameScanner::SeenDigits(Digits& d) {
  if (d.ordered) {
    if (d.keys.empty() || std::lexicographical_compare(d.last.begin(), d.last.begin() + runs_, run_value_.begin(),
                                                       run_value_.begin() + runs_)) {
      std::copy(run_value_.begin(), run_value_.begin() + runs_, d.last.begin());
      d.keys.push_back(nibbles_);
      return false;
    }
    d.ordered = false;
    d.set.insert(d.keys.begin(), d.keys.end());
    d.keys = std::vector<uint64_t>();
  }
  return !d.set.insert(nibbles_).second;
}

// Fills skeleton_, the values of the first kMaxRuns digit runs, and the
// name's digits as nibbles (digit + 1, runs separated by 0xF; no nibble is
// 0, so with the skeleton fixing the run count the packing is injective).
void NameScanner::BuildSkeleton(absl::string_view name) {
  skeleton_.resize(name.size());
  n_ = 0;
  runs_ = 0;
  nibbles_ = 0;
  num_nibbles_ = 0;
  packable_ = true;
  long_run_ = false;
  size_t i = 0;
  // Eight bytes at a time while they hold no digit (most of a name: digit
  // runs are the layer and expert indices); byte by byte where one does.
  while (i + 8 <= name.size()) {
    uint64_t word;
    std::memcpy(&word, name.data() + i, sizeof(word));
    if (!HasDigitByte(word)) {
      std::memcpy(&skeleton_[n_], &word, sizeof(word));
      n_ += 8;
      i += 8;
      continue;
    }
    for (const size_t end = i + 8; i < end; ++i) AddChar(name, i);
  }
  for (; i < name.size(); ++i) AddChar(name, i);
  skeleton_.resize(n_);
}

// Manifests repeat a short cycle of skeletons (an expert's gate, up and
// down projections, then the next expert's), so the last few are compared
// before the table is hashed.
NameScanner::SkeletonInfo& NameScanner::Lookup(absl::string_view name) {
  for (const Recent& r : recent_) {
    if (r.index != Recent::kNone && r.skeleton == skeleton_) return infos_[r.index];
  }
  auto [it, inserted] = memo_.try_emplace(skeleton_, static_cast<uint32_t>(infos_.size()));
  if (inserted) {
    SkeletonInfo& info = infos_.emplace_back();
    info.layer_run = RunAfter(skeleton_, "layers.");
    info.expert_run = RunAfter(skeleton_, "experts.");
    info.expert_stack = IsExpertStackName(skeleton_);
    if (excludes_.digit_agnostic()) info.excluded = excludes_.Matches(name);
  }
  Recent& slot = recent_[next_recent_];
  next_recent_ = (next_recent_ + 1) % recent_.size();
  slot.skeleton = skeleton_;
  slot.index = it->second;
  return infos_[it->second];
}

absl::StatusOr<ExcludeMatcher> ExcludeMatcher::Create(const std::vector<std::string>& patterns) {
  ExcludeMatcher m;
  std::vector<std::string> regexes;
  for (const std::string& p : patterns) {
    RE2 re(p, RE2::Quiet);
    if (!re.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("policy.muon_exclude_patterns: \"", p, "\" is not a valid regex: ", re.error()));
    }
    Literal lit;
    if (auto text = AsLiteral(p, &lit.at_start, &lit.at_end)) {
      lit.lower = *std::move(text);
      for (char c : lit.lower) m.digit_free_ = m.digit_free_ && !absl::ascii_isdigit(c);
      m.literals_.push_back(std::move(lit));
    } else {
      regexes.push_back(absl::StrCat("(?:", p, ")"));
    }
  }
  m.by_first_char_.resize(256);
  for (size_t k = 0; k < m.literals_.size(); ++k) {
    m.by_first_char_[static_cast<unsigned char>(m.literals_[k].lower[0])].push_back(static_cast<int>(k));
  }
  if (!regexes.empty()) {
    RE2::Options options;
    options.set_case_sensitive(false);
    options.set_log_errors(false);
    m.regex_ = std::make_shared<const RE2>(absl::StrJoin(regexes, "|"), options);
  }
  return m;
}

bool ExcludeMatcher::Matches(absl::string_view name) const {
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char first = static_cast<unsigned char>(absl::ascii_tolower(name[i]));
    for (int k : by_first_char_[first]) {
      const Literal& l = literals_[k];
      if (l.at_start && i != 0) continue;
      if (name.size() - i < l.lower.size()) continue;
      if (l.at_end && name.size() - i != l.lower.size()) continue;
      if (absl::EqualsIgnoreCase(name.substr(i, l.lower.size()), l.lower)) return true;
    }
  }
  return regex_ != nullptr && RE2::PartialMatch(re2::StringPiece(name.data(), name.size()), *regex_);
}

}  // namespace muonshard::planner
