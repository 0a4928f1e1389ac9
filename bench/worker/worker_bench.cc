// muonshard-bench-worker: the sharded optimizer step on a scaled-down real
// model, threads as ranks, over in-process and Gloo (TCP on 127.0.0.1)
// communicators: step time and its phases (reduce, Muon, AdamW, sync).
//
// The model is Qwen3-30B-A3B's config.json (embedded below, or --hf-config)
// imported with the HF importer and shrunk by ScaleDownManifest: every
// dimension divided by --divisor, only the first --layers layers. Gradients
// come from SyntheticWorkload. Each rank runs --warmup steps, then --steps
// timed ones; before each, gradients are computed and the ranks meet at a
// barrier, so only the optimizer step is timed. Per step, the step time is the slowest rank's (the step ends
// for everyone when the last rank is done) and each phase is the mean over
// ranks; the table shows the mean over timed steps. Every step's comm bytes
// are checked against the plan's figures (exit 1 on a mismatch), so the
// --quick ctest run checks the accounting end to end.
//
// Threads as ranks share one process and so one OpenBLAS. Left at its
// default (one thread per core) every rank's Newton-Schulz calls its own
// threads onto the same cores, and OpenBLAS's spinning workers made the Muon
// phase ~50x slower on 4 ranks x 2 cores. --blas-threads (default: cores /
// ranks, at least 1) sets OpenBLAS's pool, as a launcher would for one
// process per rank.
//
// Usage: muonshard-bench-worker [--ranks 4] [--ep 2] [--policy seed]
//          [--tp 1 [--tp-muon distributed|duplicated|sharded]]
//          [--divisor 16] [--layers 2] [--steps 5] [--warmup 1]
//          [--backend both|inprocess|gloo] [--blas-threads N]
//          [--hf-config PATH] [--quick]

#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cli/cli_common.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "common/rendezvous_store.h"
#include "common/status_macros.h"
#include "importer/hf_import.h"
#include "importer/tp_split.h"
#include "kernels/blas_core.h"
#include "kernels/kernel_backend.h"
#include "plan/plan_view.h"
#include "plan/planner.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_process_communicator.h"
#include "worker/optimizer/optimizer_config.h"
#include "worker/optimizer/sharded_optimizer.h"
#include "worker/workload/scaled_manifest.h"
#include "worker/workload/synthetic_workload.h"
#include "worker/workload/workload_driver.h"

namespace muonshard::worker {
namespace {

// Qwen3-30B-A3B (fixtures/hf-configs), the parameter-shaping fields.
constexpr char kQwen3MoeConfig[] = R"({
  "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
  "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
  "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
  "tie_word_embeddings": false, "attention_bias": false, "num_experts": 128,
  "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
  "torch_dtype": "bfloat16", "_name_or_path": "Qwen/Qwen3-30B-A3B"})";

struct Flags {
  int ranks = 4;
  int ep = 2;
  int tp = 1;
  std::string tp_muon = "distributed";
  std::string policy = "seed";
  int divisor = 16;
  int layers = 2;
  int steps = 5;
  int warmup = 1;
  std::string backend = "both";
  std::string hf_config;
  int blas_threads = 0;  // 0: cores / ranks
  std::string step_schedule = "auto";
  bool quick = false;
};

enum class Backend { kInProcess, kGloo };

const char* BackendName(Backend b) { return b == Backend::kInProcess ? "inprocess" : "gloo"; }

absl::StatusOr<v1::Plan> MakePlan(const Flags& flags) {
  std::string config = kQwen3MoeConfig;
  if (!flags.hf_config.empty()) {
    MUONSHARD_ASSIGN_OR_RETURN(config, ReadFile(flags.hf_config));
  }
  MUONSHARD_ASSIGN_OR_RETURN(v1::ModelManifest full, importer::ImportHfConfig(config, {}));
  MUONSHARD_ASSIGN_OR_RETURN(v1::ModelManifest manifest,
                             ScaleDownManifest(full, ScaleDownOptions{flags.divisor, flags.layers}));
  v1::PlanRequest request;
  *request.mutable_manifest() = std::move(manifest);
  request.mutable_topology()->set_world_size(flags.ranks);
  request.mutable_topology()->set_ep(flags.ep);
  MUONSHARD_ASSIGN_OR_RETURN(const v1::Policy policy, cli::ParsePolicy(flags.policy));
  request.mutable_policy()->set_policy(policy);
  if (flags.tp > 1) {
    // Megatron's splits, the experts' too (tp needs ep 1).
    MUONSHARD_RETURN_IF_ERROR(importer::MarkTensorParallel({flags.tp, true}, request.mutable_manifest()));
    request.mutable_topology()->set_tp(flags.tp);
    MUONSHARD_ASSIGN_OR_RETURN(const v1::TpMuonMode mode, cli::ParseTpMuon(flags.tp_muon));
    request.mutable_policy()->set_tp_muon(mode);
  }
  return planner::ComputePlan(request);
}

// The communicators of one rank, created in ascending group id on every rank
// so the blocking Gloo rendezvous cannot deadlock.
struct RankComms {
  std::vector<std::unique_ptr<Communicator>> owned;
  ShardedOptimizer::CommGroups by_id;
};

absl::StatusOr<RankComms> CreateGlooComms(const v1::Plan& plan, int rank, RendezvousStore* store) {
  RankComms comms;
  for (const v1::CommGroup& g : plan.groups()) {
    auto at = std::find(g.ranks().begin(), g.ranks().end(), rank);
    if (at == g.ranks().end() || g.ranks_size() < 2) continue;
    GlooOptions o;
    o.rank = static_cast<int>(at - g.ranks().begin());
    o.size = g.ranks_size();
    o.key_prefix = absl::StrCat("bench/gloo/group/", g.id(), "/");
    MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> c, CreateGlooCommunicator(o, store));
    comms.by_id[g.id()] = c.get();
    comms.owned.push_back(std::move(c));
  }
  return comms;
}

absl::StatusOr<std::vector<RankComms>> CreateInProcessComms(const v1::Plan& plan) {
  std::vector<RankComms> comms(plan.ranks_size());
  for (const v1::CommGroup& g : plan.groups()) {
    MUONSHARD_ASSIGN_OR_RETURN(auto group, CreateInProcessCommunicators(g.ranks_size()));
    for (int i = 0; i < g.ranks_size(); ++i) {
      comms[g.ranks(i)].by_id[g.id()] = group[i].get();
      comms[g.ranks(i)].owned.push_back(std::move(group[i]));
    }
  }
  return comms;
}

absl::Status CheckBytes(const StepCommBytes& got, const v1::RankPlan& plan) {
  const int64_t tp = plan.tp_send_bytes() + plan.tp_recv_bytes();
  if (got.grad_reduce == plan.grad_reduce_bytes() && got.grad_reduce_scatter == plan.grad_reduce_scatter_bytes() &&
      got.param_broadcast == plan.param_broadcast_bytes() && got.param_all_gather == plan.param_all_gather_bytes() &&
      got.tp == tp) {
    return absl::OkStatus();
  }
  return absl::InternalError(
      absl::StrCat("rank ", plan.rank(), ": measured comm bytes (", got.grad_reduce, ", ", got.grad_reduce_scatter,
                   ", ", got.param_broadcast, ", ", got.param_all_gather, ", tp ", got.tp, ") differ from the plan's (",
                   plan.grad_reduce_bytes(), ", ", plan.grad_reduce_scatter_bytes(), ", ", plan.param_broadcast_bytes(),
                   ", ", plan.param_all_gather_bytes(), ", tp ", tp, ")"));
}

// The rank's DEFAULT (sharding) group communicator: null for a world of one.
Communicator* ShardingComm(const v1::Plan& plan, int rank, const ShardedOptimizer::CommGroups& comms) {
  for (const v1::CommGroup& g : plan.groups()) {
    if (g.colour() != v1::DEFAULT || std::find(g.ranks().begin(), g.ranks().end(), rank) == g.ranks().end()) continue;
    auto it = comms.find(g.id());
    return it == comms.end() ? nullptr : it->second;
  }
  return nullptr;
}

// One rank's timed steps. Gradients are computed first, then a barrier on
// the sharding group lines the ranks up, so the step times the optimizer,
// not how unevenly the workload's gradient generation ran.
absl::StatusOr<std::vector<StepStats>> RunRank(const v1::Plan& plan, int rank,
                                               const ShardedOptimizer::CommGroups& comms, const Flags& flags) {
  MUONSHARD_ASSIGN_OR_RETURN(const v1::RankView view, planner::ExtractRankView(plan, rank));
  std::unique_ptr<kernels::KernelBackend> backend = kernels::CreateCpuKernelBackend();
  StepOptions step;
  MUONSHARD_ASSIGN_OR_RETURN(step.schedule, ParseStepSchedule(flags.step_schedule));
  MUONSHARD_ASSIGN_OR_RETURN(auto optimizer, ShardedOptimizer::Create(view, comms, backend.get(), {}, step));
  const SyntheticWorkload workload;
  MUONSHARD_RETURN_IF_ERROR(InitializeParameters(workload, *optimizer));
  Communicator* sharding = ShardingComm(plan, rank, comms);
  std::vector<StepStats> timed;
  for (int step = 0; step < flags.warmup + flags.steps; ++step) {
    MUONSHARD_ASSIGN_OR_RETURN(LocalGradients local,
                               ComputeLocalGradients(workload, optimizer->held_tensors(), DataRank(*optimizer), step,
                                                     [&](const HeldTensor& h, absl::Span<float> out) {
                                                       return optimizer->ReadModelCopy(h.tensor, out);
                                                     }));
    if (sharding != nullptr) MUONSHARD_RETURN_IF_ERROR(sharding->Barrier());
    MUONSHARD_ASSIGN_OR_RETURN(StepStats stats, optimizer->Step(local.grads));
    MUONSHARD_RETURN_IF_ERROR(CheckBytes(stats.comm, plan.ranks(rank)));
    if (step >= flags.warmup) timed.push_back(stats);
  }
  return timed;
}

// stats[rank][step] for every rank, one thread each.
absl::StatusOr<std::vector<std::vector<StepStats>>> RunBackend(const v1::Plan& plan, Backend backend,
                                                               const Flags& flags) {
  const int world = plan.ranks_size();
  std::vector<absl::StatusOr<std::vector<StepStats>>> results(world, absl::UnknownError("not run"));
  InMemoryRendezvousStore store;
  std::vector<RankComms> in_process;
  if (backend == Backend::kInProcess) {
    MUONSHARD_ASSIGN_OR_RETURN(in_process, CreateInProcessComms(plan));
  }
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      if (backend == Backend::kInProcess) {
        results[rank] = RunRank(plan, rank, in_process[rank].by_id, flags);
        return;
      }
      absl::StatusOr<RankComms> comms = CreateGlooComms(plan, rank, &store);
      results[rank] = comms.ok() ? RunRank(plan, rank, comms->by_id, flags) : comms.status();
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::vector<StepStats>> out;
  for (int r = 0; r < world; ++r) {
    if (!results[r].ok()) return Annotate(results[r].status(), absl::StrCat(BackendName(backend), " rank ", r));
    out.push_back(*std::move(results[r]));
  }
  return out;
}

struct Summary {
  double step = 0;                                   // slowest rank, mean over steps
  double reduce = 0, muon = 0, adamw = 0, sync = 0;  // mean over ranks and steps
  double max_muon = 0;                               // slowest rank's Muon phase, mean over steps
};

Summary Summarize(const std::vector<std::vector<StepStats>>& stats) {
  Summary s;
  const size_t steps = stats[0].size();
  const double ranks = static_cast<double>(stats.size());
  for (size_t k = 0; k < steps; ++k) {
    double slowest = 0, slowest_muon = 0;
    for (const auto& rank : stats) {
      const StepStats& st = rank[k];
      slowest = std::max(slowest, st.total_seconds);
      slowest_muon = std::max(slowest_muon, st.muon_seconds);
      s.reduce += st.reduce_seconds / ranks;
      s.muon += st.muon_seconds / ranks;
      s.adamw += st.adamw_seconds / ranks;
      s.sync += st.sync_seconds / ranks;
    }
    s.step += slowest;
    s.max_muon += slowest_muon;
  }
  for (double* v : {&s.step, &s.reduce, &s.muon, &s.adamw, &s.sync, &s.max_muon}) *v /= static_cast<double>(steps);
  return s;
}

void PrintHeader(const v1::Plan& plan, const Flags& flags) {
  int64_t max_state = 0, max_bytes = 0;
  double max_flops = 0;
  for (const v1::RankPlan& r : plan.ranks()) {
    max_state = std::max(max_state, r.optimizer_state_bytes());
    max_flops = std::max(max_flops, r.ns_flops());
    max_bytes = std::max(max_bytes, r.grad_reduce_bytes() + r.grad_reduce_scatter_bytes() + r.param_broadcast_bytes() +
                                        r.param_all_gather_bytes());
  }
  std::printf("model %s: %d tensors, %.2fM params (%.2fM Muon in %d tensors); world %d, ep %d, tp %d%s, policy %s\n",
              plan.model().c_str(), plan.tensors_size(), plan.stats().total_params() / 1e6,
              plan.stats().muon_params() / 1e6, plan.stats().muon_tensors(), flags.ranks, flags.ep, flags.tp,
              flags.tp > 1 ? absl::StrCat(" (", flags.tp_muon, ")").c_str() : "", flags.policy.c_str());
  std::printf("plan, busiest rank: %.1f MB optimizer state, %.2f GFLOP Newton-Schulz, %.2f MB comm per step\n",
              max_state / 1e6, max_flops / 1e9, max_bytes / 1e6);
  std::printf("synthetic gradients, %d warm-up + %d timed steps, %u hardware threads, %d OpenBLAS threads\n\n",
              flags.warmup, flags.steps, std::thread::hardware_concurrency(), openblas_get_num_threads());
  if (const std::string advice = kernels::BlasCoreAdvice(); !advice.empty())
    std::printf("warning: %s\n\n", advice.c_str());
  std::printf("%-10s %9s %10s %9s %13s %10s %9s\n", "backend", "step_ms", "reduce_ms", "muon_ms", "muon_max_ms",
              "adamw_ms", "sync_ms");
}

absl::Status Run(Flags flags) {
  if (flags.quick) {
    flags.divisor = 64;
    flags.layers = 1;
    flags.steps = 1;
    flags.warmup = 0;
  }
  if (flags.ranks < 1 || flags.steps < 1 || flags.warmup < 0) {
    return absl::InvalidArgumentError("--ranks and --steps must be >= 1, --warmup >= 0");
  }
  std::vector<Backend> backends;
  if (flags.backend == "both" || flags.backend == "inprocess") backends.push_back(Backend::kInProcess);
  if (flags.backend == "both" || flags.backend == "gloo") backends.push_back(Backend::kGloo);
  if (backends.empty()) return absl::InvalidArgumentError("--backend must be both, inprocess or gloo");
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(flags.blas_threads > 0 ? flags.blas_threads : std::max(1, cores / flags.ranks));
  MUONSHARD_ASSIGN_OR_RETURN(const v1::Plan plan, MakePlan(flags));
  PrintHeader(plan, flags);
  for (Backend b : backends) {
    MUONSHARD_ASSIGN_OR_RETURN(auto stats, RunBackend(plan, b, flags));
    const Summary s = Summarize(stats);
    std::printf("%-10s %9.1f %10.1f %9.1f %13.1f %10.1f %9.1f\n", BackendName(b), s.step * 1e3, s.reduce * 1e3,
                s.muon * 1e3, s.max_muon * 1e3, s.adamw * 1e3, s.sync * 1e3);
    std::fflush(stdout);
  }
  std::printf("\ncomm bytes of every step and rank equal the plan's figures\n");
  return absl::OkStatus();
}

}  // namespace
}  // namespace muonshard::worker

int main(int argc, char** argv) {
  using muonshard::worker::Flags;
  Flags flags;
  muonshard::FlagSet set(
      "muonshard-bench-worker [--ranks 4] [--ep 2] [--tp 1 [--tp-muon distributed|duplicated|sharded]]\n"
      "    [--policy seed] [--divisor 16] [--layers 2]\n"
      "    [--steps 5] [--warmup 1] [--backend both|inprocess|gloo] [--blas-threads N]\n"
      "    [--step-schedule auto|sequential|pipelined]\n"
      "    [--hf-config PATH] [--quick]");
  set.Int("ranks", &flags.ranks, "ranks (threads)");
  set.Int("ep", &flags.ep, "expert parallelism");
  set.Int("tp", &flags.tp, "tensor parallelism (Megatron's splits; needs --ep 1)");
  set.String("tp-muon", &flags.tp_muon, "with --tp: distributed | duplicated | sharded");
  set.String("policy", &flags.policy, "seed | seed-all | balanced");
  set.Int("divisor", &flags.divisor, "divide every dimension by this");
  set.Int("layers", &flags.layers, "keep the first N layers (-1: all)");
  set.Int("steps", &flags.steps, "timed steps");
  set.Int("warmup", &flags.warmup, "untimed steps first");
  set.String("backend", &flags.backend, "both | inprocess | gloo");
  set.String("hf-config", &flags.hf_config, "HF config.json to import instead of the embedded Qwen3-30B-A3B");
  set.Int("blas-threads", &flags.blas_threads, "OpenBLAS threads (0: cores / ranks)");
  set.String("step-schedule", &flags.step_schedule, "auto (pipelined here) | sequential | pipelined");
  set.Bool("quick", &flags.quick, "tiny model, one step (smoke test)");
  absl::StatusOr<std::vector<std::string>> positional = set.Parse(muonshard::ArgsOf(argc, argv));
  if (set.help_requested()) {
    std::printf("%s\n", set.Usage().c_str());
    return 0;
  }
  if (!positional.ok() || !positional->empty()) {
    std::fprintf(stderr, "%s\n%s\n", positional.ok() ? "unexpected arguments" : positional.status().ToString().c_str(),
                 set.Usage().c_str());
    return 2;
  }
  absl::Status s = muonshard::worker::Run(flags);
  if (!s.ok()) {
    std::fprintf(stderr, "muonshard-bench-worker: %s\n", s.ToString().c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
