#ifndef MUONSHARD_CLIENT_COORDINATOR_SESSION_H_
#define MUONSHARD_CLIENT_COORDINATOR_SESSION_H_

// CoordinatorSession: one worker process's membership of a job. Join()
// registers with the coordinator (JoinJob, retried with bounded exponential
// backoff while the coordinator is unreachable), a background thread then
// heartbeats at a third of the coordinator's heartbeat timeout, and Leave()
// (or the destructor) stops it and leaves the job.
//
// Generations: the coordinator answers a heartbeat with ABORTED once the
// job's generation has moved past the one this worker joined (a member
// failed, reported an error or left; see NOTE [Membership state machine] in
// coordinator/job_registry.h). The session then stops heartbeating
// and health() reports ABORTED with the coordinator's reason; the worker's
// group is broken. It recovers by Detach()ing this session and joining
// again with the same incarnation, which moves it into the new generation
// (worker::RankSession::Recover), or stops.
// Transient heartbeat failures (UNAVAILABLE, DEADLINE_EXCEEDED) are retried
// at the next period; if they last past the heartbeat timeout the
// coordinator marks the worker failed and the next answer is ABORTED.
//
// Coordinator restarts: a restarted coordinator has no membership in memory,
// so a heartbeat finds the job (NOT_FOUND) or the rank (FAILED_PRECONDITION)
// unknown. The session then re-registers (JoinJob with adopt_generation,
// NOTE [Adoption] in coordinator.proto): the coordinator takes the job back
// at the same generation and training goes on untouched. When it refuses
// (ABORTED: the job moved on) the membership is lost as above.
//
// Clock: the heartbeat schedule (common/periodic_thread.h) and the back-off
// of the join's and the error report's retries (common/retry.h) read the
// injected Clock. On a clock other than the real one its waits are cut into
// short real-time slices that re-read the clock (Clock::WaitUntil), so a
// FakeClock that a test advances (without notifying anyone) drives
// heartbeats and retries deterministically.
//
// Thread-safe, except Leave() and the destructor, which belong to the
// owning thread. *client and options.clock must outlive the session.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "client/joined_job.h"
#include "common/clock.h"
#include "common/periodic_thread.h"

namespace muonshard::client {

// Whether `status` (from a step, a checkpoint save, a rendezvous or a
// recovery) means the group broke and NOTE [Recovery] in
// worker/rank_session.h applies: ABORTED (the generation moved, a peer's
// connection closed, an abort), UNAVAILABLE (the coordinator or a peer
// unreachable), DEADLINE_EXCEEDED (a peer did not answer in time).
bool IsBrokenGroup(const absl::Status& status);

// Whether a worker that gives up with `error` ends its job (NOTE [Job
// failure] in coordinator/job_registry.h): an error with a reason
// that a restarted process would meet again (bad input, mismatched options,
// a missing file or checkpoint, a refused plan: INVALID_ARGUMENT,
// NOT_FOUND, FAILED_PRECONDITION, ...). Not a broken group's, not
// CANCELLED (a requested stop), and not INTERNAL / UNKNOWN: a fault of the
// process itself (a CUDA error, a crash-like bug), which a replacement
// process recovers from as after a kill.
bool EndsJob(const absl::Status& error);

struct SessionOptions {
  std::string job;
  std::string host;    // identity of the worker's machine
  std::string device;  // unique per worker process on `host` (e.g. "cpu:3")
  // Random per process start; 0 draws one.
  uint64_t incarnation = 0;
  std::optional<int> rank;   // unset: the coordinator picks the lowest free
  int64_t plan_version = 0;  // 0: the job's (the first joiner takes the latest)
  // NOTE [Elastic jobs] (coordinator.proto): > 0 makes the job elastic down
  // to this many ranks; rejoin_grace (zero: the coordinator's default) is
  // how long it waits for missing ranks before shrinking.
  int min_workers = 0;
  absl::Duration rejoin_grace;

  // JoinJob answered UNAVAILABLE (coordinator not up yet, restarting) is
  // retried after initial_backoff, doubling up to max_backoff, until
  // join_timeout has passed on `clock` since the first attempt. Other errors
  // are final.
  absl::Duration join_timeout = absl::Seconds(30);
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  // Zero: a third of the coordinator's heartbeat timeout.
  absl::Duration heartbeat_period = absl::ZeroDuration();
  Clock* clock = RealClock();
  // Called once, on the heartbeat thread, with health() when the membership
  // is lost (the generation moved: ABORTED; the coordinator no longer knows
  // this worker): whoever waits on the group (a collective) learns at the
  // next heartbeat, not at its own timeout. Must not block or call back
  // into the session.
  std::function<void(const absl::Status&)> on_lost;
};

class CoordinatorSession {
 public:
  // Joins and starts heartbeating.
  // Possible errors: INVALID_ARGUMENT (empty job/host, bad rank or version),
  // FAILED_PRECONDITION (plan version differs from the job's — the message
  // names both — job full, no plan submitted), NOT_FOUND (unknown plan
  // version), ALREADY_EXISTS (rank held), UNAVAILABLE (coordinator
  // unreachable for join_timeout), UNAUTHENTICATED.
  static absl::StatusOr<std::unique_ptr<CoordinatorSession>> Join(CoordinatorClient* client,
                                                                  const SessionOptions& options);

  CoordinatorSession(const CoordinatorSession&) = delete;
  CoordinatorSession& operator=(const CoordinatorSession&) = delete;
  // Stops the heartbeat thread and leaves the job unless Leave() ran.
  ~CoordinatorSession();

  const JoinedJob& joined() const { return joined_; }

  // OK while the membership holds. ABORTED once a heartbeat was answered
  // ABORTED (the generation moved); FAILED_PRECONDITION / NOT_FOUND when the
  // coordinator no longer knows this worker. Sticky.
  absl::Status health() const;
  // Heartbeats answered so far (any answer), for tests and logs.
  int64_t heartbeats() const;
  // Times the membership was re-registered with a restarted coordinator.
  int64_t adoptions() const;

  // Tells the coordinator this worker's step failed with `error` (the
  // ReportError RPC) so the job moves to a new generation now and its peers
  // learn why at their next heartbeat. Retried while the coordinator is
  // unreachable, up to the join timeout. Returns the job's generation after
  // the report and why it is there (for a rank whose collective failed
  // because a peer went away: that peer's own report). An error that is not
  // a broken group's ends the job (NOTE [Job failure]). Possible errors: the
  // RPC's.
  struct Reported {
    int64_t generation = 0;
    std::string reason;
    // When another worker's error ended the job: that error (its code, "rank
    // R (...) failed: ..."), which every rank ends with. OK otherwise.
    absl::Status failure;
  };
  absl::StatusOr<Reported> ReportError(const absl::Status& error);

  // Stops heartbeating without leaving: the worker is about to join again
  // with the same incarnation (a new generation of the same membership).
  // Leave() is then a no-op. Idempotent.
  void Detach();

  // Stops heartbeating and leaves the job (LeaveJob). Idempotent: later
  // calls return the first call's result.
  // Possible errors: the RPC's (the coordinator then notices the silence).
  absl::Status Leave();

 private:
  CoordinatorSession(CoordinatorClient* client, const SessionOptions& options, JoinedJob joined);

  // One tick of the heartbeat thread (a period after the last answer):
  // false when the membership is lost, which ends the thread.
  bool Heartbeat();
  absl::Status SendHeartbeat();
  // A heartbeat found the job or the rank unknown: re-registers (see above).
  absl::Status Adopt();
  // Records an answer; false when it ends the loop (a terminal error).
  bool Record(const absl::Status& status);
  void StopHeartbeats();

  CoordinatorClient* const client_;  // not owned
  Clock* const clock_;               // not owned
  const JoinedJob joined_;
  const std::string host_;
  const std::string device_;
  const absl::Duration join_timeout_;
  const absl::Duration period_;
  const std::function<void(const absl::Status&)> on_lost_;

  mutable absl::Mutex mu_;
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  int64_t heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t adoptions_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::Status> left_ ABSL_GUARDED_BY(mu_);
  PeriodicThread heartbeat_thread_;  // last: started once the fields above are set
};

}  // namespace muonshard::client

#endif  // MUONSHARD_CLIENT_COORDINATOR_SESSION_H_
