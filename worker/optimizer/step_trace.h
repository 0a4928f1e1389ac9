#ifndef MUONSHARD_WORKER_OPTIMIZER_STEP_TRACE_H_
#define MUONSHARD_WORKER_OPTIMIZER_STEP_TRACE_H_

// Traced steps (NOTE [Step trace] in step_stats.h) as Chrome trace-event
// JSON, the format chrome://tracing and Perfetto open: one process per rank
// (pid = rank), one row for the steps, one for the caller's thread, one per
// communication lane; an "X" event per span, at wall-clock microseconds so
// that the files of several ranks line up (as far as their clocks agree).

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/optimizer/step_stats.h"

namespace muonshard::worker {

// "reduce", "update", "sync".
const char* StepSpanKindName(StepSpan::Kind kind);

struct TracedStep {
  int64_t step = 0;  // 1-based, as the worker's progress lines count
  StepStats stats;   // started, total_seconds and spans are used
};

// {"displayTimeUnit": "ms", "traceEvents": [...]}: metadata naming the
// process and its rows, then per step a "step N" event and one event per
// span, named "<kind> <muon|adamw> <bucket>", with step, bucket and kind in
// its args.
std::string StepTraceJson(int rank, absl::Span<const TracedStep> steps);

// The last `keep` traced steps of a rank and their file in `dir`: what
// muonshard-worker --step-trace-dir and muonshard.torch's step_trace_dir
// write. An empty `dir` turns it off.
class StepTraceLog {
 public:
  StepTraceLog(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

  bool enabled() const { return !dir_.empty(); }
  int size() const { return static_cast<int>(steps_.size()); }

  // Keeps the step when enabled, dropping the oldest beyond `keep`.
  void Add(int64_t step, StepStats stats);

  // Writes StepTraceJson to <dir>/step-trace-rank<rank>.json (atomically,
  // creating dir) and returns the path; nothing when not enabled. Errors:
  // the file system's, naming the path.
  absl::StatusOr<std::optional<std::string>> Write(int rank) const;

 private:
  std::string dir_;
  int keep_;
  std::deque<TracedStep> steps_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_OPTIMIZER_STEP_TRACE_H_
