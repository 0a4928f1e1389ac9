#include "worker/metrics_endpoint.h"

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "worker/internal/runner_util.h"

namespace muonshard::worker {

MetricsEndpoint::MetricsEndpoint(const RankSessionOptions& options) : options_(options) {}

absl::Status MetricsEndpoint::Start(const client::JoinedJob& joined, const v1::RankView& view, int local_rank) {
  metrics_ = std::make_unique<WorkerMetrics>(joined.job, joined.rank);
  metrics_->SetPlan(view, joined.plan_version, joined.generation);
  if (options_.metrics_port >= 0) {
    const int wanted = options_.metrics_port == 0 ? 0 : options_.metrics_port + local_rank;
    MUONSHARD_ASSIGN_OR_RETURN(server_, MetricsHttpServer::Start(options_.metrics_host, wanted, metrics_->registry(),
                                                                 /*num_threads=*/1));
    internal::Log(options_) << "rank " << joined.rank << ": metrics on http://" << options_.metrics_host << ":"
                            << server_->port() << "/metrics\n";
  }
  return WritePortFile(joined);
}

absl::Status MetricsEndpoint::Rejoined(const client::JoinedJob& joined, const v1::RankView& view) {
  metrics_->SetPlan(view, joined.plan_version, joined.generation);
  return WritePortFile(joined);
}

absl::Status MetricsEndpoint::WritePortFile(const client::JoinedJob& j) const {
  if (options_.port_file.empty()) return absl::OkStatus();
  return WriteFileAtomic(options_.port_file, absl::StrCat("{\"rank\": ", j.rank, ", \"metrics_port\": ", port(),
                                                          ", \"generation\": ", j.generation,
                                                          ", \"plan_version\": ", j.plan_version, "}\n"));
}

}  // namespace muonshard::worker
