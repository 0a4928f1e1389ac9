#include "plan/ns_blocks.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "plan/model.h"

namespace muonshard::planner {
namespace {

constexpr char kSyntax[] = "AXIS:SIZES[xGROUPS] or AXIS:strideN with AXIS rows or cols";

absl::Status ParseError(absl::string_view text, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("ns_blocks \"", text.substr(0, 200), text.size() > 200 ? "..." : "",
                                                 "\": ", what, " (", kSyntax,
                                                 ", e.g. rows:3072,1024,1024, rows:128,128,128x32, cols:stride2)"));
}

// A positive integer, whitespace around it allowed.
bool ParsePositive(absl::string_view text, int64_t* out) {
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(text), out) && *out > 0;
}

const char* AxisText(v1::NsBlocks::Axis axis) {
  switch (axis) {
    case v1::NsBlocks::ROWS:
      return "rows";
    case v1::NsBlocks::COLS:
      return "cols";
    default:
      return "?";
  }
}

// The length of the blocked axis of a rows x cols matrix, and the other one.
int64_t AxisLength(const v1::NsBlocks& b, int64_t rows, int64_t cols) {
  return b.axis() == v1::NsBlocks::COLS ? cols : rows;
}

// NsFlops of one iteration on a block `size` long on the blocked axis.
double BlockFlops(const v1::NsBlocks& b, int64_t size, int64_t rows, int64_t cols) {
  return b.axis() == v1::NsBlocks::COLS ? NsFlops(rows, size, 1) : NsFlops(size, cols, 1);
}

// Block boundaries inside one group of `sizes`: 0, s0, s0 + s1, ..., sum.
std::vector<int64_t> Boundaries(const v1::NsBlocks& b) {
  std::vector<int64_t> out{0};
  for (int64_t s : b.sizes()) out.push_back(out.back() + s);
  return out;
}

// One-iteration FLOPs of blocks [begin, end) of one group.
double GroupFlops(const v1::NsBlocks& b, int begin, int end, int64_t rows, int64_t cols) {
  double sum = 0;
  for (int i = begin; i < end; ++i) sum += BlockFlops(b, b.sizes(i), rows, cols);
  return sum;
}

absl::Status CheckShapeOfBlocks(const v1::NsBlocks& b, absl::Span<const int64_t> shape) {
  if (shape.size() != 2 && shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("needs a 2-D matrix or a 3-D stack of them, the shape has ", shape.size(), " dimensions"));
  }
  if (b.axis() != v1::NsBlocks::ROWS && b.axis() != v1::NsBlocks::COLS) {
    return absl::InvalidArgumentError(b.axis() == v1::NsBlocks::AXIS_UNSPECIFIED
                                          ? "axis is unset (ROWS or COLS)"
                                          : absl::StrCat("unknown axis ", static_cast<int>(b.axis())));
  }
  if (b.sizes().empty() == (b.stride() == 0)) {
    return absl::InvalidArgumentError(b.sizes().empty() ? "give the sizes of the blocks or a stride"
                                                        : "give the sizes of the blocks or a stride, not both");
  }
  if (b.stride() < 0) return absl::InvalidArgumentError(absl::StrCat("stride must be > 0, got ", b.stride()));
  if (b.groups() < 0) return absl::InvalidArgumentError(absl::StrCat("groups must be >= 0, got ", b.groups()));
  if (b.stride() > 0 && b.groups() != 0) {
    return absl::InvalidArgumentError("groups go with sizes, not with a stride");
  }
  return absl::OkStatus();
}

absl::Status CheckTiling(const v1::NsBlocks& b, absl::Span<const int64_t> shape) {
  const int dim = NsBlocksDim(static_cast<int>(shape.size()), b);
  const int64_t length = shape[dim];
  const std::string axis = absl::StrCat("the ", length, " ", AxisText(b.axis()), " (dimension ", dim, ")");
  if (b.stride() > 0) {
    if (length % b.stride() == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("stride ", b.stride(), " does not divide ", axis));
  }
  int64_t sum = 0;
  for (int i = 0; i < b.sizes_size(); ++i) {
    if (b.sizes(i) <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("size #", i, " is ", b.sizes(i), ", must be > 0"));
    }
    if (b.sizes(i) > length - sum) {
      return absl::InvalidArgumentError(absl::StrCat("the sizes sum to more than ", axis));
    }
    sum += b.sizes(i);
  }
  const int64_t groups = std::max<int64_t>(1, b.groups());
  if (groups <= length / sum && sum * groups == length) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the sizes sum to ", sum, " x ", groups, " group", groups == 1 ? "" : "s", ", not ", axis));
}

}  // namespace

std::string NsBlocksText(const v1::NsBlocks& b, int max_sizes) {
  std::string out = absl::StrCat(AxisText(b.axis()), ":");
  if (!b.sizes().empty() || b.stride() == 0) {
    const int shown = std::min(b.sizes_size(), std::max(max_sizes, 1));
    for (int i = 0; i < shown; ++i) absl::StrAppend(&out, i > 0 ? "," : "", b.sizes(i));
    if (shown < b.sizes_size()) absl::StrAppend(&out, ",...(", b.sizes_size(), " sizes)");
    if (b.groups() != 0 && b.groups() != 1) absl::StrAppend(&out, "x", b.groups());
  }
  if (b.stride() != 0) absl::StrAppend(&out, b.sizes().empty() ? "" : " ", "stride", b.stride());
  return out;
}

absl::StatusOr<v1::NsBlocks> ParseNsBlocks(absl::string_view text) {
  const absl::string_view whole = absl::StripAsciiWhitespace(text);
  const size_t colon = whole.find(':');
  if (colon == absl::string_view::npos) return ParseError(text, "no ':' after the axis");
  const std::string axis = absl::AsciiStrToLower(absl::StripAsciiWhitespace(whole.substr(0, colon)));
  v1::NsBlocks b;
  if (axis == "rows") {
    b.set_axis(v1::NsBlocks::ROWS);
  } else if (axis == "cols") {
    b.set_axis(v1::NsBlocks::COLS);
  } else {
    return ParseError(text, absl::StrCat("axis \"", axis.substr(0, 40), "\" is not rows or cols"));
  }
  absl::string_view body = absl::StripAsciiWhitespace(whole.substr(colon + 1));
  if (absl::ConsumePrefix(&body, "stride")) {
    int64_t stride = 0;
    if (!ParsePositive(body, &stride)) return ParseError(text, "the stride is not a positive integer");
    b.set_stride(stride);
    return b;
  }
  std::vector<absl::string_view> parts = absl::StrSplit(body, absl::ByAnyChar("xX"));
  if (parts.size() > 2) return ParseError(text, "more than one 'x' (SIZESxGROUPS)");
  if (parts.size() == 2) {
    int64_t groups = 0;
    if (!ParsePositive(parts[1], &groups)) return ParseError(text, "the group count is not a positive integer");
    b.set_groups(groups);
  }
  for (absl::string_view size : absl::StrSplit(parts[0], ',')) {
    int64_t v = 0;
    if (!ParsePositive(size, &v)) {
      return ParseError(text, absl::StrCat("size \"", absl::StripAsciiWhitespace(size).substr(0, 40),
                                           "\" is not a positive integer"));
    }
    b.add_sizes(v);
  }
  return b;
}

int NsBlocksDim(int dims, const v1::NsBlocks& blocks) {
  if (dims < 2) return -1;
  switch (blocks.axis()) {
    case v1::NsBlocks::ROWS:
      return dims - 2;
    case v1::NsBlocks::COLS:
      return dims - 1;
    default:
      return -1;
  }
}

absl::Status CheckNsBlocks(const v1::NsBlocks& blocks, absl::Span<const int64_t> shape) {
  absl::Status s = CheckShapeOfBlocks(blocks, shape);
  if (s.ok()) s = CheckTiling(blocks, shape);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(absl::StrCat("ns_blocks ", NsBlocksText(blocks), ": ", s.message()));
}

double BlockedNsFlops(const v1::NsBlocks* blocks, int64_t rows, int64_t cols, int steps) {
  if (blocks == nullptr) return NsFlops(rows, cols, steps);
  const v1::NsBlocks& b = *blocks;
  if (b.stride() > 0) {
    const int64_t size = AxisLength(b, rows, cols) / b.stride();
    return steps * (static_cast<double>(b.stride()) * BlockFlops(b, size, rows, cols));
  }
  const double groups = static_cast<double>(std::max<int64_t>(1, b.groups()));
  return steps * (groups * GroupFlops(b, 0, b.sizes_size(), rows, cols));
}

std::vector<NsBlockShape> NsBlockShapes(const v1::NsBlocks& b, int64_t rows, int64_t cols) {
  std::map<int64_t, int64_t> count_by_size;  // blocked-axis length -> blocks
  if (b.stride() > 0) {
    count_by_size[AxisLength(b, rows, cols) / b.stride()] = b.stride();
  } else {
    const int64_t groups = std::max<int64_t>(1, b.groups());
    for (int64_t size : b.sizes()) count_by_size[size] += groups;
  }
  std::vector<NsBlockShape> out;
  for (const auto& [size, count] : count_by_size) {
    const bool cols_axis = b.axis() == v1::NsBlocks::COLS;
    out.push_back({cols_axis ? rows : size, cols_axis ? size : cols, count});
  }
  return out;
}

bool NsBlocksAlignWithTp(const v1::NsBlocks& blocks, absl::Span<const int64_t> shape, int split_dim, int tp) {
  const int dim = NsBlocksDim(static_cast<int>(shape.size()), blocks);
  if (tp < 1 || dim < 0 || split_dim != dim || blocks.stride() > 0 || blocks.sizes().empty()) return false;
  const std::vector<int64_t> bounds = Boundaries(blocks);
  const int64_t group = bounds.back();
  const int64_t shard = shape[dim] / tp;
  if (group <= 0 || shard * tp != shape[dim]) return false;
  for (int k = 1; k < tp; ++k) {
    if (!std::binary_search(bounds.begin(), bounds.end(), (k * shard) % group)) return false;
  }
  return true;
}

double ShardNsFlops(const v1::NsBlocks& b, int64_t rows, int64_t cols, int tp, int t, int steps) {
  const std::vector<int64_t> bounds = Boundaries(b);
  const int64_t group = bounds.back();
  const int64_t shard = AxisLength(b, rows, cols) / std::max(tp, 1);
  if (group <= 0 || b.stride() > 0) return BlockedNsFlops(&b, rows, cols, steps) / std::max(tp, 1);
  // The shard [begin, end) as (group, block index) at each end.
  auto at = [&](int64_t p) {
    const auto it = std::lower_bound(bounds.begin(), bounds.end(), p % group);
    return std::make_pair(p / group, static_cast<int>(it - bounds.begin()));
  };
  const auto [g0, i0] = at(t * shard);
  const auto [g1, i1] = at((t + 1) * shard);
  const int n = b.sizes_size();
  double flops = 0;
  if (g0 == g1) {
    flops = GroupFlops(b, i0, i1, rows, cols);
  } else {
    flops = GroupFlops(b, i0, n, rows, cols) + static_cast<double>(g1 - g0 - 1) * GroupFlops(b, 0, n, rows, cols) +
            GroupFlops(b, 0, i1, rows, cols);
  }
  return steps * flops;
}

double PlannedMatrixNsFlops(const v1::PlannedTensor& tensor, int steps, int tp, int tp_rank) {
  const int n = tensor.shape_size();
  if (n == 0) return 0;
  const int64_t rows = n >= 2 ? tensor.shape(n - 2) : 1;
  const int64_t cols = tensor.shape(n - 1);
  const v1::NsBlocks* blocks = tensor.has_ns_blocks() && n >= 2 ? &tensor.ns_blocks() : nullptr;
  if (blocks != nullptr && tensor.ns_local() && tp > 1) return ShardNsFlops(*blocks, rows, cols, tp, tp_rank, steps);
  return BlockedNsFlops(blocks, rows, cols, steps);
}

double LargestPlannedMatrixNsFlops(const v1::PlannedTensor& tensor, int steps, int tp) {
  if (!tensor.ns_local() || tp <= 1) return PlannedMatrixNsFlops(tensor, steps, tp, 0);
  double largest = 0;
  for (int t = 0; t < tp; ++t) largest = std::max(largest, PlannedMatrixNsFlops(tensor, steps, tp, t));
  return largest;
}

}  // namespace muonshard::planner
