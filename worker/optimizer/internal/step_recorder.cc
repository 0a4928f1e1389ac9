#include "worker/optimizer/internal/step_recorder.h"

#include <algorithm>

namespace muonshard::worker::internal {
namespace {

int64_t NanosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
}

double SecondsSince(std::chrono::steady_clock::time_point start) { return NanosSince(start) * 1e-9; }

double BusiestLane(const std::vector<int64_t>& nanos) {
  int64_t most = 0;
  for (int64_t n : nanos) most = std::max(most, n);
  return most * 1e-9;
}

}  // namespace

void StepRecorder::Begin(int lanes, bool trace, const StepCommBytes& comm_before) {
  comm_before_ = comm_before;
  start_ = std::chrono::steady_clock::now();
  tracing_ = trace;
  if (tracing_) started_wall_ = absl::Now();
  {
    absl::MutexLock lock(&spans_mu_);
    spans_.clear();  // a failed step's
  }
  reduce_ns_.assign(lanes, 0);
  sync_ns_.assign(lanes, 0);
  muon_seconds_ = 0;
  adamw_seconds_ = 0;
}

int64_t StepRecorder::NanosSinceStart() const { return NanosSince(start_); }

absl::Status StepRecorder::Traced(StepSpan::Kind kind, const BucketKey& key, int lane,
                                  absl::FunctionRef<absl::Status()> work) {
  if (!tracing_) return work();
  const int64_t start = NanosSinceStart();
  absl::Status s = work();
  const StepSpan span{kind, key.muon, key.bucket, lane, start, NanosSinceStart()};
  absl::MutexLock lock(&spans_mu_);
  spans_.push_back(span);
  return s;
}

absl::Status StepRecorder::TimedLane(bool reduce, const BucketKey& key, int lane,
                                     absl::FunctionRef<absl::Status()> work) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = Traced(reduce ? StepSpan::Kind::kReduce : StepSpan::Kind::kSync, key, lane, work);
  (reduce ? reduce_ns_ : sync_ns_)[lane] += NanosSince(start);
  return s;
}

absl::Status StepRecorder::TimedUpdate(const BucketKey& key, absl::FunctionRef<absl::Status()> work) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = Traced(StepSpan::Kind::kUpdate, key, StepSpan::kCallerThread, work);
  (key.muon ? muon_seconds_ : adamw_seconds_) += SecondsSince(start);
  return s;
}

StepStats StepRecorder::BusyTimes() const {
  StepStats stats;
  stats.reduce_seconds = BusiestLane(reduce_ns_);
  stats.muon_seconds = muon_seconds_;
  stats.adamw_seconds = adamw_seconds_;
  stats.sync_seconds = BusiestLane(sync_ns_);
  return stats;
}

StepStats StepRecorder::Close(StepStats stats, const StepCommBytes& comm_after) {
  stats.total_seconds = SecondsSince(start_);
  stats.comm.grad_reduce = comm_after.grad_reduce - comm_before_.grad_reduce;
  stats.comm.grad_reduce_scatter = comm_after.grad_reduce_scatter - comm_before_.grad_reduce_scatter;
  stats.comm.param_broadcast = comm_after.param_broadcast - comm_before_.param_broadcast;
  stats.comm.param_all_gather = comm_after.param_all_gather - comm_before_.param_all_gather;
  stats.comm.tp = comm_after.tp - comm_before_.tp;
  stats.comm.collectives = comm_after.collectives - comm_before_.collectives;
  if (tracing_) {
    tracing_ = false;
    stats.started = started_wall_;
    absl::MutexLock lock(&spans_mu_);
    stats.spans.swap(spans_);
    spans_.clear();
  }
  return stats;
}

}  // namespace muonshard::worker::internal
