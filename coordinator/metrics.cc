#include "coordinator/metrics.h"

#include <exception>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "plan/plan_stats.h"

namespace muonshard::coordinator {
namespace {

constexpr int kNumColours = 3;  // v1::Colour values

prometheus::Gauge& PlainGauge(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

prometheus::Family<prometheus::Gauge>& BuildGaugeFamily(prometheus::Registry& r, const std::string& name,
                                                        const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}

std::string ColourLabel(v1::Colour c) { return absl::AsciiStrToLower(v1::Colour_Name(c)); }

// The PlanStats ratios in the order of CoordinatorMetrics::imbalance_.
std::array<double, 6> Ratios(const v1::PlanStats& s) {
  return {s.memory_imbalance(), s.max_over_mean_state_bytes(), s.max_over_lb_state_bytes(),
          s.flops_imbalance(),  s.max_over_mean_ns_flops(),    s.max_over_lb_ns_flops()};
}

// Name suffixes and help of the six ratio gauges, as imbalance_.
constexpr std::array<std::pair<const char*, const char*>, 6> kRatios = {{
    {"memory_imbalance_ratio", "(max - min) / max of per-rank optimizer state"},
    {"memory_max_over_mean_ratio", "max / mean of per-rank optimizer state"},
    {"memory_max_over_lower_bound_ratio", "max / lower bound of per-rank optimizer state"},
    {"flops_imbalance_ratio", "(max - min) / max of per-rank Newton-Schulz FLOPs"},
    {"flops_max_over_mean_ratio", "max / mean of per-rank Newton-Schulz FLOPs"},
    {"flops_max_over_lower_bound_ratio", "max / lower bound of per-rank Newton-Schulz FLOPs"},
}};

// `base` with one more label.
prometheus::Labels With(prometheus::Labels base, const std::string& name, std::string value) {
  base[name] = std::move(value);
  return base;
}

// JOB_EVENT_ERROR_REPORTED -> "error_reported".
std::string EventTypeLabel(v1::JobEventType t) {
  return absl::AsciiStrToLower(absl::StripPrefix(v1::JobEventType_Name(t), "JOB_EVENT_"));
}

}  // namespace

const char* RpcName(Rpc rpc) {
  static constexpr const char* kNames[kNumRpcs] = {"SubmitPlan", "GetPlan",   "ListPlans", "DiffPlans",   "Watch",
                                                   "JoinJob",    "Heartbeat", "LeaveJob",  "ReportError", "ListWorkers",
                                                   "SetKey",     "GetKey",    "WaitKeys"};
  return kNames[static_cast<int>(rpc)];
}

std::vector<RankColourLoad> RankColourLoads(const v1::Plan& plan) {
  const int n = plan.ranks_size();
  std::vector<std::array<RankColourLoad, kNumColours>> load(n);
  std::vector<std::array<bool, kNumColours>> member(n, {false, false, false});
  for (const v1::CommGroup& g : plan.groups()) {
    for (int r : g.ranks()) member.at(r)[g.colour()] = true;
  }
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      RankColourLoad& l = load.at(r.rank())[plan.tensors(o.tensor()).colour()];
      l.state_bytes += o.numel() * planner::MuonStateBytesPerElem(plan.tensors(o.tensor()).dtype());
      l.ns_flops += o.ns_flops();
    }
  }
  for (const v1::AdamwBucket& b : plan.adamw_buckets()) {
    const v1::CommGroup& g = plan.groups(b.group());
    for (int i = 0; i < g.ranks_size(); ++i) {
      load.at(g.ranks(i))[g.colour()].state_bytes +=
          (b.shard_offsets(i + 1) - b.shard_offsets(i)) * planner::AdamwStateBytesPerElem(b.dtype());
    }
  }
  std::vector<RankColourLoad> out;
  for (int r = 0; r < n; ++r) {
    for (int c = 1; c < kNumColours; ++c) {
      if (!member[r][c]) continue;
      RankColourLoad l = load[r][c];
      l.rank = r;
      l.colour = static_cast<v1::Colour>(c);
      out.push_back(l);
    }
  }
  return out;
}

std::array<std::pair<const char*, int64_t>, kNumMemoryTerms> MemoryTerms(const v1::RankMemory& m) {
  return {{{"model", m.model_bytes()},
           {"grad", m.grad_bytes()},
           {"master", m.master_bytes()},
           {"muon_momentum", m.muon_momentum_bytes()},
           {"adamw_moment", m.adamw_moment_bytes()},
           {"comm_buffer", m.comm_buffer_bytes()},
           {"ns_workspace", m.ns_workspace_bytes()},
           {"total", m.total_bytes()}}};
}

void CoordinatorMetrics::SeriesSet::Add(GaugeFamily& family, const prometheus::Labels& labels, double value) {
  prometheus::Gauge& g = family.Add(labels);
  g.Set(value);
  series_.emplace_back(&family, &g);
}

void CoordinatorMetrics::SeriesSet::RemoveAll() {
  for (const auto& [family, gauge] : series_) family->Remove(gauge);
  series_.clear();
}

void CoordinatorMetrics::AddRankSeries(const RankFamilies& families, const prometheus::Labels& base,
                                       const v1::Plan& plan, const std::vector<RankColourLoad>& loads, SeriesSet& out) {
  for (const RankColourLoad& l : loads) {
    const prometheus::Labels labels = With(With(base, "rank", absl::StrCat(l.rank)), "colour", ColourLabel(l.colour));
    out.Add(*families.state_bytes, labels, static_cast<double>(l.state_bytes));
    out.Add(*families.ns_flops, labels, l.ns_flops);
  }
  for (const v1::RankPlan& r : plan.ranks()) {
    const prometheus::Labels labels = With(base, "rank", absl::StrCat(r.rank()));
    for (const auto& [term, bytes] : MemoryTerms(r.memory())) {
      out.Add(*families.memory, With(labels, "term", term), static_cast<double>(bytes));
    }
    if (r.memory().capacity_bytes() > 0) {
      out.Add(*families.headroom, labels, static_cast<double>(r.memory().headroom_bytes()));
    }
  }
}

CoordinatorMetrics::CoordinatorMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      versions_created_(prometheus::BuildCounter()
                            .Name("muonshard_plan_versions_total")
                            .Help("Plan versions created by this coordinator process")
                            .Register(*registry_)
                            .Add({})),
      latest_version_(PlainGauge(*registry_, "muonshard_plan_latest_version", "Newest stored plan version (0: none)")),
      compute_seconds_(
          prometheus::BuildHistogram()
              .Name("muonshard_plan_compute_seconds")
              .Help("Planner time per new plan version")
              .Register(*registry_)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60})),
      latest_families_{&BuildGaugeFamily(*registry_, "muonshard_plan_optimizer_state_bytes",
                                         "Optimizer-state bytes per rank and colour in the latest plan"),
                       &BuildGaugeFamily(*registry_, "muonshard_plan_ns_flops",
                                         "Newton-Schulz FLOPs per step per rank and colour in the latest plan"),
                       &BuildGaugeFamily(*registry_, "muonshard_plan_rank_memory_bytes",
                                         "Training memory per rank by term (RankPlan.memory) in the latest plan"),
                       &BuildGaugeFamily(*registry_, "muonshard_plan_rank_memory_headroom_bytes",
                                         "Device capacity minus training memory per rank in the latest plan "
                                         "(ranks with a capacity only; negative: does not fit)")},
      imbalance_{},
      job_info_(BuildGaugeFamily(*registry_, "muonshard_job_plan_info",
                                 "1 per running job: the plan version it runs, with its content "
                                 "hash, model and world size")),
      job_families_{&BuildGaugeFamily(*registry_, "muonshard_job_plan_optimizer_state_bytes",
                                      "Optimizer-state bytes per rank and colour in the plan each job runs"),
                    &BuildGaugeFamily(*registry_, "muonshard_job_plan_ns_flops",
                                      "Newton-Schulz FLOPs per step per rank and colour in the plan each job runs"),
                    &BuildGaugeFamily(*registry_, "muonshard_job_plan_rank_memory_bytes",
                                      "Training memory per rank by term (RankPlan.memory) in the plan each job "
                                      "runs"),
                    &BuildGaugeFamily(*registry_, "muonshard_job_plan_rank_memory_headroom_bytes",
                                      "Device capacity minus training memory per rank in the plan each job "
                                      "runs (ranks with a capacity only; negative: does not fit)")},
      job_ratios_{},
      workers_(prometheus::BuildGauge()
                   .Name("muonshard_workers")
                   .Help("Workers per job by state (joined, failed, left)")
                   .Register(*registry_)),
      generation_(prometheus::BuildGauge()
                      .Name("muonshard_job_generation")
                      .Help("Current generation of each job")
                      .Register(*registry_)),
      job_events_(prometheus::BuildCounter()
                      .Name("muonshard_coordinator_job_events_total")
                      .Help("Membership events of each job by type (joins, failures, leaves, "
                            "generation changes, reported errors)")
                      .Register(*registry_)),
      watch_streams_(PlainGauge(*registry_, "muonshard_watch_streams", "Open Watch streams")),
      rpcs_(prometheus::BuildCounter()
                .Name("muonshard_rpcs_total")
                .Help("Coordinator RPCs by method and status code")
                .Register(*registry_)),
      store_healthy_(PlainGauge(*registry_, "muonshard_coordinator_store_healthy",
                                "1 while the plan store commits writes, 0 from a failed write "
                                "until one commits again (gRPC health is NOT_SERVING meanwhile)")),
      store_write_failures_(prometheus::BuildCounter()
                                .Name("muonshard_coordinator_store_write_failures_total")
                                .Help("Plan store writes (plans, generations, probes) that failed")
                                .Register(*registry_)
                                .Add({})) {
  for (size_t i = 0; i < kRatios.size(); ++i) {
    const auto& [suffix, help] = kRatios[i];
    imbalance_[i] =
        &PlainGauge(*registry_, absl::StrCat("muonshard_plan_", suffix), absl::StrCat(help, ", latest plan"));
    job_ratios_[i] = &BuildGaugeFamily(*registry_, absl::StrCat("muonshard_job_plan_", suffix),
                                       absl::StrCat(help, ", plan each job runs"));
  }
  store_healthy_.Set(1);  // as HealthTrackingPlanStore starts: healthy until a write fails
  for (auto& per_code : rpc_counters_) {
    for (auto& c : per_code) c.store(nullptr);
  }
  // Counters start at 0 so rate() sees the first call (Prometheus practice).
  for (int m = 0; m < kNumRpcs; ++m) {
    rpc_counters_[m][0].store(&rpcs_.Add({{"method", RpcName(static_cast<Rpc>(m))}, {"code", "OK"}}));
  }
}

void CoordinatorMetrics::RecordRpc(Rpc rpc, absl::StatusCode code) {
  const int c = static_cast<int>(code);
  if (c < 0 || c >= 17) return;
  std::atomic<prometheus::Counter*>& slot = rpc_counters_[static_cast<int>(rpc)][c];
  prometheus::Counter* counter = slot.load(std::memory_order_acquire);
  if (counter == nullptr) {
    // Family::Add returns the existing series for equal labels, so a race
    // here only stores the same pointer twice.
    counter = &rpcs_.Add({{"method", RpcName(rpc)}, {"code", absl::StatusCodeToString(code)}});
    slot.store(counter, std::memory_order_release);
  }
  counter->Increment();
}

void CoordinatorMetrics::OnPlanCreated(const v1::PlanVersionInfo& info, absl::Duration compute) {
  versions_created_.Increment();
  compute_seconds_.Observe(absl::ToDoubleSeconds(compute));
}

void CoordinatorMetrics::OnLatestPlan(const v1::PlanVersionInfo& info, const v1::Plan& plan) {
  const std::vector<RankColourLoad> loads = RankColourLoads(plan);
  const std::array<double, 6> ratios = Ratios(plan.stats());
  absl::MutexLock lock(&mu_);
  latest_version_.Set(static_cast<double>(info.version()));
  for (size_t i = 0; i < ratios.size(); ++i) imbalance_[i]->Set(ratios[i]);
  // The previous plan's ranks may not exist any more: drop every series.
  latest_series_.RemoveAll();
  AddRankSeries(latest_families_, {}, plan, loads, latest_series_);
}

void CoordinatorMetrics::OnJobPlan(const std::string& job, const v1::PlanVersionInfo& info, const v1::Plan* plan) {
  const std::vector<RankColourLoad> loads = plan == nullptr ? std::vector<RankColourLoad>() : RankColourLoads(*plan);
  const prometheus::Labels base = {{"job", job}, {"plan_version", absl::StrCat(info.version())}};
  prometheus::Labels info_labels = base;
  info_labels["content_hash"] = info.content_hash();
  info_labels["model"] = info.model();
  info_labels["world_size"] = absl::StrCat(info.topology().world_size());
  absl::MutexLock lock(&mu_);
  SeriesSet& series = job_series_[job];
  series.RemoveAll();  // the version it ran before
  series.Add(job_info_, info_labels, 1);
  if (plan == nullptr) return;
  const std::array<double, 6> ratios = Ratios(plan->stats());
  for (size_t i = 0; i < ratios.size(); ++i) series.Add(*job_ratios_[i], base, ratios[i]);
  AddRankSeries(job_families_, base, *plan, loads, series);
}

void CoordinatorMetrics::OnJobPlanEnded(const std::string& job) {
  absl::MutexLock lock(&mu_);
  auto it = job_series_.find(job);
  if (it == job_series_.end()) return;
  it->second.RemoveAll();
  job_series_.erase(it);
}

void CoordinatorMetrics::OnJobEvent(const v1::JobEvent& event, const WorkerCounts& counts) {
  generation_.Add({{"job", event.job()}}).Set(static_cast<double>(event.generation()));
  workers_.Add({{"job", event.job()}, {"state", "joined"}}).Set(static_cast<double>(counts.joined));
  workers_.Add({{"job", event.job()}, {"state", "failed"}}).Set(static_cast<double>(counts.failed));
  workers_.Add({{"job", event.job()}, {"state", "left"}}).Set(static_cast<double>(counts.left));
  absl::MutexLock lock(&mu_);
  if (prometheus::Counter* c = JobEventCounter(event.job(), event.type())) c->Increment();
}

prometheus::Counter* CoordinatorMetrics::JobEventCounter(const std::string& job, v1::JobEventType type) {
  auto [it, first] = job_events_by_job_.try_emplace(job);
  if (first) {
    // Every type starts at 0 with the job's first event, so rate() sees the
    // job's first failure or reported error. Snapshots are not events.
    for (int t = v1::JOB_EVENT_WORKER_JOINED; t < v1::JobEventType_ARRAYSIZE; ++t) {
      if (!v1::JobEventType_IsValid(t)) continue;
      it->second[t] = &job_events_.Add({{"job", job}, {"type", EventTypeLabel(static_cast<v1::JobEventType>(t))}});
    }
  }
  const int t = static_cast<int>(type);
  return t >= 0 && t < v1::JobEventType_ARRAYSIZE ? it->second[t] : nullptr;
}

void CoordinatorMetrics::OnWatchers(int64_t count) { watch_streams_.Set(static_cast<double>(count)); }

void CoordinatorMetrics::OnStoreWriteFailed(const absl::Status& error) { store_write_failures_.Increment(); }

void CoordinatorMetrics::OnStoreHealth(bool healthy, const absl::Status& cause) { store_healthy_.Set(healthy ? 1 : 0); }

}  // namespace muonshard::coordinator
