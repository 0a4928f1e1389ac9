#ifndef MUONSHARD_WORKER_RANK_SESSION_OPTIONS_H_
#define MUONSHARD_WORKER_RANK_SESSION_OPTIONS_H_

// RankSessionOptions: what a RankSession (rank_session.h) and its parts
// (rank_membership.h, metrics_endpoint.h, rank_group.h, ...) are started
// with, and their validation. Here, not in rank_session.h, so the parts can
// take them without including the session they make up.

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "client/joined_job.h"
#include "common/clock.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/ns_batches.h"
#include "worker/optimizer/optimizer_config.h"

namespace muonshard::worker {

// Convention (design notes): worker metrics on 9465 + local rank.
inline constexpr int kDefaultWorkerMetricsPort = 9465;

struct RankSessionOptions {
  client::ConnectionOptions connection;  // coordinator, TLS, token, RPC timeout
  std::string job;
  int64_t plan_version = 0;      // 0: the job's (the latest for its first member)
  std::optional<int> rank;       // unset: the coordinator assigns one
  std::string backend = "gloo";  // or "nccl"
  // nccl: the CUDA device ordinal; -1: the local rank modulo the visible
  // devices (CudaDevice in worker_runner.h).
  int cuda_device = -1;
  // "ring": Gloo's own reductions (sums in ring order: equal to the
  // reference up to fp32 summation order). "rank": RankOrderCommunicator
  // (sums in group-rank order: bit-identical to the reference, at n x the
  // reduction traffic; for verification). Gloo only.
  std::string reduce_order = "ring";
  // NOTE [Node-local collectives] (plan/node_grid.h): "auto" runs a group
  // inside each node first where the plan's topology gives gpus_per_node
  // and the group's ranks form a grid; "flat": rings over all of a group's
  // ranks in rank order whatever the plan says (placement-oblivious, for
  // comparison). Gloo only (NCCL builds its own hierarchy). The same on
  // every rank of a job.
  std::string collectives = "auto";
  // NOTE [Pipelined step] (sharded_optimizer.h): "auto" (pipelined with
  // gloo, sequential with nccl), "sequential" or "pipelined" (gloo only).
  std::string step_schedule = "auto";
  // Benchmarks only: "comm" / "compute" run one half of the step (StepPhases).
  std::string step_phases = "all";
  // NOTE [Step pieces] (internal/bucket_split.h): Muon buckets cut into
  // pieces of at most this many KiB of gradients; 0: the plan's buckets.
  // The same on every rank of a job.
  int step_piece_kib = 0;
  // NOTE [Muon batches] (plan/ns_batches.h): the sequential step batches a
  // rank's same-shape Muon matrices across its buckets, at most this many
  // MiB of fp32 update per batch; 0: a bucket's at a time. A rank's own.
  int muon_batch_mib = static_cast<int>(planner::kDefaultMuonBatchMib);
  // NOTE [Step trace] (optimizer/step_stats.h): non-empty: each step's
  // spans are recorded, and the worker writes the last step_trace_steps
  // steps to <dir>/step-trace-rank<R>.json after training.
  std::string step_trace_dir;
  int step_trace_steps = 10;

  // /metrics on metrics_host:(metrics_port + local rank); metrics_port 0
  // picks a free port, negative disables the endpoint.
  int metrics_port = kDefaultWorkerMetricsPort;
  std::string metrics_host = "127.0.0.1";
  int local_rank = -1;        // -1: the job rank (one host)
  int local_world_size = -1;  // -1: the job's world size (one host)
  // Written once serving: {"rank": R, "metrics_port": M, "generation": G,
  // "plan_version": V}.
  std::string port_file;

  // Gloo: address to bind and advertise (or a network interface). NCCL
  // picks its own interfaces (NCCL_SOCKET_IFNAME).
  std::string hostname = "127.0.0.1";
  std::string interface;
  absl::Duration comm_timeout = absl::Seconds(60);  // rendezvous, collectives, barriers
  absl::Duration join_timeout = absl::Seconds(30);  // retrying an unreachable coordinator
  // NOTE [Recovery]: how long a recovery waits for the group to re-form
  // (zero: comm_timeout). With min_workers > 0 the job is elastic (NOTE
  // [Elastic jobs] in coordinator.proto): the coordinator shrinks it to the
  // ranks present after rejoin_grace when at least min_workers are, and a
  // recovery then waits up to twice the grace (the coordinator decides).
  absl::Duration rejoin_grace;
  int min_workers = 0;
  // NOTE [Buddy copies] (worker/buddy_copies.h): > 0 creates the job-wide
  // channel the buddy copies travel on; RefreshBuddyCopies is then due
  // after every buddy_every-th step.
  int buddy_every = 0;
  // OpenBLAS / CPU kernel threads (gloo); 0: cores / local_world_size (at
  // least 1). OpenBLAS results can depend on its thread count, and an exact
  // comparison with a reference needs the same setting.
  int blas_threads = 0;

  // Called with the rank's plan view after joining and before the
  // rendezvous: a program checks here that it can run this view (its model
  // holds the rank's tensors). An error ends the job (NOTE [Job failure]:
  // peers waiting in the rendezvous end with it at once) and is Start()'s.
  std::function<absl::Status(const client::JoinedJob&, const v1::RankView&)> check_view;

  std::ostream* log = nullptr;  // status lines; null: std::cerr
  std::string host;             // JoinJob identity; empty: gethostname()
  // JoinJob identity; empty: "cpu:<local rank>" (gloo) or "cuda:<device>"
  // (nccl), or unique per process when neither is known before joining.
  std::string device;
  Clock* clock = RealClock();  // heartbeats
};

// INVALID_ARGUMENT naming the option (as its muonshard-worker flag) for an
// unusable combination.
absl::Status ValidateRankSessionOptions(const RankSessionOptions& options);

// The optimizer's StepOptions of `options` (schedule, phases, pieces,
// trace); INVALID_ARGUMENT naming the flag of an unusable one.
absl::StatusOr<StepOptions> StepOptionsOf(const RankSessionOptions& options);

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_RANK_SESSION_OPTIONS_H_
