// muonshardctl commands that talk to a running muonshard-coordinator:
// submit, get, list, watch, diff, workers, health.
//
// Exit codes: see ExitCodeForRpc in cli_common.h (the one table of them);
// the status message goes to stderr.
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "cli/cli_common.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "cli/plan_table.h"
#include "client/coordinator_calls.h"
#include "client/coordinator_client.h"
#include "common/grpc_status.h"
#include "common/proto_json.h"
#include "common/quote.h"

namespace muonshard::cli {
namespace {

using client::ConnectionOptions;
using client::CoordinatorClient;

int ReportRpcError(const absl::Status& status, RpcLimits limits = RpcLimits::kServerCapacity) {
  std::cerr << "error: " << status.message() << " [" << absl::StatusCodeToString(status.code()) << "]\n";
  return ExitCodeForRpc(status, limits);
}

// The coordinator's limit on job names (job_registry.cc, kMaxNameBytes).
constexpr size_t kMaxJobBytes = 256;

// A longer --job cannot name a job, and the coordinator would quote it whole
// in its reply (past gRPC's metadata limit) or a watch would echo it.
absl::Status CheckJobFlag(const std::string& job) {
  if (job.size() <= kMaxJobBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "flag --job: ", QuoteBounded(job), " is longer than the coordinator's limit of ", kMaxJobBytes, " bytes"));
}

// Flags every coordinator command shares, and the parsed client.
struct Common {
  ConnectionOptions connection;
  std::string output = "table";
  std::unique_ptr<CoordinatorClient> client;

  void Register(FlagSet& flags, bool with_output = true) {
    connection.Register(flags);
    if (with_output) flags.String("output", &output, "table | json");
  }

  // -1 to continue, or the exit code.
  int Parse(FlagSet& flags, const std::vector<std::string>& args, std::vector<std::string>* positional,
            size_t max_positional) {
    if (int rc = ParseFlagsOrExit(flags, args, positional); rc >= 0) return rc;
    if (positional->size() > max_positional) {
      return ReportError(
          absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", (*positional)[max_positional], "\"")));
    }
    if (absl::Status s = CheckOutputFormat(output); !s.ok()) return ReportError(s);
    absl::StatusOr<std::unique_ptr<CoordinatorClient>> c = CoordinatorClient::Connect(connection);
    if (!c.ok()) return ReportError(c.status());
    client = *std::move(c);
    return -1;
  }

  bool json() const { return output == "json"; }
};

std::string FormatTime(int64_t micros) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixMicros(micros), absl::UTCTimeZone());
}

std::string ShortHash(const std::string& hash) {
  return hash.size() > 19 ? hash.substr(0, 19) : hash;  // "sha256:" + 12 hex digits
}

void PrintInfoLine(const v1::PlanVersionInfo& info, std::ostream& out) {
  out << absl::StrFormat("version %d  created %s  model %s  world %s  tensors %s  hash %s\n", info.version(),
                         FormatTime(info.create_time_micros()), info.model(),
                         WithThousands(info.topology().world_size()), WithThousands(info.tensors()),
                         info.content_hash());
}

// ---------------------------------------------------------------- get

// The rank's summary, then its Muon tensors and its AdamW slices (each
// says "none" rather than print an empty table).
void PrintRankView(const v1::RankView& view, std::ostream& out) {
  const v1::RankPlan& r = view.rank();
  out << absl::StrFormat("rank %d  stage %d  ep %d  sharding rank %d  moe sharding rank %d  groups %d\n", r.rank(),
                         r.stage(), r.ep_rank(), r.sharding_rank(), r.moe_sharding_rank(), view.groups_size());
  out << absl::StrFormat("optimizer state %s MiB  ns %s GFLOP  muon elems %s  adamw elems %s (shard %s)\n",
                         Mib(r.optimizer_state_bytes()), Gflop(r.ns_flops(), 2), WithThousands(r.muon_numel()),
                         WithThousands(r.adamw_numel()), WithThousands(r.adamw_shard_numel()));
  if (r.has_memory()) out << "memory (MiB)  " << MemoryTerms(r.memory()) << "\n";
  out << absl::StrFormat("bytes/step  reduce %s  reduce-scatter %s  broadcast %s  all-gather %s\n",
                         WithThousands(r.grad_reduce_bytes()), WithThousands(r.grad_reduce_scatter_bytes()),
                         WithThousands(r.param_broadcast_bytes()), WithThousands(r.param_all_gather_bytes()));
  if (r.owned_size() == 0) {
    out << "\nowned (muon): none\n";
  } else {
    out << absl::StrFormat("\nowned (muon): %s\n%-60s %10s %14s %12s %7s\n", WithThousands(r.owned_size()), "tensor",
                           "matrices", "elements", "ns_GFLOP", "bucket");
  }
  for (const v1::OwnedTensor& o : r.owned()) {
    out << absl::StrFormat("%-60s %4d..%-5d %14s %12s %7d\n", o.name(), o.matrix_begin(), o.matrix_end(),
                           WithThousands(o.numel()), Gflop(o.ns_flops(), 3), o.bucket());
  }
  if (r.slices_size() == 0) {
    out << "\nslices (adamw): none\n";
  } else {
    out << absl::StrFormat("\nslices (adamw): %s\n%-60s %14s %14s %8s %7s\n", WithThousands(r.slices_size()), "tensor",
                           "begin", "end", "padding", "bucket");
  }
  for (const v1::TensorSlice& s : r.slices()) {
    out << absl::StrFormat("%-60s %14s %14s %8s %7d\n", s.name(), WithThousands(s.begin()), WithThousands(s.end()),
                           WithThousands(s.padding()), s.bucket());
  }
}

}  // namespace

int RunGet(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl get [--version V] [--rank R | --sort KEY --top N] [--output table|json]\n"
      "         [--coordinator HOST:PORT] [--tls-ca F] [--token-file F]");
  Common c;
  c.Register(flags);
  int64_t version = 0;
  int rank = -1;
  flags.Int("version", &version, "plan version (0 = latest)");
  flags.Int("rank", &rank, "print only this rank's view");
  RowOrder rows;
  RegisterRankOrder(flags, &rows);
  std::vector<std::string> positional;
  if (int rc = c.Parse(flags, args, &positional, 0); rc >= 0) return rc;
  if (version < 0) return ReportError(absl::InvalidArgumentError("flag --version must be >= 0"));
  if (absl::Status s = CheckRankOrder(rows, c.output); !s.ok()) return ReportError(s);
  if (flags.WasSet("rank") && rows.given()) {
    return ReportError(absl::InvalidArgumentError(
        absl::StrCat("get --rank prints one rank; ", !rows.sort.empty() ? "--sort" : "--top", " is not used")));
  }
  v1::GetPlanRequest request;
  request.set_version(version);
  if (flags.WasSet("rank")) request.set_rank(rank);
  absl::StatusOr<v1::GetPlanResponse> got = client::GetPlan(*c.client, request);
  if (!got.ok()) return ReportRpcError(got.status());
  const v1::GetPlanResponse& response = *got;
  if (c.json()) {
    if (response.has_rank_view()) return PrintJson(response.rank_view());
    return PrintJson(response.plan());
  }
  PrintInfoLine(response.info(), std::cout);
  if (response.has_rank_view()) {
    PrintRankView(response.rank_view(), std::cout);
  } else {
    PrintPlanTable(response.plan(), rows, std::cout);
  }
  return kExitOk;
}

int RunSubmit(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl submit --manifest M.json --world-size W [--pp P] [--ep E]\n"
      "         [--policy seed|seed-all|balanced] [--comm-buffer-mb 256] [--output table|json]\n"
      "         [--coordinator HOST:PORT] [--tls-ca F] [--token-file F]");
  Common c;
  c.Register(flags);
  PlanFlags plan_flags;
  plan_flags.Register(flags);
  std::vector<std::string> positional;
  if (int rc = c.Parse(flags, args, &positional, 0); rc >= 0) return rc;
  absl::StatusOr<v1::PlanRequest> plan_request = plan_flags.ToRequest();
  if (!plan_request.ok()) return ReportError(plan_request.status());
  absl::StatusOr<v1::SubmitPlanResponse> submitted = client::SubmitPlan(*c.client, *plan_request);
  if (!submitted.ok()) {
    const int rc = ReportRpcError(submitted.status(), RpcLimits::kOnTheRequest);
    PrintFitHint(submitted.status(), *plan_request);
    return rc;
  }
  const v1::SubmitPlanResponse& response = *submitted;
  if (c.json()) return PrintJson(response);
  std::cout << absl::StrFormat("version %d %s\n", response.version(),
                               response.created() ? "created" : "(identical request already stored)");
  PrintInfoLine(response.info(), std::cout);
  return kExitOk;
}

namespace {

// The count and latest version, then one row per version.
void PrintVersionList(const v1::ListPlansResponse& all, std::ostream& out) {
  if (all.versions_size() == 0) {
    out << "no plan versions stored\n";
    return;
  }
  out << absl::StrFormat("%s, latest v%d\n\n", Count(all.versions_size(), "plan version", "plan versions"),
                         all.latest_version());
  out << absl::StrFormat("%8s  %-20s  %-20s %6s %3s %3s %-9s %8s %9s  %s\n", "version", "created", "model", "world",
                         "pp", "ep", "policy", "tensors", "max/mean", "hash");
  for (const v1::PlanVersionInfo& v : all.versions()) {
    out << absl::StrFormat("%8d  %-20s  %-20s %6s %3d %3d %-9s %8s %9.3f  %s\n", v.version(),
                           FormatTime(v.create_time_micros()), v.model(), WithThousands(v.topology().world_size()),
                           v.topology().pp(), v.topology().ep(), v1::Policy_Name(v.policy()),
                           WithThousands(v.tensors()), v.stats().max_over_mean_state_bytes(),
                           ShortHash(v.content_hash()));
  }
}

}  // namespace

int RunList(const std::vector<std::string>& args) {
  FlagSet flags("usage: muonshardctl list [--output table|json] [--coordinator HOST:PORT] [--tls-ca F]");
  Common c;
  c.Register(flags);
  std::vector<std::string> positional;
  if (int rc = c.Parse(flags, args, &positional, 0); rc >= 0) return rc;
  v1::ListPlansResponse all;
  v1::ListPlansRequest request;
  for (int page = 0; page < 100000; ++page) {  // bounded: 10k versions per page
    v1::ListPlansResponse response;
    auto ctx = c.client->NewContext();
    absl::Status s = client::FromGrpcStatus(c.client->stub().ListPlans(ctx.get(), request, &response));
    if (!s.ok()) return ReportRpcError(s);
    all.set_latest_version(response.latest_version());
    for (v1::PlanVersionInfo& v : *response.mutable_versions()) *all.add_versions() = std::move(v);
    if (response.next_after_version() == 0) break;
    request.set_after_version(response.next_after_version());
  }
  if (c.json()) return PrintJson(all);
  PrintVersionList(all, std::cout);
  return kExitOk;
}

namespace {

std::string EventLine(const v1::WatchEvent& e) {
  if (e.has_plan()) {
    const v1::PlanVersionInfo& p = e.plan();
    return absl::StrFormat("plan version=%d model=%s world=%d tensors=%d hash=%s", p.version(), p.model(),
                           p.topology().world_size(), p.tensors(), p.content_hash());
  }
  const v1::JobEvent& j = e.job();
  std::string line = absl::StrFormat("job %s revision=%d %s generation=%d plan=%d", j.job(), j.revision(),
                                     v1::JobEventType_Name(j.type()), j.generation(), j.plan_version());
  if (j.has_worker()) {
    absl::StrAppend(&line, " rank=", j.worker().rank(), " host=", j.worker().host(), " device=", j.worker().device());
  }
  if (j.type() == v1::JOB_EVENT_SNAPSHOT) absl::StrAppend(&line, " workers=", j.workers_size());
  if (!j.reason().empty()) absl::StrAppend(&line, " reason=\"", j.reason(), "\"");
  return line;
}

}  // namespace

int RunWatch(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl watch [--from-version V] [--job J [--from-job-revision R]]\n"
      "         [--count N] [--output table|json] [--coordinator HOST:PORT]\n"
      "Streams plan versions (from the latest, or after --from-version) and the job's\n"
      "events, one per line, until interrupted or --count events were printed.");
  Common c;
  c.Register(flags);
  int64_t from_version = 0;
  int64_t from_job_revision = 0;
  int64_t count = 0;
  v1::WatchRequest request;
  flags.Int("from-version", &from_version, "stream versions after this one (default: from the latest)");
  flags.String("job", request.mutable_job(), "also stream this job's membership events");
  flags.Int("from-job-revision", &from_job_revision, "resume the job's events after this revision");
  flags.Int("count", &count, "exit after this many events (0 = never)");
  std::vector<std::string> positional;
  if (int rc = c.Parse(flags, args, &positional, 0); rc >= 0) return rc;
  if (absl::Status s = CheckJobFlag(request.job()); !s.ok()) return ReportError(s);
  if (flags.WasSet("from-version")) request.set_from_version(from_version);
  request.set_from_job_revision(from_job_revision);
  auto ctx = c.client->NewContext(/*streaming=*/true);
  std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader = c.client->stub().Watch(ctx.get(), request);
  v1::WatchEvent event;
  int64_t seen = 0;
  while ((count == 0 || seen < count) && reader->Read(&event)) {
    ++seen;
    if (c.json()) {
      absl::StatusOr<std::string> line = ToJson(event, /*pretty=*/false);
      if (line.ok()) {
        std::cout << *line << std::endl;
      } else {
        std::cerr << "error: " << line.status().message() << "\n";  // stdout stays JSON lines
      }
    } else {
      std::cout << EventLine(event) << std::endl;
    }
  }
  if (count > 0 && seen >= count) {
    ctx->TryCancel();
    reader->Finish();  // CANCELLED, as asked
    return kExitOk;
  }
  absl::Status s = client::FromGrpcStatus(reader->Finish());
  return s.ok() ? kExitOk : ReportRpcError(s);
}

int RunDiff(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl diff V1 V2 [--limit N] [--output table|json] [--coordinator HOST:PORT]\n"
      "Which tensors change owner (Muon) or slice (AdamW) from version V1 to V2.");
  Common c;
  c.Register(flags);
  int limit = 100;
  flags.Int("limit", &limit, "list at most this many tensors (0 = all); counts cover all");
  std::vector<std::string> positional;
  if (int rc = c.Parse(flags, args, &positional, 2); rc >= 0) return rc;
  int64_t versions[2] = {0, 0};
  if (positional.size() != 2 || !absl::SimpleAtoi(positional[0], &versions[0]) ||
      !absl::SimpleAtoi(positional[1], &versions[1]) || versions[0] <= 0 || versions[1] <= 0) {
    return ReportError(absl::InvalidArgumentError("diff takes two plan versions (integers >= 1)"));
  }
  v1::DiffPlansRequest request;
  request.set_from_version(versions[0]);
  request.set_to_version(versions[1]);
  request.set_limit(limit);
  v1::DiffPlansResponse response;
  auto ctx = c.client->NewContext();
  absl::Status s = client::FromGrpcStatus(c.client->stub().DiffPlans(ctx.get(), request, &response));
  if (!s.ok()) return ReportRpcError(s);
  if (c.json()) return PrintJson(response.diff());
  PrintPlanDiff(response.diff(), limit, std::cout);
  return kExitOk;
}

namespace {

// The workers table's columns over `job` (referenced); `now` in Unix
// microseconds ages the heartbeats. --sort keys: rank (the default), state,
// generation, heartbeat (the oldest first).
std::vector<Column> WorkerColumns(const v1::JobStatus& job, int64_t now) {
  const auto w = [&job](int i) -> const v1::WorkerStatus& { return job.workers(i); };
  const auto age_s = [w, now](int i) { return (now - w(i).last_heartbeat_micros()) / 1e6; };
  return {
      {"rank", 6, [w](int i) { return absl::StrCat(w(i).rank()); }, "rank", SortOrder::kAscending,
       [w](int i) { return w(i).rank(); }},
      {"state", -8, [w](int i) { return v1::WorkerState_Name(w(i).state()).substr(sizeof("WORKER_STATE_") - 1); },
       "state", SortOrder::kAscending, [w](int i) { return w(i).state(); }},
      {"host", -24, [w](int i) { return w(i).host(); }},
      {"device", -10, [w](int i) { return w(i).device(); }},
      {"incarnation", 20, [w](int i) { return absl::StrCat(w(i).incarnation()); }},
      {"generation", 10, [w](int i) { return absl::StrCat(w(i).generation()); }, "generation", SortOrder::kAscending,
       [w](int i) { return w(i).generation(); }},
      {"heartbeat_s", 12, [age_s](int i) { return FixedWithThousands(age_s(i), 1); }, "heartbeat",
       SortOrder::kLargestFirst, age_s},
  };
}

// The job's line (and why it failed or moved, its elasticity, a failed resize), then
// its workers in `rows` order.
void PrintJob(const v1::JobStatus& job, int64_t now, const RowOrder& rows, std::ostream& out) {
  out << absl::StrFormat("job %s  generation %d  plan v%d  world %s  revision %d\n", job.job(), job.generation(),
                         job.plan_version(), WithThousands(job.world_size()), job.revision());
  // Why the job is at this generation (a failure, a report, a resize), and
  // its elasticity: what an operator looks for first.
  if (job.has_failure()) {  // NOTE [Job failure]: the reason every rank ended with
    out << "  failed (" << absl::StatusCodeToString(static_cast<absl::StatusCode>(job.failure().code()))
        << "): " << job.failure().reason() << "\n";
  } else if (!job.generation_reason().empty()) {
    out << "  moved: " << job.generation_reason() << "\n";
  }
  if (job.min_workers() > 0) {
    out << absl::StrFormat("  elastic: %d..%d ranks\n", job.min_workers(), job.max_world_size());
  }
  if (!job.resize_error().empty()) out << "  resize failed: " << job.resize_error() << "\n";
  if (job.workers_size() == 0) {
    out << "  no workers\n";
    return;
  }
  PrintTable(WorkerColumns(job, now), job.workers_size(), rows, "workers", out);
}

}  // namespace

int RunWorkers(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl workers [--job J] [--sort KEY] [--top N] [--output table|json]\n"
      "         [--coordinator HOST:PORT]");
  Common c;
  c.Register(flags);
  std::string job;
  flags.String("job", &job, "only this job (default: every job)");
  RowOrder rows;
  rows.Register(flags, WorkerColumns(v1::JobStatus::default_instance(), 0));
  std::vector<std::string> positional;
  if (int rc = c.Parse(flags, args, &positional, 0); rc >= 0) return rc;
  if (absl::Status s = CheckJobFlag(job); !s.ok()) return ReportError(s);
  if (absl::Status s = rows.Check(WorkerColumns(v1::JobStatus::default_instance(), 0), c.output); !s.ok()) {
    return ReportError(s);
  }
  absl::StatusOr<v1::ListWorkersResponse> listed = client::ListWorkers(*c.client, job);
  if (!listed.ok()) return ReportRpcError(listed.status());
  const v1::ListWorkersResponse& response = *listed;
  if (c.json()) return PrintJson(response);
  if (response.jobs_size() == 0) {
    std::cout << "no jobs\n";
    return kExitOk;
  }
  const int64_t now = absl::ToUnixMicros(absl::Now());
  for (int i = 0; i < response.jobs_size(); ++i) {
    if (i > 0) std::cout << "\n";
    PrintJob(response.jobs(i), now, rows, std::cout);
  }
  return kExitOk;
}

int RunHealth(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl health [--service NAME] [--coordinator HOST:PORT] [--tls-ca F]\n"
      "Prints the grpc.health.v1 status; exit 0 when SERVING, 1 otherwise.");
  Common c;
  c.Register(flags, /*with_output=*/false);
  std::string service = "muonshard.v1.Coordinator";
  flags.String("service", &service, "service to check (\"\" = the whole server)");
  std::vector<std::string> positional;
  if (int rc = c.Parse(flags, args, &positional, 0); rc >= 0) return rc;
  absl::StatusOr<std::string> status = c.client->CheckHealth(service);
  if (!status.ok()) return ReportRpcError(status.status());
  std::cout << *status << "\n";
  return *status == "SERVING" ? kExitOk : kExitFailure;
}

}  // namespace muonshard::cli
