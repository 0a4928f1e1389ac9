#include "coordinator/event_log.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace muonshard::coordinator {
namespace {

std::string Worker(const v1::WorkerStatus& w) {
  return absl::StrCat("rank ", w.rank(), " (", w.host(), w.device().empty() ? "" : "/", w.device(), ", incarnation ",
                      w.incarnation(), ")");
}

// `text` with control characters escaped: a reported error (a stack trace)
// must not break the one-line-per-change log.
std::string OneLine(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += absl::StrFormat("\\x%02x", u);
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

void LogLine(absl::string_view line) {
  std::string out =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), " ", line, "\n");
  // One write(2) per line keeps lines from different threads whole.
  ssize_t unused = write(STDERR_FILENO, out.data(), out.size());
  (void)unused;
}

void EventLog::OnPlanCreated(const v1::PlanVersionInfo& info, absl::Duration compute) {
  LogLine(
      absl::StrFormat("plan v%d created: model=%s world=%d tensors=%d hash=%s compute=%s stored=%d bytes "
                      "state max/mean=%.3f",
                      info.version(), info.model(), info.topology().world_size(), info.tensors(), info.content_hash(),
                      absl::FormatDuration(compute), info.stored_bytes(), info.stats().max_over_mean_state_bytes()));
}

void EventLog::OnJobEvent(const v1::JobEvent& e, const WorkerCounts& counts) {
  std::string what;
  switch (e.type()) {
    case v1::JOB_EVENT_WORKER_JOINED:
      what = absl::StrCat(Worker(e.worker()), " joined generation ", e.worker().generation(),
                          e.reason().empty() ? "" : absl::StrCat(" (", e.reason(), ")"));
      break;
    case v1::JOB_EVENT_WORKER_LEFT:
      what = absl::StrCat(Worker(e.worker()), " left");
      break;
    case v1::JOB_EVENT_WORKER_FAILED:
      what = absl::StrCat(Worker(e.worker()), " failed: ", e.reason());
      break;
    case v1::JOB_EVENT_GENERATION_CHANGED:
      what = absl::StrCat("generation -> ", e.generation(), ": ", e.reason());
      break;
    case v1::JOB_EVENT_ERROR_REPORTED:
      what = absl::StrCat(Worker(e.worker()), " reported: ", e.reason());
      break;
    default:
      what = v1::JobEventType_Name(e.type());
      break;
  }
  LogLine(OneLine(absl::StrCat("job \"", e.job(), "\": ", what, " [plan v", e.plan_version(), ", ", counts.joined, "/",
                               e.world_size(), " joined, generation ", e.generation(), "]")));
}

void EventLog::OnStoreHealth(bool healthy, const absl::Status& cause) {
  // Transitions only: a store failing every probe would otherwise log one
  // line per probe interval.
  LogLine(healthy ? std::string("store commits again (health SERVING)")
                  : OneLine(absl::StrCat("store cannot commit (health NOT_SERVING until a write "
                                         "commits): ",
                                         cause.ToString())));
}

}  // namespace muonshard::coordinator
