#include "worker/param_dump.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "plan/model.h"
#include "plan/tp_mesh.h"

namespace muonshard::worker {
namespace {

int LowestRank(const v1::CommGroup& group) {
  return group.ranks().empty() ? -1 : *std::min_element(group.ranks().begin(), group.ranks().end());
}

const v1::CommGroup* FindGroup(const v1::RankView& view, int id) {
  for (const v1::CommGroup& g : view.groups()) {
    if (g.id() == id) return &g;
  }
  return nullptr;
}

// The lowest rank of the part's group writes it; with tp > 1 a replicated
// tensor only from tp rank 0 (every tp rank holds a copy).
bool IsWriter(const v1::RankView& view, const HeldTensor& h) {
  const v1::CommGroup* g = FindGroup(view, h.group);
  if (planner::IsTpReplicated(*h.spec, view.topology().tp()) && view.rank().tp_rank() != 0) return false;
  return g != nullptr && LowestRank(*g) == view.rank().rank();
}

bool IsWhole(const HeldTensor& h) { return h.tp <= 1 && h.element_begin == 0 && h.element_end == h.spec->numel(); }

std::vector<int64_t> Shape(const v1::PlannedTensor& t) { return {t.shape().begin(), t.shape().end()}; }

// A piece of a part file: its tensor name and element range (of TP shard
// tp_rank when tp_rank >= 0).
struct Piece {
  std::string name;
  int64_t begin = 0;
  int64_t end = -1;  // -1: the whole tensor
  int tp_rank = -1;
};

// "NAME" (whole), "NAME@BEGIN-END" or "NAME@tpT:BEGIN-END" (a range of TP
// shard T).
Piece ParseKey(const std::string& key) {
  const size_t at = key.rfind('@');
  if (at == std::string::npos) return {key};
  Piece p{key.substr(0, at)};
  absl::string_view rest = absl::string_view(key).substr(at + 1);
  if (absl::ConsumePrefix(&rest, "tp")) {
    const size_t colon = rest.find(':');
    if (colon == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, colon), &p.tp_rank)) return {key};
    rest.remove_prefix(colon + 1);
  }
  std::vector<std::string> range = absl::StrSplit(rest, '-');
  if (range.size() != 2 || !absl::SimpleAtoi(range[0], &p.begin) || !absl::SimpleAtoi(range[1], &p.end)) {
    return {key};
  }
  return p;
}

// The whole tensor's index of element `i` of `piece` under `plan`.
int64_t WholeIndex(const Piece& piece, const v1::Plan& plan, const v1::PlannedTensor& spec, int64_t i) {
  if (piece.tp_rank < 0) return i;
  return planner::RunsOfTile(spec.shape(), planner::TpTileOf(spec, plan.topology(), piece.tp_rank)).WholeIndex(i);
}

// Copies `t` into `out` (the whole tensor's values) and marks the elements
// covered; INVALID_ARGUMENT when it does not fit or overlaps.
absl::Status Place(const Piece& piece, const ParamTensor& t, const v1::Plan& plan, const v1::PlannedTensor& spec,
                   std::vector<float>& out, std::vector<bool>& covered) {
  const int64_t begin = piece.end < 0 ? 0 : piece.begin;
  const int64_t end = piece.end < 0 ? spec.numel() : piece.end;
  if (piece.end < 0 && t.shape != Shape(spec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", spec.name(), "\": part file shape differs from the plan's"));
  }
  const bool shard = piece.tp_rank >= 0;
  const int64_t held = shard ? spec.local_numel() : spec.numel();
  if ((shard && (!planner::IsTpSplit(spec) || piece.tp_rank >= plan.topology().tp())) || begin < 0 || end > held ||
      end - begin != static_cast<int64_t>(t.values.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", spec.name(), "\": part ", t.name, " does not fit ", held, " elements"));
  }
  for (int64_t i = begin; i < end; ++i) {
    const int64_t w = WholeIndex(piece, plan, spec, i);
    if (covered[w]) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", spec.name(), "\": element ", w, " written twice"));
    }
    covered[w] = true;
    out[w] = t.values[i - begin];
  }
  return absl::OkStatus();
}

}  // namespace

std::string PartFilePath(const std::string& path, int rank) { return absl::StrCat(path, ".rank-", rank); }

bool WritesParts(const v1::RankView& view, const std::vector<HeldTensor>& held) {
  return std::any_of(held.begin(), held.end(), [&view](const HeldTensor& h) { return IsWriter(view, h); });
}

absl::StatusOr<ParamsFile> RankParts(const v1::RankView& view, const std::vector<HeldTensor>& held,
                                     const std::map<int, std::vector<float>>& masters) {
  ParamsFile out;
  for (const HeldTensor& h : held) {
    if (!IsWriter(view, h)) continue;
    auto it = masters.find(h.tensor);
    if (it == masters.end() || static_cast<int64_t>(it->second.size()) != h.numel()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", h.spec->name(), "\": gathered master missing or of the wrong size"));
    }
    if (IsWhole(h)) {
      out.tensors.push_back({h.spec->name(), Shape(*h.spec), it->second});
    } else if (h.tp > 1) {
      out.tensors.push_back({absl::StrCat(h.spec->name(), "@tp", h.tp_rank, ":", h.element_begin, "-", h.element_end),
                             {h.numel()},
                             it->second});
    } else {
      out.tensors.push_back(
          {absl::StrCat(h.spec->name(), "@", h.element_begin, "-", h.element_end), {h.numel()}, it->second});
    }
  }
  return out;
}

absl::StatusOr<ParamsFile> MergeParts(const v1::Plan& plan, absl::Span<const ParamsFile> parts) {
  absl::flat_hash_map<std::string, int> index;
  for (int i = 0; i < plan.tensors_size(); ++i) index[plan.tensors(i).name()] = i;
  std::vector<std::vector<float>> values(plan.tensors_size());
  std::vector<std::vector<bool>> covered(plan.tensors_size());
  for (int i = 0; i < plan.tensors_size(); ++i) {
    values[i].assign(plan.tensors(i).numel(), 0.0f);
    covered[i].assign(plan.tensors(i).numel(), false);
  }
  for (const ParamsFile& part : parts) {
    for (const ParamTensor& t : part.tensors) {
      const Piece piece = ParseKey(t.name);
      auto it = index.find(piece.name);
      if (it == index.end()) {
        return absl::InvalidArgumentError(absl::StrCat("part file tensor \"", t.name, "\" is not in the plan"));
      }
      absl::Status s = Place(piece, t, plan, plan.tensors(it->second), values[it->second], covered[it->second]);
      if (!s.ok()) return s;
    }
  }
  ParamsFile out;
  for (int i = 0; i < plan.tensors_size(); ++i) {
    const v1::PlannedTensor& spec = plan.tensors(i);
    auto hole = std::find(covered[i].begin(), covered[i].end(), false);
    if (hole != covered[i].end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", spec.name(), "\": element ", hole - covered[i].begin(), " is in no part file"));
    }
    out.tensors.push_back({spec.name(), Shape(spec), std::move(values[i])});
  }
  return out;
}

ParamsFile ReferenceParams(const v1::Plan& plan, const ReferenceOptimizer& reference) {
  ParamsFile out;
  for (int i = 0; i < plan.tensors_size(); ++i) {
    out.tensors.push_back({plan.tensors(i).name(), Shape(plan.tensors(i)), reference.master(i)});
  }
  return out;
}

}  // namespace muonshard::worker
