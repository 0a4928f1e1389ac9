#include "worker/optimizer/step_trace.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace muonshard::worker {
namespace {

// Rows (trace "threads") of a rank.
constexpr int kStepRow = 0;
constexpr int kCallerRow = 1;
int RowOf(int lane) { return lane == StepSpan::kCallerThread ? kCallerRow : 2 + lane; }

std::string Micros(double us) { return absl::StrFormat("%.3f", us); }

std::string RowName(int rank, int row, const std::string& name) {
  return absl::StrCat(R"({"ph":"M","pid":)", rank, R"(,"tid":)", row, R"(,"name":"thread_name","args":{"name":")", name,
                      R"("}})");
}

std::string Metadata(int rank, absl::Span<const TracedStep> steps) {
  std::set<int> lanes;
  for (const TracedStep& t : steps) {
    for (const StepSpan& s : t.stats.spans) {
      if (s.lane != StepSpan::kCallerThread) lanes.insert(s.lane);
    }
  }
  std::vector<std::string> events = {
      absl::StrCat(R"({"ph":"M","pid":)", rank, R"(,"name":"process_name","args":{"name":"rank )", rank, R"("}})"),
      RowName(rank, kStepRow, "steps"), RowName(rank, kCallerRow, "caller thread")};
  for (int lane : lanes) events.push_back(RowName(rank, RowOf(lane), absl::StrCat("comm lane ", lane)));
  return absl::StrJoin(events, ",\n");
}

std::string Event(int rank, int row, const std::string& name, const char* category, double ts_us, double dur_us,
                  const std::string& args) {
  return absl::StrCat(R"({"ph":"X","pid":)", rank, R"(,"tid":)", row, R"(,"name":")", name, R"(","cat":")", category,
                      R"(","ts":)", Micros(ts_us), R"(,"dur":)", Micros(dur_us), R"(,"args":{)", args, "}}");
}

std::string SpanEvent(int rank, int64_t step, double origin_us, const StepSpan& s) {
  const char* kind = StepSpanKindName(s.kind);
  const char* buffer = s.muon ? "muon" : "adamw";
  return Event(rank, RowOf(s.lane), absl::StrCat(kind, " ", buffer, " ", s.bucket), kind, origin_us + s.start_ns * 1e-3,
               std::max<int64_t>(0, s.end_ns - s.start_ns) * 1e-3,
               absl::StrCat(R"("step":)", step, R"(,"bucket":)", s.bucket, R"(,"buffer":")", buffer, R"(")"));
}

}  // namespace

const char* StepSpanKindName(StepSpan::Kind kind) {
  switch (kind) {
    case StepSpan::Kind::kReduce:
      return "reduce";
    case StepSpan::Kind::kUpdate:
      return "update";
    case StepSpan::Kind::kSync:
      return "sync";
  }
  return "?";
}

std::string StepTraceJson(int rank, absl::Span<const TracedStep> steps) {
  std::vector<std::string> events = {Metadata(rank, steps)};
  for (const TracedStep& t : steps) {
    const double origin_us = absl::ToDoubleMicroseconds(t.stats.started - absl::UnixEpoch());
    events.push_back(Event(rank, kStepRow, absl::StrCat("step ", t.step), "step", origin_us,
                           t.stats.total_seconds * 1e6, absl::StrCat(R"("step":)", t.step)));
    for (const StepSpan& s : t.stats.spans) events.push_back(SpanEvent(rank, t.step, origin_us, s));
  }
  return absl::StrCat("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", absl::StrJoin(events, ",\n"), "\n]}\n");
}

void StepTraceLog::Add(int64_t step, StepStats stats) {
  if (!enabled()) return;
  steps_.push_back({step, std::move(stats)});
  while (static_cast<int>(steps_.size()) > keep_) steps_.pop_front();
}

absl::StatusOr<std::optional<std::string>> StepTraceLog::Write(int rank) const {
  if (!enabled()) return std::nullopt;
  std::error_code error;
  std::filesystem::create_directories(dir_, error);
  if (error) return absl::FailedPreconditionError(absl::StrCat("step trace directory ", dir_, ": ", error.message()));
  const std::string path = absl::StrCat(dir_, "/step-trace-rank", rank, ".json");
  const std::vector<TracedStep> steps(steps_.begin(), steps_.end());
  MUONSHARD_RETURN_IF_ERROR(WriteFileAtomic(path, StepTraceJson(rank, steps)));
  return path;
}

}  // namespace muonshard::worker
