#include "sim/step_program.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::sim {

std::vector<NsMatrix> MergeSameShape(const std::vector<NsMatrix>& calls) {
  std::vector<NsMatrix> out;
  std::map<std::pair<int64_t, double>, size_t> at;  // (min_dim, FLOPs per matrix) -> index in out
  for (const NsMatrix& c : calls) {
    const int64_t count = std::max<int64_t>(1, c.count);
    const auto [it, fresh] = at.try_emplace({c.min_dim, c.flops / count}, out.size());
    if (fresh) {
      out.push_back(c);
    } else {
      out[it->second].flops += c.flops;
      out[it->second].count += count;
    }
  }
  return out;
}

bool IsCollective(OpKind kind) {
  return kind != OpKind::kNewtonSchulz && kind != OpKind::kElementwise && kind != OpKind::kFixed;
}

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kAllToAll:
      return "all_to_all";
    case OpKind::kGather:
      return "gather";
    case OpKind::kScatter:
      return "scatter";
    case OpKind::kNewtonSchulz:
      return "newton_schulz";
    case OpKind::kElementwise:
      return "elementwise";
    case OpKind::kFixed:
      return "fixed";
  }
  return "unknown";
}

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kReduce:
      return "reduce";
    case Phase::kNewtonSchulz:
      return "ns";
    case Phase::kMuonElementwise:
      return "muon";
    case Phase::kAdamwElementwise:
      return "adamw";
    case Phase::kSync:
      return "sync";
    case Phase::kTpExchange:
      return "tp";
    case Phase::kOther:
      return "other";
  }
  return "unknown";
}

int StepProgram::AddOp(StepOp op) {
  ops.push_back(std::move(op));
  return static_cast<int>(ops.size()) - 1;
}

int StepProgram::AddLane(Lane lane) {
  lanes.push_back(std::move(lane));
  return static_cast<int>(lanes.size()) - 1;
}

void StepProgram::Append(int lane, int op, bool new_block) {
  std::vector<std::vector<int>>& blocks = lanes[lane].blocks;
  if (new_block || blocks.empty()) blocks.emplace_back();
  blocks.back().push_back(op);
}

namespace {

absl::Status CheckGroups(const StepProgram& p) {
  for (size_t g = 0; g < p.groups.size(); ++g) {
    std::vector<bool> seen(p.world_size, false);
    if (p.groups[g].empty()) return absl::InvalidArgumentError(absl::StrCat("step program: group ", g, " is empty"));
    for (int rank : p.groups[g]) {
      if (rank < 0 || rank >= p.world_size || seen[rank]) {
        return absl::InvalidArgumentError(
            absl::StrCat("step program: group ", g, ": rank ", rank, " is out of range or repeated"));
      }
      seen[rank] = true;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMembers(const StepProgram& p, const StepOp& op, const std::string& name) {
  const size_t size = p.groups[op.group].size();
  for (const std::vector<int64_t>* v : {&op.member_send, &op.member_recv}) {
    if (!v->empty() && v->size() != size) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": member bytes for ", v->size(), " ranks, group has ", size));
    }
    for (int64_t b : *v) {
      if (b < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": negative member bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckCollective(const StepProgram& p, const StepOp& op, const std::string& name) {
  if (op.group < 0 || op.group >= static_cast<int>(p.groups.size())) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": group ", op.group, " out of range"));
  }
  if (op.root < -1 || op.root >= static_cast<int>(p.groups[op.group].size())) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": root ", op.root, " is not a group rank"));
  }
  const bool rooted = op.kind == OpKind::kReduce || op.kind == OpKind::kBroadcast || op.kind == OpKind::kGather ||
                      op.kind == OpKind::kScatter;
  if (rooted && op.root < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": needs a root"));
  if (op.bytes < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": negative bytes"));
  return CheckMembers(p, op, name);
}

absl::Status CheckCompute(const StepProgram& p, const StepOp& op, const std::string& name) {
  if (op.rank < 0 || op.rank >= p.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": rank ", op.rank, " out of range"));
  }
  for (const NsMatrix& m : op.matrices) {
    if (m.flops < 0 || m.min_dim < 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": negative FLOPs or a matrix dimension below 1"));
    }
  }
  if (op.memory_bytes < 0 || op.seconds < 0 || op.calls < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": negative memory bytes, calls or seconds"));
  }
  return absl::OkStatus();
}

absl::Status CheckOp(const StepProgram& p, int index) {
  const StepOp& op = p.ops[index];
  const std::string name = absl::StrCat("step program: op ", index, " (", op.label, ")");
  for (int d : op.deps) {
    if (d < 0 || d >= static_cast<int>(p.ops.size()) || d == index) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": dependency ", d, " out of range"));
    }
  }
  const bool member_p2p = (op.kind == OpKind::kGather || op.kind == OpKind::kScatter) &&
                          (!op.member_send.empty() || !op.member_recv.empty());
  if (op.call_group >= 0 && !member_p2p) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": only gathers and scatters with member bytes join a group call"));
  }
  return IsCollective(op.kind) ? CheckCollective(p, op, name) : CheckCompute(p, op, name);
}

absl::Status CheckLanes(const StepProgram& p) {
  std::vector<int> lanes_of(p.ops.size(), 0);
  for (size_t l = 0; l < p.lanes.size(); ++l) {
    std::vector<bool> seen(p.ops.size(), false);
    for (int rank : p.lanes[l].ranks) {
      if (rank < 0 || rank >= p.world_size) {
        return absl::InvalidArgumentError(absl::StrCat("step program: lane ", l, ": rank ", rank, " out of range"));
      }
    }
    for (const std::vector<int>& block : p.lanes[l].blocks) {
      for (int op : block) {
        if (op < 0 || op >= static_cast<int>(p.ops.size()) || seen[op]) {
          return absl::InvalidArgumentError(
              absl::StrCat("step program: lane ", l, " (", p.lanes[l].name, "): op ", op, " out of range or repeated"));
        }
        seen[op] = true;
        ++lanes_of[op];
      }
    }
  }
  for (size_t op = 0; op < p.ops.size(); ++op) {
    if (lanes_of[op] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step program: op ", op, " (", p.ops[op].label, ") is on no lane"));
    }
  }
  return absl::OkStatus();
}

// The ops of one group call are collectives of one group.
absl::Status CheckCallGroups(const StepProgram& p) {
  absl::flat_hash_map<int, int> group_of_call;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const StepOp& op = p.ops[i];
    if (op.call_group < 0) continue;
    auto [it, inserted] = group_of_call.try_emplace(op.call_group, op.group);
    if (!inserted && it->second != op.group) {
      return absl::InvalidArgumentError(absl::StrCat("step program: op ", i, " (", op.label, "): group call ",
                                                     op.call_group, " spans groups ", it->second, " and ", op.group));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateProgram(const StepProgram& program) {
  if (program.world_size < 1) return absl::InvalidArgumentError("step program: world size must be >= 1");
  MUONSHARD_RETURN_IF_ERROR(CheckGroups(program));
  for (size_t i = 0; i < program.ops.size(); ++i) MUONSHARD_RETURN_IF_ERROR(CheckOp(program, static_cast<int>(i)));
  MUONSHARD_RETURN_IF_ERROR(CheckCallGroups(program));
  return CheckLanes(program);
}

}  // namespace muonshard::sim
