#ifndef MUONSHARD_WORKER_RANK_SESSION_H_
#define MUONSHARD_WORKER_RANK_SESSION_H_

// RankSession: one rank of a training job with everything its optimizer step
// needs, as a library. muonshard-worker drives one with its synthetic and
// regression workloads (worker_runner.h); a training program embeds one
// through the Python package (python/muonshard), handing it the gradients
// of its own model. Both run the same code: there is no second
// implementation of the step.
//
// Start() does, in order:
//   0. With backend "nccl": checks that this process sees a CUDA device
//      before contacting anyone (FAILED_PRECONDITION in a build without
//      CUDA, UNAVAILABLE without a device), so a process that cannot run
//      never joins (and so never moves) the job.
//   1. Joins the job at the coordinator (client::CoordinatorSession: rank,
//      world size, generation, plan version and hash; heartbeats from then
//      on).
//   2. Fetches the rank's plan view, checks it is the job's
//      (client::FetchJoinedView) and hands it to options.check_view.
//   3. Serves /metrics (WorkerMetrics) on metrics_port + local rank.
//   4. Creates the kernel backend: "gloo", the CPU one (OpenBLAS, with the
//      thread budget below); "nccl", the CUDA one on the rank's device
//      (CudaDevice in worker_runner.h), so every optimizer buffer lives in
//      device memory.
//   5. Rendezvouses through the coordinator (client::GrpcRendezvousStore of
//      the job's generation): waits for every rank to join the generation
//      (a "group" barrier, bounded by comm_timeout), then creates one communicator per comm group of
//      more than one rank that holds this rank, in ascending group id on
//      every rank (so the blocking rendezvous cannot deadlock): "gloo", a
//      Gloo one, key prefix "<job>/<generation>/g<group id>/", with
//      reduce_order "rank" wrapped in a RankOrderCommunicator; "nccl", an
//      NCCL one on the rank's device and the CUDA backend's stream, key
//      prefix "<job>/<generation>/g<group id>/nccl/".
//   6. Creates the ShardedOptimizer on that backend. Its parameters are not
//      set: the caller sets every held tensor (ShardedOptimizer::
//      SetParameter) or loads a checkpoint before the first step.
//
// Checkpoints: SaveCheckpoint (every rank writes its file, all meet at a
// barrier, rank 0 commits) and LoadCheckpoint (each rank reads what its plan
// view needs from a checkpoint saved under any plan of the same model) are
// collectives over every rank of the job, like the step.
//
// NOTE [Recovery]: when the group breaks (a collective fails because a peer
// died, the generation moved because a peer froze, failed or reported an
// error), the caller reports the error (ReportError: the job moves to a new
// generation at once, peers learn why) and calls Recover(): the optimizer,
// the communicators and the rendezvous store of the old generation are
// destroyed, the membership is detached (not left: leaving would move the
// generation again) and the rank joins again with the same incarnation,
// which puts it into the job's new generation (a replacement process of a
// killed rank joins the same way and gets the free rank back; in an elastic
// job the coordinator may instead have re-planned the job for fewer or more
// ranks, and the rank, world and plan view change). It then waits up to the
// rejoin grace for every rank of the group (a "group" barrier in the
// new generation's store), re-creates the communicators and the optimizer,
// and the caller restores the optimizer state (LoadLatestCheckpoint). The
// kernel backend, /metrics and its counters live on across recoveries.
//
// Finish() ends a run cleanly: every rank meets the others (nobody leaves,
// and so moves the generation, while a peer still trains), then leaves. A
// session destroyed without Finish() leaves at once (its peers' next
// rendezvous or heartbeat then sees the generation move).
//
// Thread-compatible: one thread drives a session (the heartbeat thread and
// the /metrics server are internal). Members are destroyed in reverse
// creation order: the optimizer, then the communicators, then the store and
// the membership they bootstrapped through.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "checkpoint/reader.h"
#include "client/coordinator_client.h"
#include "client/coordinator_session.h"
#include "client/grpc_rendezvous_store.h"
#include "client/plan_source.h"
#include "common/clock.h"
#include "common/metrics_http.h"
#include "kernels/kernel_backend.h"
#include "muonshard/v1/checkpoint.pb.h"
#include "muonshard/v1/plan.pb.h"
#include "worker/buddy_copies.h"
#include "worker/comm/communicator.h"
#include "worker/metrics.h"
#include "worker/optimizer/optimizer_config.h"
#include "worker/optimizer/sharded_optimizer.h"

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
  // NOTE [Pipelined step] (sharded_optimizer.h): "auto" (pipelined with
  // gloo, sequential with nccl), "sequential" or "pipelined" (gloo only).
  std::string step_schedule = "auto";
  // Benchmarks only: "comm" / "compute" run one half of the step (StepPhases).
  std::string step_phases = "all";
  // NOTE [Step pieces] (internal/bucket_split.h): Muon buckets cut into
  // pieces of at most this many KiB of gradients; 0: the plan's buckets.
  // The same on every rank of a job.
  int step_piece_kib = 0;
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

// Whether the group broke and NOTE [Recovery] applies (ABORTED, UNAVAILABLE,
// DEADLINE_EXCEEDED); defined with the membership it is about.
using client::IsBrokenGroup;

// How long the phases of one recovery took (NOTE [Recovery]).
struct RecoveryTimes {
  absl::Duration abort;       // report the error, tear the old group down
  absl::Duration rendezvous;  // join again, wait for the group, communicators
};

// What a checkpoint load did.
struct LoadedCheckpoint {
  std::string step_dir;
  int64_t step = 0;
  std::string plan_hash;  // the plan it was saved under
  int world_size = 0;     // ... and that plan's world size
  int64_t bytes_read = 0;
};

class RankSession {
 public:
  // Steps 0-6 above. Possible errors: INVALID_ARGUMENT (options, config),
  // FAILED_PRECONDITION (nccl in a build without CUDA; a plan version or
  // view that is not the job's), UNAVAILABLE (coordinator; nccl without a
  // device), ABORTED (the generation moved during the rendezvous),
  // DEADLINE_EXCEEDED (peers did not arrive within comm_timeout), the
  // optimizer's errors. A failed start reports its error before leaving
  // (ReportError), so the error is the job's first failure when another
  // rank's ended the job (NOTE [Job failure]).
  static absl::StatusOr<std::unique_ptr<RankSession>> Start(const RankSessionOptions& options,
                                                            const OptimizerConfig& config);

  RankSession(const RankSession&) = delete;
  RankSession& operator=(const RankSession&) = delete;
  ~RankSession();

  // What the last JoinJob answered (Recover joins again).
  const client::JoinedJob& joined() const { return joined_; }
  int rank() const { return joined().rank; }
  int world_size() const { return joined().world_size; }
  int local_rank() const { return options_.local_rank >= 0 ? options_.local_rank : rank(); }
  const v1::RankView& view() const { return view_; }
  const RankSessionOptions& options() const { return options_; }
  // False after a failed Recover: no communicators, no optimizer (the
  // methods that need them then fail FAILED_PRECONDITION; optimizer() must
  // not be called).
  bool has_group() const { return optimizer_ != nullptr; }
  ShardedOptimizer& optimizer() { return *optimizer_; }
  const ShardedOptimizer& optimizer() const { return *optimizer_; }
  WorkerMetrics& metrics() { return *metrics_; }
  // The /metrics port, or -1 when not serving.
  int metrics_port() const;
  // OK while the membership holds; ABORTED once the job's generation moved.
  absl::Status health() const;
  // The BLAS threads of the CPU backend (0 for nccl); the CUDA device (-1
  // for gloo).
  int blas_threads() const { return blas_threads_; }
  int cuda_device() const { return cuda_device_; }
  // "3 Gloo communicator(s) (reduce order ring), 42 tensor parts, optimizer
  // state N bytes (plan N), 1 BLAS thread(s)".
  std::string Describe() const;

  // The job's whole plan and its canonical request, fetched once.
  absl::StatusOr<const client::VersionedPlan*> FullPlan();

  // Every rank sets "<name>/<rank>" in the rendezvous store and waits for
  // every rank's key, each wait bounded by comm_timeout.
  absl::Status Barrier(const std::string& name);

  // Saves the optimizer's state as checkpoint step `step` of `dir`: every
  // rank writes its file, all meet, rank 0 commits (index, rename,
  // `latest`). `hyper_params` goes into the index. A collective.
  // `keep_last` > 0: rank 0 then deletes all but the newest keep_last
  // complete steps of `dir` (best-effort). Each phase is timed into
  // muonshard_worker_checkpoint_seconds{phase}; success sets
  // muonshard_worker_checkpoint_last_success_timestamp_seconds
  // (options.clock), a failure counts
  // muonshard_worker_checkpoint_failures_total.
  absl::Status SaveCheckpoint(const std::string& dir, int64_t step, const v1::OptimizerHyperParams& hyper_params,
                              int keep_last = 0);

  // Tells the coordinator this rank's step failed with `error`, so the job
  // moves to a new generation now and the peers' next heartbeat carries the
  // message (CoordinatorSession::ReportError); an error that is not a broken
  // group's ends the job (NOTE [Job failure]). Returns the error this rank
  // ends with if it gives up: the job's failure when another rank's error
  // ended it first, else `error`. A failed report is logged (the peers then
  // learn at the heartbeat timeout) and `error` returned.
  absl::Status ReportError(const absl::Status& error);

  // NOTE [Recovery]; the wait for the group is `grace`, else
  // options.rejoin_grace (zero: comm_timeout), twice that for an elastic
  // job. Possible errors: Start()'s (ABORTED when the generation moved again
  // meanwhile; DEADLINE_EXCEEDED when the group did not re-form in time).
  absl::StatusOr<RecoveryTimes> Recover(std::optional<absl::Duration> grace = std::nullopt);

  // LoadCheckpoint of the newest committed checkpoint of `dir`; nullopt
  // (nothing loaded) when `dir` holds none. Every rank must see the same
  // directory (the commit protocol needs a shared file system anyway).
  absl::StatusOr<std::optional<LoadedCheckpoint>> LoadLatestCheckpoint(const std::string& dir);

  // NOTE [Buddy copies]: after step `done`, when due (a collective over
  // every rank of the job). Possible errors: the channel's.
  absl::Status RefreshBuddyCopies(int64_t done);
  // Restores the group's newest step held in buddy copies, when there is one
  // no older than `at_least` (a collective: every rank decides alike); the
  // step restored, or nullopt (nothing restored: the caller loads its
  // checkpoint). Possible errors: the store's and the channel's.
  absl::StatusOr<std::optional<int64_t>> RestoreFromBuddies(int64_t at_least);

  // Loads step `step` (default: the latest) of `dir` into the optimizer,
  // whatever plan and world size it was saved under (reshard on load), and
  // rebuilds every model copy from the loaded masters. A collective.
  // Possible errors: NOT_FOUND (no checkpoint), DATA_LOSS (damaged),
  // INVALID_ARGUMENT (another model), the communicators' codes.
  absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir, std::optional<int64_t> step = std::nullopt);

  // The end of a run (see above). Idempotent.
  absl::Status Finish();

 private:
  RankSession(const RankSessionOptions& options, const OptimizerConfig& config);

  absl::Status Run();
  absl::Status CheckDevices();
  // incarnation 0: a new one (a new process). Recover passes its own and
  // `recovering`: the job's plan and whatever rank the coordinator gives
  // (an elastic resize renumbers), not the flags'.
  absl::Status Join(uint64_t incarnation = 0, bool recovering = false);
  absl::Status StartMetrics();
  absl::Status WritePortFile() const;
  // Destroys the optimizer, communicators and store and detaches the
  // membership (NOTE [Recovery]).
  void TearDownGroup();
  absl::Status OpenStore();
  absl::Status CheckGroup() const;
  // SaveCheckpoint's phases: this rank's file, then (rank 0, after the
  // barrier) the commit.
  absl::Status WriteCheckpointFile(const std::string& dir, int64_t step, const std::string& save_id);
  absl::Status CommitSave(const std::string& dir, int64_t step, const std::string& save_id,
                          const v1::OptimizerHyperParams& hyper_params, int keep_last);
  // LoadCheckpoint of a checkpoint already opened.
  absl::StatusOr<LoadedCheckpoint> LoadOpened(checkpoint::Checkpoint ckpt);
  // A "group" barrier in the generation's store: every rank has joined it
  // (on a recovery, the survivors and any replacement process alike).
  absl::Status WaitForGroup(absl::Duration timeout);
  absl::Status CreateBackend();
  absl::Status CreateCommunicators();
  absl::Status CreateCommunicator(const v1::CommGroup& group);
  absl::Status CreateBuddyChannel();
  absl::Status CreateOptimizer();
  std::ostream& Log() const;
  std::string Prefix() const;
  bool nccl() const { return options_.backend == "nccl"; }
  // NOTE [Prompt aborts]: the heartbeat thread calls OnMembershipLost when
  // the job's generation moves (a peer failed, froze or left); every
  // communicator is aborted then, so a rank waiting in a collective for a
  // frozen peer returns ABORTED within a heartbeat period instead of at
  // comm_timeout. Communicators created afterwards are aborted at once.
  void OnMembershipLost(const absl::Status& status);
  // `abort` (a communicator's or the buddy channel's Abort) runs at once
  // when the membership is already lost, else when it is.
  void AbortOnLoss(std::function<void(const absl::Status&)> abort);

  const RankSessionOptions options_;
  const OptimizerConfig config_;
  // Before session_, whose heartbeat thread uses them until it is joined.
  absl::Mutex abort_mu_;
  std::vector<std::function<void(const absl::Status&)>> abortable_ ABSL_GUARDED_BY(abort_mu_);
  absl::Status lost_ ABSL_GUARDED_BY(abort_mu_);
  bool closing_ ABSL_GUARDED_BY(abort_mu_) = false;
  std::unique_ptr<client::CoordinatorClient> client_;
  std::unique_ptr<client::PlanSource> plan_source_;
  std::unique_ptr<client::CoordinatorSession> session_;  // null after a failed re-join
  client::JoinedJob joined_;
  std::string device_identity_;  // the JoinJob identity, fixed at the first join
  v1::RankView view_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<MetricsHttpServer> server_;
  int cuda_devices_ = 0;  // nccl: visible CUDA devices
  int cuda_device_ = -1;  // nccl: this rank's
  int blas_threads_ = 0;  // gloo
  // Before the communicators: NCCL ones enqueue on its stream, so it must
  // be destroyed after them.
  std::unique_ptr<kernels::KernelBackend> backend_;
  std::unique_ptr<client::GrpcRendezvousStore> store_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::unique_ptr<ByteChannel> buddy_channel_;  // NOTE [Buddy copies]
  ShardedOptimizer::CommGroups comm_groups_;
  std::unique_ptr<ShardedOptimizer> optimizer_;
  std::unique_ptr<client::VersionedPlan> full_plan_;
  std::optional<absl::Status> finished_;
  // Outlives recoveries: what it holds is what a recovery restores from.
  BuddyCopies buddies_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_RANK_SESSION_H_
