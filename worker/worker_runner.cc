#include "worker/worker_runner.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <ostream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/reader.h"
#include "common/status_macros.h"
#include "worker/internal/runner_util.h"
#include "worker/optimizer/sharded_optimizer.h"
#include "worker/optimizer/step_trace.h"
#include "worker/param_dump.h"
#include "worker/rank_session.h"
#include "worker/recovery_driver.h"
#include "worker/workload/workload_driver.h"

namespace muonshard::worker {
namespace {

using internal::Log;

// One rank's run on top of its RankSession (see worker_runner.h).
class WorkerRun {
 public:
  explicit WorkerRun(const WorkerOptions& options) : options_(options) {}

  absl::Status Run() {
    MUONSHARD_RETURN_IF_ERROR(StartSession());
    MUONSHARD_ASSIGN_OR_RETURN(workload_, internal::MakeWorkload(options_));
    absl::StatusOr<int64_t> first_step = Resume();
    absl::Status trained = first_step.ok() ? Train(*first_step) : first_step.status();
    while (!trained.ok()) {
      MUONSHARD_ASSIGN_OR_RETURN(const int64_t from, Recover(std::move(trained)));
      trained = Train(from);
    }
    MUONSHARD_RETURN_IF_ERROR(WriteStepTrace());
    MUONSHARD_RETURN_IF_ERROR(Dump());
    MUONSHARD_RETURN_IF_ERROR(session_->Finish());
    if (!options_.dump_params.empty() && rank() == 0) MUONSHARD_RETURN_IF_ERROR(MergeDump());
    Linger();
    return absl::OkStatus();
  }

 private:
  int rank() const { return session_->rank(); }
  int world() const { return session_->world_size(); }
  std::string Prefix() const { return absl::StrCat("rank ", rank(), ": "); }
  ShardedOptimizer& optimizer() { return session_->optimizer(); }

  // Why the run must stop before the next step, if it must.
  absl::Status CheckContinue(int64_t step) const {
    if (options_.stop != nullptr && options_.stop->HasBeenNotified()) {
      return absl::CancelledError(absl::StrCat("stopped by request before step ", step + 1));
    }
    return session_->health();
  }

  absl::Status Train(int64_t first_step) {
    const absl::Time start = absl::Now();
    const v1::RankView& view = session_->view();
    for (int64_t step = first_step; step < options_.steps; ++step) {
      MUONSHARD_RETURN_IF_ERROR(CheckContinue(step));
      const absl::Time t0 = step_started_ = absl::Now();
      absl::StatusOr<TrainStepResult> r = TrainStep(*workload_, optimizer(), step);
      if (!r.ok()) {
        failed_at_ = absl::Now();
        // Said at once: tearing down (the /metrics server's stop, leaving the
        // job) can take seconds before main() prints the error again.
        absl::Status failed = Annotate(r.status(), absl::StrCat("step ", step + 1));
        Log(options_) << Prefix() << "failed: " << failed << "\n";
        return failed;
      }
      const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
      session_->metrics().RecordStep(r->stats, r->loss, view.rank().ns_flops(), seconds);
      if (rank() == 0 && ((step + 1) % std::max(1, options_.log_every) == 0 || step + 1 == options_.steps)) {
        Log(options_) << Prefix() << internal::ProgressLine(step + 1, options_.steps, r->loss, seconds, &r->stats)
                      << "\n";
      }
      traced_.Add(step + 1, std::move(r->stats));
      absl::Status saved = MaybeSave(step + 1);
      if (saved.ok()) saved = session_->RefreshBuddyCopies(step + 1);
      if (!saved.ok()) {
        failed_at_ = absl::Now();
        return saved;
      }
    }
    Log(options_) << Prefix() << "trained " << std::max<int64_t>(0, options_.steps - first_step) << " step(s) in "
                  << absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))) << "\n";
    return absl::OkStatus();
  }

  // The workload's initial parameters, or with --resume the checkpoint's
  // state (a collective: the model copies are rebuilt with the step's own
  // sync); the step to go on from.
  absl::StatusOr<int64_t> Resume() {
    // With buddy copies every start takes part in the group's restore
    // negotiation: a replacement process must meet its peers there.
    if (!options_.resume && options_.buddy_every == 0) return Initialize();
    return Restore();
  }

  absl::StatusOr<int64_t> Initialize() {
    MUONSHARD_RETURN_IF_ERROR(InitializeParameters(*workload_, optimizer()));
    return 0;
  }

  // The newest state the group has: its buddy copies (NOTE [Buddy copies])
  // unless the newest checkpoint of checkpoint_dir is newer, that
  // checkpoint, or the initial parameters when there is neither.
  absl::StatusOr<int64_t> Restore() {
    int64_t on_disk = 0;
    if (!options_.checkpoint_dir.empty()) {
      absl::StatusOr<int64_t> latest = checkpoint::LatestStep(options_.checkpoint_dir);
      if (latest.ok()) on_disk = *latest;
    }
    MUONSHARD_ASSIGN_OR_RETURN(std::optional<int64_t> from_buddies, session_->RestoreFromBuddies(on_disk));
    if (from_buddies.has_value()) return *from_buddies;
    if (options_.checkpoint_dir.empty()) return Initialize();
    MUONSHARD_ASSIGN_OR_RETURN(std::optional<LoadedCheckpoint> loaded,
                               session_->LoadLatestCheckpoint(options_.checkpoint_dir));
    if (!loaded.has_value()) return Initialize();
    return loaded->step;
  }

  // RecoveryDriver::Start: started again while the group breaks under it.
  absl::Status StartSession() {
    MUONSHARD_ASSIGN_OR_RETURN(session_, recovery_.Start(options_, internal::MakeOptimizerConfig(options_)));
    return absl::OkStatus();
  }

  // NOTE [Recovery] (recovery_driver.h): the step to go on from, or the
  // error to end with.
  absl::StatusOr<int64_t> Recover(absl::Status failure) {
    RecoveryHooks hooks;
    hooks.restore = [this] { return Restore(); };
    MUONSHARD_ASSIGN_OR_RETURN(const Recovery r,
                               recovery_.Recover(*session_, std::move(failure), failed_at_ - step_started_, hooks));
    return r.step;
  }

  // After step `done`, when due: every rank writes its file, meets the others,
  // and rank 0 commits (index last, then the rename and `latest`).
  absl::Status MaybeSave(int64_t done) {
    if (options_.checkpoint_dir.empty()) return absl::OkStatus();
    const bool due = (options_.checkpoint_every > 0 && done % options_.checkpoint_every == 0) || done == options_.steps;
    if (!due) return absl::OkStatus();
    v1::OptimizerHyperParams hyper;
    (*hyper.mutable_extra())["workload"] = options_.workload;
    (*hyper.mutable_extra())["seed"] = absl::StrCat(options_.seed);
    hyper.set_lr(options_.lr);
    hyper.set_weight_decay(options_.weight_decay);
    return session_->SaveCheckpoint(options_.checkpoint_dir, done, hyper, options_.checkpoint_keep);
  }

  // NOTE [Step trace]: the last step_trace_steps steps, after training.
  absl::Status WriteStepTrace() {
    MUONSHARD_ASSIGN_OR_RETURN(const std::optional<std::string> path, traced_.Write(rank()));
    if (path.has_value()) {
      Log(options_) << Prefix() << "step trace of " << traced_.size() << " step(s): " << *path << "\n";
    }
    return absl::OkStatus();
  }

  // Part files, then (after RankSession::Finish's barrier) rank 0's merge.
  absl::Status Dump() {
    if (options_.dump_params.empty()) return absl::OkStatus();
    MUONSHARD_ASSIGN_OR_RETURN(const auto masters, optimizer().GatherMasters());
    const v1::RankView& view = session_->view();
    if (!WritesParts(view, optimizer().held_tensors())) return absl::OkStatus();
    MUONSHARD_ASSIGN_OR_RETURN(ParamsFile parts, RankParts(view, optimizer().held_tensors(), masters));
    return WriteParamsFile(PartFilePath(options_.dump_params, rank()), parts);
  }

  absl::Status MergeDump() {
    MUONSHARD_ASSIGN_OR_RETURN(const client::VersionedPlan* plan, session_->FullPlan());
    std::vector<ParamsFile> parts;
    std::vector<std::string> paths;
    for (int r = 0; r < world(); ++r) {
      const std::string path = PartFilePath(options_.dump_params, r);
      absl::StatusOr<ParamsFile> part = ReadParamsFile(path);
      if (part.status().code() == absl::StatusCode::kNotFound) continue;  // rank r writes no part
      if (!part.ok()) return part.status();
      parts.push_back(*std::move(part));
      paths.push_back(path);
    }
    absl::StatusOr<ParamsFile> merged = MergeParts(plan->plan, parts);
    if (!merged.ok()) {
      return Annotate(merged.status(), absl::StrCat("merging ", paths.size(), " part file(s) of ", options_.dump_params,
                                                    " (the parts must be on a file "
                                                    "system rank 0 sees)"));
    }
    const client::JoinedJob& j = session_->joined();
    merged->metadata = internal::DumpMetadata(options_, "sharded", session_->view().model(),
                                              session_->view().content_hash(), j.plan_version);
    merged->metadata["backend"] = options_.backend;
    MUONSHARD_RETURN_IF_ERROR(WriteParamsFile(options_.dump_params, *merged));
    for (const std::string& p : paths) std::remove(p.c_str());
    Log(options_) << Prefix() << "wrote " << merged->tensors.size() << " tensors (fp32 masters) to "
                  << options_.dump_params << "\n";
    return absl::OkStatus();
  }

  void Linger() {
    const int port = session_->metrics_port();
    if (options_.linger <= absl::ZeroDuration() || port < 0) return;
    Log(options_) << Prefix() << "serving /metrics on port " << port << " for up to "
                  << absl::FormatDuration(options_.linger) << "\n";
    if (options_.stop != nullptr) {
      options_.stop->WaitForNotificationWithTimeout(options_.linger);
    } else {
      absl::SleepFor(options_.linger);
    }
  }

  const WorkerOptions& options_;
  std::unique_ptr<RankSession> session_;
  std::unique_ptr<Workload> workload_;
  RecoveryDriver recovery_{options_.max_restarts};
  StepTraceLog traced_{options_.step_trace_dir, options_.step_trace_steps};  // NOTE [Step trace]
  absl::Time step_started_ = absl::Now();                                    // of the step being run
  absl::Time failed_at_ = absl::Now();                                       // when it failed
};

}  // namespace

absl::Status ValidateWorkerOptions(const WorkerOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(internal::ParseNsPrecision(options.ns_precision).status());
  if (options.workload != "regression" && options.workload != "synthetic") {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --workload: \"", options.workload, "\" is not regression or synthetic"));
  }
  if (options.reference) {
    if (options.dump_params.empty()) {
      return absl::InvalidArgumentError("flag --reference needs --dump-params (where to write its result)");
    }
    if (options.resume || !options.checkpoint_dir.empty()) {
      return absl::InvalidArgumentError("flags --checkpoint-dir / --resume are for sharded workers, not --reference");
    }
  }
  // The reference needs no job: the session's checks with one filled in.
  RankSessionOptions session = options;
  if (options.reference && session.job.empty()) session.job = "reference";
  MUONSHARD_RETURN_IF_ERROR(ValidateRankSessionOptions(session));
  if (options.steps < 0) return absl::InvalidArgumentError("flag --steps must be >= 0");
  if (options.resume && options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("flag --resume needs --checkpoint-dir");
  }
  if (options.max_restarts < 0) return absl::InvalidArgumentError("flag --max-restarts must be >= 0");
  if (options.max_restarts > 0 && !options.checkpoint_dir.empty() && !options.resume) {
    return absl::InvalidArgumentError(
        "flag --max-restarts with --checkpoint-dir needs --resume (a restarted process must restore the checkpoint "
        "its peers restore)");
  }
  if (options.min_workers > 0 && (options.checkpoint_dir.empty() || options.max_restarts == 0)) {
    return absl::InvalidArgumentError(
        "flag --min-workers (an elastic job) needs --checkpoint-dir (a resized group restores from it) and "
        "--max-restarts > 0");
  }
  if (options.checkpoint_every < 0) return absl::InvalidArgumentError("flag --checkpoint-every must be >= 0");
  if (options.checkpoint_keep < 0) return absl::InvalidArgumentError("flag --checkpoint-keep must be >= 0");
  absl::Status config = ValidateOptimizerConfig(internal::MakeOptimizerConfig(options));
  if (!config.ok()) return Annotate(config, "flags --lr / --weight-decay");
  return absl::OkStatus();
}

absl::Status RunWorker(const WorkerOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateWorkerOptions(options));
  return WorkerRun(options).Run();
}

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return 0;
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace muonshard::worker
