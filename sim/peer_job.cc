#include "sim/internal/peer_job.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/model.h"
#include "plan/ns_blocks.h"
#include "sim/plan_program.h"

namespace muonshard::sim::internal {
namespace {

Matrix MatrixOf(const v1::PlannedTensor& t, int steps) {
  const int n = t.shape_size();
  const int64_t rows = t.shape(n - 2), cols = t.shape(n - 1);
  const auto& held = planner::HeldShape(t);
  const int64_t held_rows = held.size() >= 2 ? held[held.size() - 2] : rows;
  const int64_t held_cols = held.size() >= 2 ? held[held.size() - 1] : cols;
  Matrix m;
  m.tensor = 0;
  m.rows = held_rows;
  m.cols = held_cols;
  m.numel = held_rows * held_cols;
  m.dtype = t.dtype();
  m.tp_split = held_rows * held_cols != rows * cols;
  const int64_t min_dim = std::max<int64_t>(1, std::min(rows, cols));
  m.full = {planner::BlockedNsFlops(t.has_ns_blocks() ? &t.ns_blocks() : nullptr, rows, cols, steps), min_dim};
  m.shard = {planner::NsFlops(held_rows, held_cols, steps), std::max<int64_t>(1, std::min(held_rows, held_cols))};
  m.gram_bytes = min_dim * min_dim * kFp32;
  const bool rows_split = held_rows != rows, cols_split = held_cols != cols;
  if (rows_split != cols_split) {  // the Gram sums over the split axis, whichever it is
    const planner::ShardedNs ns = planner::ShardedNsGeometry(
        rows, cols, rows_split, static_cast<int>(rows_split ? rows / held_rows : cols / held_cols));
    m.distributed_step = {ns.Flops(1), std::max<int64_t>(1, ns.m)};
    m.gram_bytes = ns.m * ns.m * kFp32;
  } else {
    m.distributed_step = {m.full.flops / std::max(1, steps), min_dim};
  }
  return m;
}

absl::Status AddTensor(const v1::PlannedTensor& t, int index, const absl::flat_hash_map<int, int>& group_of_id,
                       int steps, std::vector<int>& dp_of_group, Job& job) {
  const bool muon = t.optimizer() == v1::MUON && t.shape_size() >= 2;
  for (const v1::TensorPart& part : t.parts()) {
    auto it = group_of_id.find(part.group());
    if (it == group_of_id.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: tensor ", t.name(), ": group ", part.group(), " is not in the plan"));
    }
    if (dp_of_group[it->second] < 0) {
      dp_of_group[it->second] = static_cast<int>(job.dp.size());
      job.dp.push_back({it->second, {}, {}});
    }
    DpGroup& d = job.dp[dp_of_group[it->second]];
    const int64_t numel = part.element_end() - part.element_begin();
    if (!muon) {
      d.adamw.push_back({index, numel, t.dtype()});
      continue;
    }
    Matrix m = MatrixOf(t, steps);
    m.tensor = index;
    const int64_t count = t.shape_size() >= 3 && part.matrix_end() > part.matrix_begin()
                              ? part.matrix_end() - part.matrix_begin()
                              : std::max<int64_t>(1, numel / std::max<int64_t>(1, m.numel));
    for (int64_t k = 0; k < count; ++k) d.muon.push_back(m);
  }
  return absl::OkStatus();
}

}  // namespace

int64_t Size(v1::DType dtype) { return planner::DTypeSize(dtype); }

int64_t GradBytes(const Job& job, const DpGroup& d) {
  int64_t n = 0;
  for (const Matrix& m : d.muon) n += m.numel;
  for (const Chunk& c : d.adamw) n += c.numel;
  return n * Size(job.grad);
}

int64_t ParamBytes(const DpGroup& d) {
  int64_t b = 0;
  for (const Matrix& m : d.muon) b += m.numel * Size(m.dtype);
  for (const Chunk& c : d.adamw) b += c.numel * Size(c.dtype);
  return b;
}

int64_t MuonBytes(const Job& job, const Matrix& m) { return m.numel * MuonBytesPerElement(m.dtype, job.grad); }
int64_t AdamwBytes(const Job& job, const Chunk& c) { return c.numel * AdamwBytesPerElement(c.dtype, job.grad); }

absl::StatusOr<Job> JobOf(const v1::Plan& plan) {
  Job job;
  job.world_size = plan.topology().world_size() > 0 ? plan.topology().world_size() : plan.ranks_size();
  job.grad = planner::GradDType(plan.policy());
  if (plan.policy().ns_steps() > 0) job.ns_steps = plan.policy().ns_steps();
  if (plan.policy().comm_buffer_mb() > 0) job.bucket_bytes = plan.policy().comm_buffer_mb() * kMiB;
  job.tp_group.assign(job.world_size, -1);
  absl::flat_hash_map<int, int> group_of_id;
  for (int g = 0; g < plan.groups_size(); ++g) {
    const v1::CommGroup& group = plan.groups(g);
    group_of_id[group.id()] = g;
    job.groups.emplace_back(group.ranks().begin(), group.ranks().end());
    for (int r : group.ranks()) {
      if (r < 0 || r >= job.world_size) {
        return absl::InvalidArgumentError(absl::StrCat("plan: group ", group.id(), ": rank ", r, " out of range"));
      }
      if (group.colour() == v1::TENSOR_PARALLEL && group.ranks_size() > 1) job.tp_group[r] = g;
    }
  }
  std::vector<int> dp_of_group(plan.groups_size(), -1);
  for (int t = 0; t < plan.tensors_size(); ++t) {
    MUONSHARD_RETURN_IF_ERROR(AddTensor(plan.tensors(t), t, group_of_id, job.ns_steps, dp_of_group, job));
  }
  std::sort(job.dp.begin(), job.dp.end(), [](const DpGroup& a, const DpGroup& b) { return a.group < b.group; });
  return job;
}

}  // namespace muonshard::sim::internal
