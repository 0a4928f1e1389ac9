#ifndef MUONSHARD_WORKER_METRICS_ENDPOINT_H_
#define MUONSHARD_WORKER_METRICS_ENDPOINT_H_

// MetricsEndpoint: a RankSession's /metrics (step 3 of rank_session.h): its
// WorkerMetrics, served over HTTP on options.metrics_host:(metrics_port +
// local rank), and the port file that tells scripts where
// (options.port_file: {"rank": R, "metrics_port": M, "generation": G,
// "plan_version": V}). The metrics and the server live on across recoveries
// (NOTE [Recovery]); a re-join only updates the plan gauges and the port
// file.
//
// Thread-compatible: the session's thread drives it (the server's threads
// are internal; WorkerMetrics is thread-safe). `options` must outlive it.

#include <memory>

#include "absl/status/status.h"
#include "client/joined_job.h"
#include "common/metrics_http.h"
#include "muonshard/v1/plan.pb.h"
#include "worker/metrics.h"
#include "worker/rank_session_options.h"

namespace muonshard::worker {

class MetricsEndpoint {
 public:
  explicit MetricsEndpoint(const RankSessionOptions& options);
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Creates the metrics of `joined`'s job and rank with the plan of `view`,
  // serves them on metrics_port + `local_rank` (metrics_port 0: a free port;
  // negative: not served) and writes the port file. Possible errors: the
  // server's (UNAVAILABLE: cannot bind), the port file's.
  absl::Status Start(const client::JoinedJob& joined, const v1::RankView& view, int local_rank);
  // After a re-join (NOTE [Recovery]): the plan gauges and the port file
  // say `joined`'s generation and plan version.
  absl::Status Rejoined(const client::JoinedJob& joined, const v1::RankView& view);

  // REQUIRES: Start() ran.
  WorkerMetrics& metrics() { return *metrics_; }
  // The /metrics port, or -1 when not serving.
  int port() const { return server_ != nullptr ? server_->port() : -1; }

 private:
  absl::Status WritePortFile(const client::JoinedJob& joined) const;

  const RankSessionOptions& options_;
  std::unique_ptr<WorkerMetrics> metrics_;
  // After metrics_: the server reads its registry until destroyed.
  std::unique_ptr<MetricsHttpServer> server_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_METRICS_ENDPOINT_H_
