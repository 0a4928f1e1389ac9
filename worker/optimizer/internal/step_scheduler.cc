// StepScheduler: the open step, and the sequential schedule. The pipelined
// one is in step_scheduler_pipelined.cc.

#include "worker/optimizer/internal/step_scheduler.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/ns_batches.h"

namespace muonshard::worker::internal {
namespace {

class Stopwatch {
 public:
  double Lap() {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return seconds;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace

absl::StatusOr<std::unique_ptr<StepScheduler>> StepScheduler::Create(const StepParts& parts,
                                                                     const StepOptions& options) {
  if (options.muon_batch_mib < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step options: muon_batch_mib is ", options.muon_batch_mib));
  }
  auto scheduler = absl::WrapUnique(new StepScheduler(parts, options));
  MUONSHARD_RETURN_IF_ERROR(scheduler->InitPipeline());
  return scheduler;
}

StepScheduler::StepScheduler(const StepParts& parts, const StepOptions& options)
    : layout_(*parts.layout),
      backend_(*parts.backend),
      comms_(*parts.comms),
      params_(*parts.params),
      grads_(*parts.grads),
      updater_(*parts.updater),
      tp_(*parts.tp),
      options_(options),
      hand_off_(*parts.layout) {}

StepScheduler::~StepScheduler() { Cancel(absl::CancelledError("optimizer destroyed with a step open")); }

absl::Status StepScheduler::CheckNoOpenStep() const {
  if (!in_step_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("rank ", layout_.rank(), ": a step is open (BeginStep without FinishStep)"));
}

absl::Status StepScheduler::CheckOpen() const {
  if (in_step_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("rank ", layout_.rank(), ": no step open (call BeginStep first)"));
}

absl::Status StepScheduler::CheckNotHanded(const PartLayout& part) const {
  if (!hand_off_.handed(layout_.PartIndex(part))) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tensor \"", layout_.Spec(part).name(), "\": gradient already handed over in this step"));
}

absl::Status StepScheduler::CheckAllHandedOver() const {
  const int missing = hand_off_.FirstMissing();
  if (missing < 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("rank ", layout_.rank(), ": tensor \"",
                                                    layout_.Spec(layout_.index().parts[missing]).name(),
                                                    "\" was not handed over (GradReady) in this step"));
}

absl::Status StepScheduler::Begin() {
  MUONSHARD_RETURN_IF_ERROR(grads_.ZeroGaps());
  const std::vector<BucketKey> empty = hand_off_.Begin();
  recorder_.Begin(pipeline_ == nullptr ? 0 : pipeline_->lanes(), options_.trace, comms_.Snapshot());
  in_step_ = true;
  if (streamed_) {
    BeginStreamed();
  } else if (pipeline_ != nullptr) {
    pipeline_->Begin(3 * layout_.BucketCount());
    PostLaneOps();
  }
  for (const BucketKey& key : empty) BucketGradientsIn(key);
  return absl::OkStatus();
}

void StepScheduler::HandedOver(const PartLayout& part) {
  for (const BucketKey& key : hand_off_.HandOver(part)) BucketGradientsIn(key);
}

absl::StatusOr<StepStats> StepScheduler::Finish() {
  if (streamed_) return FinishStreamed();
  return pipeline_ == nullptr ? FinishSequential() : FinishPipelined();
}

void StepScheduler::Cancel(const absl::Status& reason) {
  if (in_step_ && pipeline_ != nullptr) {  // cancel the open step's lanes
    pipeline_->Fail(reason);
    (void)pipeline_->Finish();
  }
  // Collectives already issued on the streams would pair with the peers'
  // next ones: the group is broken.
  if (in_step_ && streamed_ && issued_any_) comms_.AbortAll(reason);
  in_step_ = false;
}

absl::Status StepScheduler::SyncFromMasters() {
  absl::Status s = params_.CastMastersToModel();
  if (s.ok()) s = backend_.Synchronize();
  if (s.ok()) s = RunCollectives(/*reduce=*/false);
  return s;
}

absl::StatusOr<StepStats> StepScheduler::FinishSequential() {
  in_step_ = false;
  const StepPhases phases = options_.phases;
  StepStats stats;
  Stopwatch phase;
  // The collectives run on the communicators' streams: the packed gradients
  // must have landed first.
  absl::Status s = backend_.Synchronize();
  if (s.ok() && phases != StepPhases::kComputeOnly) s = RunCollectives(/*reduce=*/true);
  MUONSHARD_RETURN_IF_ERROR(s);
  stats.reduce_seconds = phase.Lap();
  if (phases != StepPhases::kCommunicationOnly) {
    MUONSHARD_RETURN_IF_ERROR(RunMuon());
    stats.muon_seconds = phase.Lap();
    MUONSHARD_RETURN_IF_ERROR(RunAdamw());
    stats.adamw_seconds = phase.Lap();
  }
  if (phases != StepPhases::kComputeOnly) MUONSHARD_RETURN_IF_ERROR(RunCollectives(/*reduce=*/false));
  stats.sync_seconds = phase.Lap();
  return recorder_.Close(stats, comms_.Snapshot());
}

absl::Status StepScheduler::Collective(Communicator& comm, const BucketKey& key, int round, bool reduce) {
  if (round == kBucketCollective) return reduce ? grads_.ReduceBucket(comm, key) : params_.SyncBucket(comm, key);
  return reduce ? grads_.ReduceRound(comm, round) : params_.SyncRound(comm, round);
}

absl::Status StepScheduler::RunCollectives(bool reduce) {
  const StepSpan::Kind kind = reduce ? StepSpan::Kind::kReduce : StepSpan::Kind::kSync;
  return comms_.ForEach([&](int g, Communicator& comm) -> absl::Status {
    const std::vector<BucketKey> order = layout_.GroupBuckets(g);
    const std::vector<int> at = layout_.RoundCollectives(order);
    for (size_t i = 0; i < order.size(); ++i) {
      if (at[i] == kNoCollective) continue;
      MUONSHARD_RETURN_IF_ERROR(recorder_.Traced(kind, order[i], StepSpan::kCallerThread,
                                                 [&] { return Collective(comm, order[i], at[i], reduce); }));
    }
    return absl::OkStatus();
  });
}

absl::Status StepScheduler::RunMuon() {
  // The buckets with TP exchanges round by round, in one order on every rank
  // of the TP group (NOTE [TP exchange rounds]), then the others ascending,
  // batched across them (NOTE [Muon batches]) unless muon_batch_mib is 0.
  std::vector<int> others;
  for (int b = 0; b < layout_.view().muon_buckets_size(); ++b) {
    if (!tp_.Exchanges(b)) others.push_back(b);
  }
  std::vector<std::vector<int>> blocks;
  for (int b : tp_.order()) blocks.push_back({b});
  if (options_.muon_batch_mib > 0) {
    blocks.push_back(others);
  } else {
    for (int b : others) blocks.push_back({b});
  }
  const int64_t max_batch = planner::MuonBatchElements(options_.muon_batch_mib);
  for (const std::vector<int>& block : blocks) {
    // Traced where the rank updates a bucket of the block, in the first
    // one's span, as the pipelined schedule does (elsewhere the call does
    // nothing).
    auto update = [&] { return updater_.UpdateMuonBuckets(block, max_batch); };
    const auto it = absl::c_find_if(block, [&](int b) { return layout_.Updates({true, b}); });
    MUONSHARD_RETURN_IF_ERROR(
        it != block.end() ? recorder_.Traced(StepSpan::Kind::kUpdate, {true, *it}, StepSpan::kCallerThread, update)
                          : update());
  }
  return backend_.Synchronize();
}

absl::Status StepScheduler::RunAdamw() {
  for (int b = 0; b < layout_.view().adamw_buckets_size(); ++b) {
    MUONSHARD_RETURN_IF_ERROR(recorder_.Traced(StepSpan::Kind::kUpdate, {false, b}, StepSpan::kCallerThread,
                                               [&] { return updater_.UpdateAdamwBucket(b); }));
  }
  updater_.AdvanceBetaPows();
  return backend_.Synchronize();
}

}  // namespace muonshard::worker::internal
