#include "plan/model.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "plan/ns_blocks.h"
#include "plan/tp_mesh.h"
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

// Scans each tensor name once. Digit runs collapse to one '0' in the name's
// skeleton ("model.layers.0.mlp.experts.0.up_proj.weight"; a 70k-tensor MoE
// manifest has a few dozen), and what depends on the skeleton only -- where
// "layers.N" and "experts.N" sit, whether it names a fused expert stack and,
// for digit-agnostic patterns, exclusion -- is worked out once per skeleton.
// Names of one skeleton differ only in their digits; manifests list them
// in increasing index order (layer, then expert), so the duplicate check is
// a comparison with the skeleton's previous name until that order breaks,
// and a set of the digits packed in one integer from then on.
class NameScanner {
 public:
  struct Facts {
    bool duplicate = false;
    bool excluded = false;  // only when asked for
    int layer = -1;         // IndexAfter(name, "layers.")
    int expert = -1;        // IndexAfter(name, "experts.")
    bool expert_stack = false;
  };

  explicit NameScanner(const ExcludeMatcher& excludes) : excludes_(excludes) {}

  Facts Scan(absl::string_view name, bool need_excluded) {
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

 private:
  static constexpr int kMaxRuns = 8;
  static constexpr int kMaxNibbles = 16;
  static constexpr uint64_t kSeparator = 0xF;

  // The digits seen under one skeleton.
  struct Digits {
    bool ordered = true;                // every name's run values above the last's
    std::array<int, kMaxRuns> last{};   // run values of the last name, while ordered
    std::vector<uint64_t> keys;         // packed digits, while ordered
    absl::flat_hash_set<uint64_t> set;  // packed digits, once not
  };

  // Whether this name's digits were seen under its skeleton; records them.
  // Strictly increasing run values cannot repeat, so while they increase the
  // packed digits are only kept, to fill the set should the order break.
  bool SeenDigits(Digits& d) {
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

  struct SkeletonInfo {
    bool excluded = false;
    bool expert_stack = false;
    int layer_run = -1;
    int expert_run = -1;
    Digits digits;
  };

  // Fills skeleton_, the values of the first kMaxRuns digit runs, and the
  // name's digits as nibbles (digit + 1, runs separated by 0xF; no nibble is
  // 0, so with the skeleton fixing the run count the packing is injective).
  void BuildSkeleton(absl::string_view name) {
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

  void AddChar(absl::string_view name, size_t i) {
    const char c = name[i];
    if (!absl::ascii_isdigit(c)) {
      skeleton_[n_++] = c;
      return;
    }
    if (i == 0 || !absl::ascii_isdigit(name[i - 1])) {  // a run starts
      skeleton_[n_++] = '0';
      if (runs_ > 0) AddNibble(kSeparator);
      if (runs_ < kMaxRuns) run_value_[runs_] = 0;
      run_digits_ = 0;
      ++runs_;
    }
    if (++run_digits_ > 9) long_run_ = true;
    if (runs_ <= kMaxRuns && !long_run_) run_value_[runs_ - 1] = run_value_[runs_ - 1] * 10 + (c - '0');
    AddNibble(static_cast<uint64_t>(c - '0') + 1);
  }

  void AddNibble(uint64_t v) {
    if (num_nibbles_ == kMaxNibbles) {
      packable_ = false;
      return;
    }
    nibbles_ |= v << (4 * num_nibbles_++);
  }

  // Manifests repeat a short cycle of skeletons (an expert's gate, up and
  // down projections, then the next expert's), so the last few are compared
  // before the table is hashed.
  SkeletonInfo& Lookup(absl::string_view name) {
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

  const ExcludeMatcher& excludes_;
  struct Recent {
    static constexpr uint32_t kNone = ~uint32_t{0};
    std::string skeleton;
    uint32_t index = kNone;
  };
  absl::flat_hash_map<std::string, uint32_t> memo_;  // skeleton -> its index in infos_
  std::vector<SkeletonInfo> infos_;
  std::array<Recent, 4> recent_;
  size_t next_recent_ = 0;
  absl::flat_hash_set<absl::string_view> unpacked_;
  // The name being scanned.
  std::string skeleton_;
  size_t n_ = 0;
  int runs_ = 0;
  int run_digits_ = 0;
  std::array<int, kMaxRuns> run_value_{};
  uint64_t nibbles_ = 0;
  int num_nibbles_ = 0;
  bool packable_ = true;
  bool long_run_ = false;
};

// Shape, dtype and optimizer checks of one tensor; fills numel/esize/shape view.
absl::Status CheckTensor(const v1::TensorSpec& t, int index, ResolvedTensor* out) {
  if (t.name().empty()) return TensorError(t, index, "name is empty");
  if (t.shape_size() == 0) return TensorError(t, index, "shape is empty");
  if (t.shape_size() > kMaxDims) {
    return TensorError(t, index,
                       absl::StrCat("shape has ", t.shape_size(), " dimensions, at most ", kMaxDims, " are supported"));
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
    return TensorError(t, index,
                       absl::StrCat("unknown dtype ", static_cast<int>(t.dtype()), " (expected BF16, FP16 or FP32)"));
  }
  if (!v1::Optimizer_IsValid(t.optimizer())) {
    return TensorError(t, index, absl::StrCat("unknown optimizer ", static_cast<int>(t.optimizer())));
  }
  if (!v1::TpSplit_IsValid(t.tp_split())) {
    return TensorError(t, index, absl::StrCat("unknown tp_split ", static_cast<int>(t.tp_split())));
  }
  if (!v1::Layout_IsValid(t.layout())) {
    return TensorError(t, index, absl::StrCat("unknown layout ", static_cast<int>(t.layout())));
  }
  if (t.optimizer() == v1::MUON && t.shape_size() != 2 && t.shape_size() != 3) {
    return TensorError(
        t, index, absl::StrCat("optimizer MUON needs a 2-D or 3-D tensor, shape has ", t.shape_size(), " dimensions"));
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
  out->ns_rows = out->rows;
  out->ns_cols = out->cols;
  out->ns_flops_per_step = NsFlops(out->rows, out->cols, 1);
  return absl::OkStatus();
}

// What the per-tensor pass learns for stage and expert placement, which
// need the whole manifest (layer count, expert count) before they resolve.
struct Placement {
  std::vector<int> layer;  // "layers.N" index, -1 if none
  std::vector<bool> explicit_stage;
  int num_layers = 0;
  int num_experts = 0;
  // The first error of each kind in manifest order; the stage error wins.
  absl::Status stage_error;
  absl::Status expert_error;
};

// Explicit stage and expert of tensor i, checked; records the first error
// of each kind rather than returning, so that shape and name errors of
// later tensors still come first.
void PlaceTensor(const v1::TensorSpec& t, int i, const RankLayout& layout, const NameScanner::Facts& facts,
                 ResolvedTensor& r, Placement& p) {
  p.layer[i] = facts.layer;
  p.num_layers = std::max(p.num_layers, facts.layer + 1);
  if (t.has_stage()) {
    p.explicit_stage[i] = true;
    r.stage = t.stage();
    if ((t.stage() < 0 || t.stage() >= layout.pp()) && p.stage_error.ok()) {
      p.stage_error = TensorError(t, i, absl::StrCat("stage ", t.stage(), " is outside [0, pp=", layout.pp(), ")"));
    }
  }
  if (t.has_expert()) {
    if (facts.expert >= 0 && facts.expert != t.expert() && p.expert_error.ok()) {
      p.expert_error =
          TensorError(t, i, absl::StrCat("expert ", t.expert(), " disagrees with the name's experts.", facts.expert));
    }
    r.expert = t.expert();
  } else {
    r.expert = facts.expert;
  }
  if (r.expert >= 0) {
    p.num_experts = std::max(p.num_experts, r.expert + 1);
  } else if (facts.expert_stack && t.shape_size() >= 2) {
    r.stack = true;
  }
}

// Muon for an explicit MUON, or when classifying a 2-D or 3-D tensor. A 2-D
// fused expert stack [experts, n] holds one vector per expert: AdamW, like a
// 1-D tensor, and MUON on it is refused (its matrices would be rows of one
// expert each, split over the ep ranks).
absl::Status ChooseOptimizer(const v1::TensorSpec& t, int index, bool classify_as_matrix, ResolvedTensor& r) {
  const bool vector_stack = r.stack && t.shape_size() == 2;
  if (vector_stack && t.optimizer() == v1::MUON) {
    return TensorError(t, index,
                       absl::StrCat("optimizer MUON on a 2-D expert stack (", t.shape(0), " experts of ", t.shape(1),
                                    " elements each): Muon needs a matrix per expert, "
                                    "i.e. a 3-D stack [experts, rows, cols]"));
  }
  if (t.optimizer() != v1::OPTIMIZER_UNSPECIFIED) {
    r.muon = t.optimizer() == v1::MUON;
  } else {
    r.muon = classify_as_matrix && !vector_stack && (t.shape_size() == 2 || t.shape_size() == 3);
  }
  return absl::OkStatus();
}

// A split per tp mesh dimension (NOTE [TP mesh tiles] in tp_mesh.h),
// checked: instead of tp_split, one value per mesh dimension, even tiles,
// no expert tensors and no per-block Newton-Schulz (its blocks would cross
// the tiles of a strided or 2-D split). r.tp_dim stays -1 (ns_local is off).
absl::Status ResolveTpMeshSplit(const v1::TensorSpec& t, int index, const RankLayout& layout, ResolvedTensor& r) {
  if (t.tp_split() != v1::TP_SPLIT_UNSPECIFIED) {
    return TensorError(t, index, "set tp_split or tp_mesh_split, not both");
  }
  if (layout.tp_mesh().size() != static_cast<size_t>(t.tp_mesh_split_size())) {
    return TensorError(
        t, index,
        absl::StrCat("tp_mesh_split has ", t.tp_mesh_split_size(), " values but the topology's tp mesh has ",
                     layout.tp_mesh().size(), " dimensions (topology.tp_mesh)"));
  }
  const std::vector<v1::TpSplit> splits = MeshSplitOf(t.tp_mesh_split(), t.tp_split());
  if (!AnyMeshSplit(splits)) return absl::OkStatus();
  if (r.expert >= 0 || r.stack) {
    return TensorError(t, index, "tp_mesh_split on an expert tensor: experts are not tiled over a tp mesh");
  }
  if (t.has_ns_blocks()) {
    return TensorError(t, index,
                       "ns_blocks with tp_mesh_split: per-block Newton-Schulz of a tensor tiled over a tp mesh is "
                       "not supported");
  }
  absl::Status s = CheckTpTiles(t.shape(), r.layout, layout.tp_mesh(), splits);
  if (!s.ok()) return TensorError(t, index, absl::StrCat("tp_mesh_split: ", s.message()));
  return absl::OkStatus();
}

// The dimension a TP split divides: out or in of the tensor's layout (the
// last two dimensions; a 1-D tensor's only one is out). Checked against tp:
// divisible, ROW only with two or more dimensions, and no split of expert
// tensors under expert parallelism (Paddle's expert_tensor_parallel_degree
// <= 1: experts are spread over the tp ranks whole).
absl::Status ResolveTpSplit(const v1::TensorSpec& t, int index, const RankLayout& layout, ResolvedTensor& r) {
  if (t.tp_mesh_split_size() > 0) return ResolveTpMeshSplit(t, index, layout, r);
  const v1::TpSplit split = t.tp_split();
  if (layout.tp() == 1 || split == v1::TP_SPLIT_UNSPECIFIED || split == v1::TP_REPLICATED) return absl::OkStatus();
  const int n = t.shape_size();
  const char* name = split == v1::TP_COLUMN ? "TP_COLUMN" : "TP_ROW";
  if (split == v1::TP_ROW && n < 2) {
    return TensorError(t, index,
                       "tp_split TP_ROW needs a tensor of 2 or more dimensions (a 1-D tensor splits along out)");
  }
  if (layout.ep() > 1 && (r.expert >= 0 || r.stack)) {
    return TensorError(t, index,
                       absl::StrCat("tp_split ", name, " on an expert tensor with ep ", layout.ep(),
                                    ": experts are not split over tensor parallelism, only spread"));
  }
  const int dim = TpSplitDim(n, r.layout, split);
  if (t.shape(dim) % layout.tp() != 0) {
    return TensorError(t, index,
                       absl::StrCat("tp_split ", name, ": dimension ", dim, " (", t.shape(dim),
                                    ") is not divisible by tp ", layout.tp()));
  }
  r.tp_dim = dim;
  return absl::OkStatus();
}

// Per-block Newton-Schulz (ns_blocks.h): only on a Muon matrix, tiling its
// axis exactly. The blocks give the FLOPs, and with a TP split along their
// axis that leaves whole blocks on every tp rank, the tensor is
// orthogonalised shard by shard.
absl::Status ResolveNsBlocks(const v1::TensorSpec& t, int index, const RankLayout& layout, ResolvedTensor& r) {
  if (!t.has_ns_blocks()) return absl::OkStatus();
  const v1::NsBlocks& blocks = t.ns_blocks();
  if (!r.muon) {
    return TensorError(t, index,
                       absl::StrCat("ns_blocks ", NsBlocksText(blocks),
                                    " on a tensor that uses AdamW: per-block Newton-Schulz needs a Muon matrix "
                                    "(2-D, or a 3-D expert stack)"));
  }
  absl::Status s = CheckNsBlocks(blocks, t.shape());
  if (!s.ok()) return TensorError(t, index, s.message());
  r.ns_flops_per_step = BlockedNsFlops(&blocks, r.rows, r.cols, 1);
  r.ns_local = r.tp_dim >= 0 && NsBlocksAlignWithTp(blocks, t.shape(), r.tp_dim, layout.tp());
  return absl::OkStatus();
}

// Stage of every tensor: explicit, else from "layers.N" in contiguous equal
// blocks, else the stage of the closest preceding layered tensor (embedding
// -> first stage; final norm and lm_head -> last).
void AssignStages(const Placement& p, int pp, std::vector<ResolvedTensor>& tensors) {
  const int n = static_cast<int>(tensors.size());
  int current = 0;
  for (int i = 0; i < n; ++i) {
    if (p.explicit_stage[i]) {
      current = tensors[i].stage;
    } else if (p.layer[i] >= 0) {
      current = static_cast<int>(int64_t{p.layer[i]} * pp / p.num_layers);
    }
    tensors[i].stage = current;
  }
  // Trailing untagged tensors (final norm, lm_head) belong to the last stage.
  for (int i = n - 1; i >= 0; --i) {
    if (p.explicit_stage[i] || p.layer[i] >= 0) break;
    if (p.num_layers > 0) tensors[i].stage = pp - 1;
  }
}

// Splits a tensor into its units: one per ep rank for a fused expert stack
// under expert parallelism, else one.
absl::Status AddUnits(const v1::TensorSpec& t, int index, const ResolvedTensor& r, const RankLayout& layout,
                      int num_experts, ResolvedModel* model) {
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
    return TensorError(t, index,
                       absl::StrCat("expert stack of ", experts, " experts is not divisible by ep ", layout.ep()));
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

v1::DType GradDType(const v1::PlanPolicy& policy) {
  return policy.grad_dtype() == v1::DTYPE_UNSPECIFIED ? v1::FP32 : policy.grad_dtype();
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

TpShardRuns TpShardRunsOf(absl::Span<const int64_t> whole_shape, int dim, int tp, int t) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= whole_shape[d];
  for (size_t d = dim + 1; d < whole_shape.size(); ++d) inner *= whole_shape[d];
  const int64_t block = whole_shape[dim] / tp * inner;
  TpShardRuns r;
  r.runs = outer;
  r.run = block;
  r.pitch = whole_shape[dim] * inner;
  r.offset = t * block;
  return r;
}

bool IsTpReplicated(const v1::PlannedTensor& tensor, int tp) {
  return tp > 1 && !IsTpSplit(tensor) && tensor.colour() != v1::MOE_EXPERT;
}

bool IsTpSplit(const v1::PlannedTensor& tensor) {
  return AnyMeshSplit(MeshSplitOf(tensor.tp_mesh_split(), tensor.tp_split())) && tensor.local_shape_size() > 0;
}

const google::protobuf::RepeatedField<int64_t>& HeldShape(const v1::PlannedTensor& tensor) {
  return IsTpSplit(tensor) ? tensor.local_shape() : tensor.shape();
}

int64_t HeldNumel(const v1::PlannedTensor& tensor) { return IsTpSplit(tensor) ? tensor.local_numel() : tensor.numel(); }

TpShardRuns TpShardRunsOf(const v1::PlannedTensor& tensor, int tp, int t) {
  return TpShardRunsOf(tensor.shape(), TpSplitDim(tensor.shape_size(), tensor.layout(), tensor.tp_split()), tp, t);
}

int TpSplitDim(int dims, v1::Layout layout, v1::TpSplit split) {
  if (dims == 1) return split == v1::TP_COLUMN ? 0 : -1;
  const bool out_first = layout != v1::IN_OUT;
  const int out_dim = out_first ? dims - 2 : dims - 1;
  const int in_dim = out_first ? dims - 1 : dims - 2;
  return split == v1::TP_COLUMN ? out_dim : in_dim;
}

double NsFlops(int64_t rows, int64_t cols, int steps) {
  double a = static_cast<double>(std::min(rows, cols));
  double b = static_cast<double>(std::max(rows, cols));
  return steps * (4.0 * a * a * b + 2.0 * a * a * a);
}

const std::vector<std::string>& DefaultExcludePatterns() {
  static const auto* const kPatterns =
      new std::vector<std::string>{"embed", "lm_head", "bias", R"(\.gate\.weight$)", "router", "sinks"};
  return *kPatterns;
}

absl::StatusOr<ResolvedModel> ResolveModel(const v1::ModelManifest& manifest, const RankLayout& layout,
                                           const std::vector<std::string>& exclude_patterns) {
  if (manifest.tensors_size() == 0) {
    return absl::InvalidArgumentError("manifest: has no tensors");
  }
  auto excludes = ExcludeMatcher::Create(exclude_patterns);
  if (!excludes.ok()) return excludes.status();

  const int n = manifest.tensors_size();
  ResolvedModel model;
  model.tensors.resize(n);
  NameScanner names(*excludes);
  Placement placement;
  placement.layer.resize(n);
  placement.explicit_stage.resize(n);
  for (int i = 0; i < n; ++i) {
    const v1::TensorSpec& t = manifest.tensors(i);
    ResolvedTensor& r = model.tensors[i];
    absl::Status s = CheckTensor(t, i, &r);
    if (!s.ok()) return s;
    const bool classify = t.optimizer() == v1::OPTIMIZER_UNSPECIFIED;
    const NameScanner::Facts facts = names.Scan(t.name(), classify);
    if (facts.duplicate) return TensorError(t, i, "duplicate name");
    PlaceTensor(t, i, layout, facts, r, placement);
    s = ChooseOptimizer(t, i, classify && !facts.excluded, r);
    if (s.ok()) s = ResolveTpSplit(t, i, layout, r);
    if (s.ok()) s = ResolveNsBlocks(t, i, layout, r);
    if (!s.ok()) return s;
  }
  if (!placement.stage_error.ok()) return placement.stage_error;
  if (!placement.expert_error.ok()) return placement.expert_error;
  AssignStages(placement, layout.pp(), model.tensors);
  const int num_experts = placement.num_experts;
  if (layout.ep() > 1 && num_experts > 0 && num_experts % layout.ep() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest: ", num_experts, " experts are not divisible by ep ", layout.ep()));
  }

  model.muon_units.resize(layout.num_groups());
  model.adamw_units.resize(layout.num_groups());
  model.units.reserve(manifest.tensors_size());
  for (int i = 0; i < n; ++i) {
    absl::Status s = AddUnits(manifest.tensors(i), i, model.tensors[i], layout, num_experts, &model);
    if (!s.ok()) return s;
  }
  return model;
}

}  // namespace muonshard::planner
