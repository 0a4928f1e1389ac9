#ifndef MUONSHARD_SIM_INTERNAL_PEER_JOB_H_
#define MUONSHARD_SIM_INTERNAL_PEER_JOB_H_

// What the peers' step programs (sim/peer_programs.h) are built from: a
// plan read as the peers see a job -- per data-parallel group, the Muon
// matrices and AdamW tensors its ranks hold -- and the builder each peer
// family's file defines. Internal to sim/.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "muonshard/v1/plan.pb.h"
#include "sim/peer_programs.h"
#include "sim/step_program.h"

namespace muonshard::sim::internal {

inline constexpr int64_t kFp32 = 4;
inline constexpr int64_t kBf16 = 2;
inline constexpr int64_t kMiB = int64_t{1} << 20;

// One Muon matrix as the ranks of its data-parallel group hold it.
struct Matrix {
  int tensor = 0;
  int64_t rows = 0, cols = 0;  // held: the TP shard with tp > 1
  int64_t numel = 0;           // rows x cols
  v1::DType dtype = v1::BF16;
  bool tp_split = false;
  NsMatrix full;   // Newton-Schulz of the whole matrix
  NsMatrix shard;  // of the held shard alone (blockwise)
  // Megatron's `distributed` mode on the held shard of a split matrix: one
  // step's work on each tp rank and the fp32 Gram it all-reduces (the
  // whole matrix's, min_dim^2, for a matrix that is not split along one
  // axis). planner::ShardedNsGeometry.
  NsMatrix distributed_step;
  int64_t gram_bytes = 0;
};

// An AdamW tensor (part) as the ranks of its group hold it.
struct Chunk {
  int tensor = 0;
  int64_t numel = 0;
  v1::DType dtype = v1::BF16;
};

// A data-parallel group (DEFAULT or MOE_EXPERT) and what it holds, in model
// order.
struct DpGroup {
  int group = 0;  // index into Job::groups
  std::vector<Matrix> muon;
  std::vector<Chunk> adamw;
};

struct Job {
  int world_size = 0;
  v1::DType grad = v1::FP32;
  int ns_steps = 5;
  int64_t bucket_bytes = 256 * kMiB;
  std::vector<std::vector<int>> groups;
  std::vector<DpGroup> dp;
  std::vector<int> tp_group;  // per rank: its TENSOR_PARALLEL group, or -1
};

// The job of `plan`. INVALID_ARGUMENT when a part names a group the plan
// lacks or a group a rank outside the world.
absl::StatusOr<Job> JobOf(const v1::Plan& plan);

int64_t Size(v1::DType dtype);
int64_t GradBytes(const Job& job, const DpGroup& d);  // the group's gradients
int64_t ParamBytes(const DpGroup& d);                 // its parameters
int64_t MuonBytes(const Job& job, const Matrix& m);   // the Muon update's memory traffic
int64_t AdamwBytes(const Job& job, const Chunk& c);   // the AdamW update's

// A program whose collectives run on every member's one in-order lane, as a
// step that waits for each collective: ops are added in one global order,
// so every lane takes them in an order all its groups agree on.
class Sequential {
 public:
  Sequential(const Job& job, std::string name) : job_(job) {
    p_.name = std::move(name);
    p_.world_size = job.world_size;
    p_.groups = job.groups;
    for (int r = 0; r < job.world_size; ++r) lane_.push_back(p_.AddLane({"step", {r}, LaneOrder::kInOrder, {}}));
  }

  // -1 for a group of one rank (it communicates nothing).
  int Collective(OpKind kind, Phase phase, int group, int64_t bytes, const std::string& label) {
    if (job_.groups[group].size() < 2 || bytes <= 0) return -1;
    StepOp op;
    op.kind = kind;
    op.phase = phase;
    op.group = group;
    if (kind == OpKind::kReduce || kind == OpKind::kBroadcast) op.root = 0;
    op.bytes = bytes;
    op.label = label;
    const int i = p_.AddOp(std::move(op));
    for (int m : job_.groups[group]) p_.Append(lane_[m], i, true);
    return i;
  }

  // `total` bytes in collectives of at most the job's bucket size.
  void Bucketed(OpKind kind, Phase phase, int group, int64_t total, const std::string& label) {
    for (int64_t done = 0, k = 0; done < total; ++k) {
      const int64_t b = std::min(job_.bucket_bytes, total - done);
      Collective(kind, phase, group, b, absl::StrCat(label, " ", k));
      done += b;
    }
  }

  void Ns(int rank, std::vector<NsMatrix> matrices, const std::string& label) {
    if (matrices.empty()) return;
    StepOp op;
    op.kind = OpKind::kNewtonSchulz;
    op.phase = Phase::kNewtonSchulz;
    op.rank = rank;
    op.matrices = std::move(matrices);
    op.label = label;
    p_.Append(lane_[rank], p_.AddOp(std::move(op)), true);
  }

  void Elementwise(int rank, Phase phase, int64_t bytes, int calls, const std::string& label) {
    if (bytes <= 0) return;
    StepOp op;
    op.kind = OpKind::kElementwise;
    op.phase = phase;
    op.rank = rank;
    op.memory_bytes = bytes;
    op.calls = calls;
    op.label = label;
    p_.Append(lane_[rank], p_.AddOp(std::move(op)), true);
  }

  StepProgram Take() { return std::move(p_); }

 private:
  const Job& job_;
  StepProgram p_;
  std::vector<int> lane_;
};

// The peer families (one file each).
absl::StatusOr<StepProgram> BuildMegatronProgram(const Job& job, PeerStrategy mode);  // peers_megatron.cc
StepProgram BuildRoundRobinProgram(const Job& job);                                   // peers_data_parallel.cc
StepProgram BuildZero1Program(const Job& job);                                        // peers_data_parallel.cc
StepProgram BuildAllToAllProgram(const Job& job);                                     // peers_all_to_all.cc

}  // namespace muonshard::sim::internal

#endif  // MUONSHARD_SIM_INTERNAL_PEER_JOB_H_
