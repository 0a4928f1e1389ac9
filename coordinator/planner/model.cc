#include "coordinator/planner/model.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "re2/re2.h"

namespace muonshard::planner {
namespace {

constexpr int kMaxDims = 8;
// Largest element count we accept: 12 bytes of optimizer state per element
// must still fit an int64 byte count with room for sums across tensors.
constexpr int64_t kMaxNumel = int64_t{1} << 50;

absl::Status TensorError(const v1::TensorSpec& t, int index, absl::string_view what) {
  if (t.name().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor #", index, ": ", what));
  }
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name(), "\": ", what));
}

// Parses the integer after `token` where token starts the name or follows a
// '.', e.g. IndexAfter("model.layers.12.mlp", "layers.") == 12. -1 if absent.
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

// A fused expert stack: "experts." followed by a non-index, e.g.
// "model.layers.0.mlp.experts.gate_up_proj" with shape [E, ...].
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

// Appends name[i] to the skeleton at n (a digit run becomes one '0');
// returns the new length.
size_t AppendSkeletonChar(absl::string_view name, size_t i, std::string& skeleton, size_t n) {
  const bool digit = absl::ascii_isdigit(name[i]);
  if (!digit || i == 0 || !absl::ascii_isdigit(name[i - 1])) skeleton[n++] = digit ? '0' : name[i];
  return n;
}

// excludes.Matches(name), memoised by the name's digit skeleton when the
// patterns allow it.
bool ExcludedMemo(const ExcludeMatcher& excludes, absl::string_view name,
                  absl::flat_hash_map<std::string, bool>& memo, std::string& skeleton) {
  if (!excludes.digit_agnostic()) return excludes.Matches(name);
  skeleton.resize(name.size());
  size_t n = 0;
  size_t i = 0;
  // Eight bytes at a time while they hold no digit (most of a name: digit
  // runs are the layer and expert indices); byte by byte where one does.
  while (i + 8 <= name.size()) {
    uint64_t word;
    std::memcpy(&word, name.data() + i, sizeof(word));
    if (!HasDigitByte(word)) {
      std::memcpy(&skeleton[n], &word, sizeof(word));
      n += 8;
      i += 8;
      continue;
    }
    for (const size_t end = i + 8; i < end; ++i) n = AppendSkeletonChar(name, i, skeleton, n);
  }
  for (; i < name.size(); ++i) n = AppendSkeletonChar(name, i, skeleton, n);
  skeleton.resize(n);
  auto [it, inserted] = memo.try_emplace(skeleton, false);
  if (inserted) it->second = excludes.Matches(name);
  return it->second;
}

// Shape, dtype and optimizer checks of one tensor; fills numel/esize/shape view.
absl::Status CheckTensor(const v1::TensorSpec& t, int index, ResolvedTensor* out) {
  if (t.name().empty()) return TensorError(t, index, "name is empty");
  if (t.shape_size() == 0) return TensorError(t, index, "shape is empty");
  if (t.shape_size() > kMaxDims) {
    return TensorError(t, index, absl::StrCat("shape has ", t.shape_size(), " dimensions, at most ", kMaxDims,
                                              " are supported"));
  }
  int64_t numel = 1;
  for (int d = 0; d < t.shape_size(); ++d) {
    int64_t dim = t.shape(d);
    if (dim == 0) return TensorError(t, index, "shape has a 0 dimension");
    if (dim < 0) return TensorError(t, index, absl::StrCat("shape has a negative dimension (", dim, ")"));
    if (numel > kMaxNumel / dim) {
      return TensorError(t, index, absl::StrCat("element count overflows (more than 2^50 elements)"));
    }
    numel *= dim;
  }
  if (t.dtype() == v1::DTYPE_UNSPECIFIED) return TensorError(t, index, "dtype is missing");
  out->esize = DTypeSize(t.dtype());
  if (out->esize == 0) {
    return TensorError(t, index, absl::StrCat("unknown dtype ", static_cast<int>(t.dtype()),
                                              " (expected BF16, FP16 or FP32)"));
  }
  if (!v1::Optimizer_IsValid(t.optimizer())) {
    return TensorError(t, index, absl::StrCat("unknown optimizer ", static_cast<int>(t.optimizer())));
  }
  if (!v1::Layout_IsValid(t.layout())) {
    return TensorError(t, index, absl::StrCat("unknown layout ", static_cast<int>(t.layout())));
  }
  if (t.optimizer() == v1::MUON && t.shape_size() != 2 && t.shape_size() != 3) {
    return TensorError(t, index, absl::StrCat("optimizer MUON needs a 2-D or 3-D tensor, shape has ",
                                              t.shape_size(), " dimensions"));
  }
  if (t.has_expert() && t.expert() < 0) {
    return TensorError(t, index, absl::StrCat("expert must be >= 0, got ", t.expert()));
  }
  out->dtype = t.dtype();
  out->numel = numel;
  out->layout = t.layout() == v1::IN_OUT ? v1::IN_OUT : v1::OUT_IN;
  int n = t.shape_size();
  out->rows = n >= 2 ? t.shape(n - 2) : 1;
  out->cols = t.shape(n - 1);
  out->matrices = static_cast<int>(n == 3 ? t.shape(0) : 1);
  return absl::OkStatus();
}

// Stage of every tensor: explicit, else from "layers.N" in contiguous equal
// blocks, else the stage of the closest preceding layered tensor (embedding
// -> first stage; final norm and lm_head -> last).
absl::Status AssignStages(const v1::ModelManifest& m, const RankLayout& layout,
                          std::vector<ResolvedTensor>* tensors) {
  std::vector<int> layer(m.tensors_size(), -1);
  int num_layers = 0;
  for (int i = 0; i < m.tensors_size(); ++i) {
    layer[i] = IndexAfter(m.tensors(i).name(), "layers.");
    num_layers = std::max(num_layers, layer[i] + 1);
  }
  int current = 0;
  for (int i = 0; i < m.tensors_size(); ++i) {
    const v1::TensorSpec& t = m.tensors(i);
    if (t.has_stage()) {
      if (t.stage() < 0 || t.stage() >= layout.pp()) {
        return TensorError(t, i, absl::StrCat("stage ", t.stage(), " is outside [0, pp=", layout.pp(), ")"));
      }
      current = t.stage();
    } else if (layer[i] >= 0) {
      current = static_cast<int>(int64_t{layer[i]} * layout.pp() / num_layers);
    }
    (*tensors)[i].stage = current;
  }
  // Trailing untagged tensors (final norm, lm_head) belong to the last stage.
  for (int i = m.tensors_size() - 1; i >= 0; --i) {
    const v1::TensorSpec& t = m.tensors(i);
    if (t.has_stage() || layer[i] >= 0) break;
    if (num_layers > 0) (*tensors)[i].stage = layout.pp() - 1;
  }
  return absl::OkStatus();
}

absl::Status AssignExperts(const v1::ModelManifest& m, std::vector<ResolvedTensor>* tensors,
                           int* num_experts) {
  *num_experts = 0;
  for (int i = 0; i < m.tensors_size(); ++i) {
    const v1::TensorSpec& t = m.tensors(i);
    ResolvedTensor& r = (*tensors)[i];
    int from_name = IndexAfter(t.name(), "experts.");
    if (t.has_expert()) {
      if (from_name >= 0 && from_name != t.expert()) {
        return TensorError(t, i, absl::StrCat("expert ", t.expert(), " disagrees with the name's experts.",
                                              from_name));
      }
      r.expert = t.expert();
    } else {
      r.expert = from_name;
    }
    if (r.expert >= 0) {
      *num_experts = std::max(*num_experts, r.expert + 1);
    } else if (IsExpertStackName(t.name()) && t.shape_size() >= 2) {
      r.stack = true;
    }
  }
  return absl::OkStatus();
}

// Splits a tensor into its units: one per ep rank for a fused expert stack
// under expert parallelism, else one.
absl::Status AddUnits(const v1::TensorSpec& t, int index, const ResolvedTensor& r,
                      const RankLayout& layout, int num_experts, ResolvedModel* model) {
  auto add = [&](int group, int64_t begin, int64_t numel, int mb, int me) {
    int u = static_cast<int>(model->units.size());
    model->units.push_back(Unit{index, group, begin, numel, mb, me});
    (r.muon ? model->muon_units : model->adamw_units)[group].push_back(u);
  };
  if (layout.ep() == 1) {
    add(layout.DefaultGroup(r.stage), 0, r.numel, 0, r.matrices);
    return absl::OkStatus();
  }
  if (r.expert >= 0) {
    int per_rank = num_experts / layout.ep();
    add(layout.MoeGroup(r.stage, r.expert / per_rank), 0, r.numel, 0, r.matrices);
    return absl::OkStatus();
  }
  if (!r.stack) {
    add(layout.DefaultGroup(r.stage), 0, r.numel, 0, r.matrices);
    return absl::OkStatus();
  }
  int64_t experts = t.shape(0);
  if (experts % layout.ep() != 0) {
    return TensorError(t, index, absl::StrCat("expert stack of ", experts, " experts is not divisible by ep ",
                                              layout.ep()));
  }
  int64_t per_rank = experts / layout.ep();
  int64_t per_expert = r.numel / experts;
  for (int e = 0; e < layout.ep(); ++e) {
    int mb = r.muon ? static_cast<int>(e * per_rank) : 0;
    int me = r.muon ? static_cast<int>((e + 1) * per_rank) : 1;
    add(layout.MoeGroup(r.stage, e), e * per_rank * per_expert, per_rank * per_expert, mb, me);
  }
  return absl::OkStatus();
}

}  // namespace

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

int DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::BF16:
    case v1::FP16:
      return 2;
    case v1::FP32:
      return 4;
    default:
      return 0;
  }
}

const char* DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::BF16:
      return "bfloat16";
    case v1::FP16:
      return "float16";
    case v1::FP32:
      return "float32";
    default:
      return "unknown";
  }
}

double NsFlops(int64_t rows, int64_t cols, int steps) {
  double a = static_cast<double>(std::min(rows, cols));
  double b = static_cast<double>(std::max(rows, cols));
  return steps * (4.0 * a * a * b + 2.0 * a * a * a);
}

const std::vector<std::string>& DefaultExcludePatterns() {
  static const auto* const kPatterns = new std::vector<std::string>{
      "embed", "lm_head", "bias", R"(\.gate\.weight$)", "router", "sinks"};
  return *kPatterns;
}

absl::StatusOr<ResolvedModel> ResolveModel(const v1::ModelManifest& manifest,
                                           const RankLayout& layout,
                                           const std::vector<std::string>& exclude_patterns) {
  if (manifest.tensors_size() == 0) {
    return absl::InvalidArgumentError("manifest: has no tensors");
  }
  auto excludes = ExcludeMatcher::Create(exclude_patterns);
  if (!excludes.ok()) return excludes.status();

  ResolvedModel model;
  model.tensors.resize(manifest.tensors_size());
  // Exclusion answers by name skeleton (ExcludeMatcher::digit_agnostic): a
  // 70k-tensor MoE manifest has a few dozen.
  absl::flat_hash_map<std::string, bool> memo;
  std::string skeleton;
  absl::flat_hash_set<absl::string_view> names;
  names.reserve(manifest.tensors_size());
  for (int i = 0; i < manifest.tensors_size(); ++i) {
    const v1::TensorSpec& t = manifest.tensors(i);
    ResolvedTensor& r = model.tensors[i];
    absl::Status s = CheckTensor(t, i, &r);
    if (!s.ok()) return s;
    if (!names.insert(t.name()).second) return TensorError(t, i, "duplicate name");
    if (t.optimizer() != v1::OPTIMIZER_UNSPECIFIED) {
      r.muon = t.optimizer() == v1::MUON;
    } else {
      bool excluded = ExcludedMemo(*excludes, t.name(), memo, skeleton);
      r.muon = (t.shape_size() == 2 || t.shape_size() == 3) && !excluded;
    }
  }
  absl::Status s = AssignStages(manifest, layout, &model.tensors);
  if (!s.ok()) return s;
  int num_experts = 0;
  s = AssignExperts(manifest, &model.tensors, &num_experts);
  if (!s.ok()) return s;
  if (layout.ep() > 1 && num_experts > 0 && num_experts % layout.ep() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("manifest: ", num_experts,
                                                   " experts are not divisible by ep ", layout.ep()));
  }

  model.muon_units.resize(layout.num_groups());
  model.adamw_units.resize(layout.num_groups());
  model.units.reserve(manifest.tensors_size());
  for (int i = 0; i < manifest.tensors_size(); ++i) {
    s = AddUnits(manifest.tensors(i), i, model.tensors[i], layout, num_experts, &model);
    if (!s.ok()) return s;
  }
  return model;
}

}  // namespace muonshard::planner
