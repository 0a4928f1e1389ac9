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
// NOTE [Prompt aborts]: the heartbeat thread reports when the job's
// generation moves (a peer failed, froze or left); every communicator (and
// the buddy channel) is aborted then, so a rank waiting in a collective for
// a frozen peer returns ABORTED within a heartbeat period instead of at
// comm_timeout. Communicators created afterwards are aborted at once
// (AbortOnLoss, abort_on_loss.h).
//
// Parts, one role each, wired together by reference (the session owns them
// and orchestrates start, recovery and finish):
//   RankMembership      rank_membership.h      steps 1-2, error reports, leave
//   MetricsEndpoint     metrics_endpoint.h     step 3 and the port file
//   RankGroup           rank_group.h           steps 0 and 4-6, barriers
//   SessionCheckpoints  session_checkpoints.h  save and load
//   SessionBuddies      session_buddies.h      NOTE [Buddy copies]
//   AbortOnLoss         abort_on_loss.h        NOTE [Prompt aborts]
//
// Thread-compatible: one thread drives a session (the heartbeat thread and
// the /metrics server are internal). Members are destroyed in reverse
// creation order: the optimizer, then the communicators, then the store
// (the group), then /metrics, then the membership they bootstrapped
// through.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator_session.h"
#include "client/joined_job.h"
#include "client/plan_source.h"
#include "muonshard/v1/checkpoint.pb.h"
#include "muonshard/v1/plan.pb.h"
#include "worker/abort_on_loss.h"
#include "worker/metrics.h"
#include "worker/metrics_endpoint.h"
#include "worker/optimizer/optimizer_config.h"
#include "worker/optimizer/sharded_optimizer.h"
#include "worker/rank_group.h"
#include "worker/rank_membership.h"
#include "worker/rank_session_options.h"
#include "worker/session_buddies.h"
#include "worker/session_checkpoints.h"

namespace muonshard::worker {

// Whether the group broke and NOTE [Recovery] applies (ABORTED, UNAVAILABLE,
// DEADLINE_EXCEEDED); defined with the membership it is about.
using client::IsBrokenGroup;

// How long the phases of one recovery took (NOTE [Recovery]).
struct RecoveryTimes {
  absl::Duration abort;       // report the error, tear the old group down
  absl::Duration rendezvous;  // join again, wait for the group, communicators
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
  const client::JoinedJob& joined() const { return membership_.joined(); }
  int rank() const { return joined().rank; }
  int world_size() const { return joined().world_size; }
  int local_rank() const { return membership_.local_rank(); }
  const v1::RankView& view() const { return membership_.view(); }
  const RankSessionOptions& options() const { return options_; }
  // False after a failed Recover: no communicators, no optimizer (the
  // methods that need them then fail FAILED_PRECONDITION; optimizer() must
  // not be called).
  bool has_group() const { return group_.formed(); }
  ShardedOptimizer& optimizer() { return group_.optimizer(); }
  const ShardedOptimizer& optimizer() const { return group_.optimizer(); }
  WorkerMetrics& metrics() { return endpoint_.metrics(); }
  // The /metrics port, or -1 when not serving.
  int metrics_port() const { return endpoint_.port(); }
  // OK while the membership holds; ABORTED once the job's generation moved.
  absl::Status health() const { return membership_.health(); }
  // The BLAS threads of the CPU backend (0 for nccl); the CUDA device (-1
  // for gloo).
  int blas_threads() const { return group_.blas_threads(); }
  int cuda_device() const { return group_.cuda_device(); }
  // "3 Gloo communicator(s) (reduce order ring), 42 tensor parts, optimizer
  // state N bytes (plan N), 1 BLAS thread(s)".
  std::string Describe() const { return group_.Describe(); }

  // The job's whole plan and its canonical request, fetched once.
  absl::StatusOr<const client::VersionedPlan*> FullPlan() { return membership_.FullPlan(); }

  // Every rank sets "<name>/<rank>" in the rendezvous store and waits for
  // every rank's key, each wait bounded by comm_timeout.
  absl::Status Barrier(const std::string& name) { return group_.Barrier(name); }

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
                              int keep_last = 0) {
    return checkpoints_.Save(dir, step, hyper_params, keep_last);
  }

  // Tells the coordinator this rank's step failed with `error`, so the job
  // moves to a new generation now and the peers' next heartbeat carries the
  // message (CoordinatorSession::ReportError); an error that is not a broken
  // group's ends the job (NOTE [Job failure]). Returns the error this rank
  // ends with if it gives up: the job's failure when another rank's error
  // ended it first, else `error`. A failed report is logged (the peers then
  // learn at the heartbeat timeout) and `error` returned.
  absl::Status ReportError(const absl::Status& error) { return membership_.ReportError(error); }

  // NOTE [Recovery]; the wait for the group is `grace`, else
  // options.rejoin_grace (zero: comm_timeout), twice that for an elastic
  // job. Possible errors: Start()'s (ABORTED when the generation moved again
  // meanwhile; DEADLINE_EXCEEDED when the group did not re-form in time).
  absl::StatusOr<RecoveryTimes> Recover(std::optional<absl::Duration> grace = std::nullopt);

  // LoadCheckpoint of the newest committed checkpoint of `dir`; nullopt
  // (nothing loaded) when `dir` holds none. Every rank must see the same
  // directory (the commit protocol needs a shared file system anyway).
  absl::StatusOr<std::optional<LoadedCheckpoint>> LoadLatestCheckpoint(const std::string& dir) {
    return checkpoints_.LoadLatest(dir);
  }

  // NOTE [Buddy copies]: after step `done`, when due (a collective over
  // every rank of the job). Possible errors: the channel's.
  absl::Status RefreshBuddyCopies(int64_t done) { return buddies_.Refresh(done); }
  // Restores the group's newest step held in buddy copies, when there is one
  // no older than `at_least` (a collective: every rank decides alike); the
  // step restored, or nullopt (nothing restored: the caller loads its
  // checkpoint). Possible errors: the store's and the channel's.
  absl::StatusOr<std::optional<int64_t>> RestoreFromBuddies(int64_t at_least) { return buddies_.Restore(at_least); }

  // Loads step `step` (default: the latest) of `dir` into the optimizer,
  // whatever plan and world size it was saved under (reshard on load), and
  // rebuilds every model copy from the loaded masters. A collective.
  // Possible errors: NOT_FOUND (no checkpoint), DATA_LOSS (damaged),
  // INVALID_ARGUMENT (another model), the communicators' codes.
  absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir, std::optional<int64_t> step = std::nullopt) {
    return checkpoints_.Load(dir, step);
  }

  // The end of a run (see above). Idempotent.
  absl::Status Finish();

 private:
  RankSession(const RankSessionOptions& options, const OptimizerConfig& config);

  absl::Status Run();
  // Steps 5-6 in the membership's generation, waiting up to `wait` for the
  // group; the optimizer's state bytes into /metrics.
  absl::Status FormGroup(absl::Duration wait);

  const RankSessionOptions options_;
  const OptimizerConfig config_;
  // Before membership_, whose heartbeat thread uses it until it is joined.
  AbortOnLoss aborts_;
  RankMembership membership_;
  // Lives on across recoveries, as do its counters.
  MetricsEndpoint endpoint_;
  // After the membership: the optimizer, the communicators and the store go
  // before it (a peer that sees this rank leave aborts its own
  // collectives). Its backend lives on across recoveries.
  RankGroup group_;
  SessionCheckpoints checkpoints_;
  // Outlives recoveries: what it holds is what a recovery restores from.
  SessionBuddies buddies_;
  std::optional<absl::Status> finished_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_RANK_SESSION_H_
