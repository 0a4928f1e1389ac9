// muonshard-worker: flags -> WorkerOptions -> RunWorker / RunReference
// (worker_runner.h). Exit 0 on success, 1 on a runtime failure, 2 on bad
// usage. SIGTERM / SIGINT stop the run at the next step boundary (or end
// --linger); a second signal exits at once.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/flags.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "worker/worker_runner.h"

namespace muonshard::worker {
namespace {

// The coordinator's limit on names (job_registry.cc, kMaxNameBytes).
constexpr size_t kMaxJobBytes = 256;

constexpr char kUsage[] =
    "usage: muonshard-worker --coordinator HOST:PORT --job NAME [--plan-version V|latest]\n"
    "         [--backend gloo|nccl [--cuda-device N]] [--workload regression|synthetic] [--steps N] [--lr X]\n"
    "         [--metrics-port P] [--dump-params FILE] [--rank R] [--linger S]\n"
    "         [--checkpoint-dir D [--checkpoint-every K] [--resume]] [--max-restarts N [--rejoin-grace S] "
    "[--min-workers M]] ...\n"
    "       muonshard-worker --reference --coordinator HOST:PORT [--plan-version V] --dump-params FILE\n"
    "         [--workload ...] [--steps N] [--lr X]   (the same run unsharded, in one process)";

// A count flag's value as an int: INVALID_ARGUMENT naming --`name` outside
// [0, 1e9].
absl::Status CountFlag(const char* name, int64_t value, int* out) {
  if (value < 0 || value > 1'000'000'000) {
    return absl::InvalidArgumentError(absl::StrCat("flag --", name, " must be in [0, 1000000000]"));
  }
  *out = static_cast<int>(value);
  return absl::OkStatus();
}

// The flags' defaults are WorkerOptions' (and so RankSessionOptions' and
// OptimizerConfig's, which muonshard.torch's keyword arguments take too:
// python/src/session_options.h): one definition of each.
struct Flags {
  WorkerOptions o;
  std::string plan_version = "latest";
  int64_t rank = -1;
  int64_t max_restarts = o.max_restarts;
  int64_t min_workers = o.min_workers;
  int64_t checkpoint_keep = o.checkpoint_keep;
  int64_t buddy_every = o.buddy_every;
  double lr = o.lr;
  double weight_decay = o.weight_decay;
  int64_t seed = static_cast<int64_t>(o.seed);
  double comm_timeout_s = absl::ToDoubleSeconds(o.comm_timeout);
  double join_timeout_s = absl::ToDoubleSeconds(o.join_timeout);
  double linger_s = absl::ToDoubleSeconds(o.linger);
  double rejoin_grace_s = absl::ToDoubleSeconds(o.rejoin_grace);

  void Register(FlagSet& f) {
    o.connection.Register(f);
    f.String("job", &o.job, "job name (required unless --reference)");
    f.String("plan-version", &plan_version, "plan version to run, or latest (the job's, for later joiners)");
    f.Int("rank", &rank, "ask for this rank (default: the coordinator assigns the lowest free one)");
    f.String("backend", &o.backend,
             "gloo (CPU kernels, Gloo over TCP) | nccl (the step on the GPU: CUDA kernels + NCCL, one GPU per rank)");
    f.Int("cuda-device", &o.cuda_device,
          "nccl: CUDA device ordinal (default: local rank modulo the visible devices; local rank from --local-rank, "
          "else rank modulo --local-world-size, else rank)");
    f.String("reduce-order", &o.reduce_order,
             "gloo: ring (Gloo's) | rank (sums in rank order: bit-identical to --reference, more traffic)");
    f.String("collectives", &o.collectives,
             "gloo: auto (inside each node first, one copy between nodes, where the plan's topology gives "
             "gpus_per_node) | flat (rings over all of a group's ranks in rank order). The same on every rank");
    f.String("step-schedule", &o.step_schedule,
             "auto (pipelined with gloo, sequential with nccl) | pipelined (collectives of each bucket overlap the "
             "Newton-Schulz of others: lane threads with gloo, CUDA streams and events with nccl, tp = 1) | "
             "sequential (reduce all, update all, sync all)");
    f.Int("step-piece-kib", &o.step_piece_kib,
          "Muon buckets cut into pieces of at most this many KiB of gradients, each reduced, orthogonalised and "
          "broadcast on its own so they overlap; 0 (default): the plan's buckets. The same on every rank");
    f.Int("muon-batch-mib", &o.muon_batch_mib,
          "the sequential step orthogonalises a rank's same-shape Muon matrices of all its buckets together, in "
          "batched calls of at most this many MiB of fp32 update (the CUDA workspace is about 2.3x that); 0: a "
          "bucket's at a time");
    f.String("step-trace-dir", &o.step_trace_dir,
             "record when each bucket's reduce, update and sync ran, and write the last --step-trace-steps steps "
             "to DIR/step-trace-rank<R>.json (Chrome trace events: chrome://tracing, Perfetto) after training");
    f.Int("step-trace-steps", &o.step_trace_steps, "steps kept for --step-trace-dir (the last ones; default 10)");
    f.String("step-phases", &o.step_phases,
             "benchmarks only: all | comm (collectives, no updates) | compute (updates, no collectives)");
    f.String("ns-precision", &o.ns_precision,
             "Newton-Schulz matmuls: default (bf16 on CUDA, fp32 on the CPU) | fp32 | bf16 (emulated on the CPU)");
    f.String("workload", &o.workload, "regression (a real loss that falls) | synthetic (random gradients)");
    f.Int("steps", &o.steps, "training steps");
    f.Double("lr", &lr, "learning rate (Muon and AdamW)");
    f.Double("weight-decay", &weight_decay, "decoupled weight decay");
    f.Int("seed", &seed, "workload seed (data and initial parameters)");
    f.Bool("reference", &o.reference, "run the job's plan unsharded in this process (plain Muon + AdamW)");
    f.String("dump-params", &o.dump_params, "write the final fp32 parameters here (safetensors)");
    f.String("checkpoint-dir", &o.checkpoint_dir, "write sharded checkpoints here (step-N/ + latest)");
    f.Int("checkpoint-every", &o.checkpoint_every, "checkpoint after every N-th step (0: after the last only)");
    f.Int("checkpoint-keep", &checkpoint_keep, "keep only the newest N complete checkpoints (0: all)");
    f.Int("buddy-every", &buddy_every,
          "every N steps each rank copies its optimizer state to its buddy (rank + 1) in memory, so a recovery from "
          "one failure reads no disk and loses at most N steps (0: off; about twice the state in host memory)");
    f.Bool("resume", &o.resume,
           "continue from the latest checkpoint in --checkpoint-dir (any plan of the model); from step 0 when it holds "
           "none");
    f.Int("max-restarts", &max_restarts,
          "recover up to N times when the group breaks (a peer died, froze or reported an error): re-join, wait for "
          "the group, restore the newest checkpoint, go on");
    f.Double("rejoin-grace", &rejoin_grace_s, "seconds a recovery waits for the group to re-form (0: --comm-timeout)");
    f.Int("min-workers", &min_workers,
          "elastic job: when ranks stay away past --rejoin-grace, the coordinator re-plans the job for the ranks "
          "present if at least this many (0: not elastic); a newcomer grows it back");
    f.Int("metrics-port", &o.metrics_port, "/metrics on this port + local rank (0: any free port, <0: off)");
    f.String("metrics-host", &o.metrics_host, "address the /metrics endpoint binds");
    f.Int("local-rank", &o.local_rank, "rank on this host (default: the job rank)");
    f.Int("local-world-size", &o.local_world_size, "workers on this host (default: the job's world size)");
    f.String("port-file", &o.port_file, "write {\"rank\": R, \"metrics_port\": M, ...} here once serving");
    f.String("hostname", &o.hostname, "address Gloo binds and advertises");
    f.String("interface", &o.interface, "network interface for Gloo (overrides --hostname)");
    f.Double("comm-timeout", &comm_timeout_s, "seconds for rendezvous, each collective and barriers");
    f.Double("join-timeout", &join_timeout_s, "seconds to keep retrying an unreachable coordinator");
    f.Int("blas-threads", &o.blas_threads, "OpenBLAS threads (0: cores / local world size)");
    f.Double("linger", &linger_s, "seconds to keep serving /metrics after the run (SIGTERM ends it)");
    f.Int("log-every", &o.log_every, "print rank 0's progress every N steps");
    f.String("host-id", &o.host, "host identity for the coordinator (default: hostname)");
    f.String("device", &o.device,
             "device identity for the coordinator (default: cuda:<device> with nccl, else cpu:<local rank>, "
             "cpu:rank-<rank> or per process)");
  }

  absl::Status Finalize() {
    if (plan_version == "latest") {
      o.plan_version = 0;
    } else if (!absl::SimpleAtoi(plan_version, &o.plan_version) || o.plan_version <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --plan-version: ", QuoteBounded(plan_version), " is not a positive version or latest"));
    }
    // The coordinator refuses longer names anyway; failing here keeps the
    // name out of every later error line (they quote the job whole).
    if (o.job.size() > kMaxJobBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flag --job: ", QuoteBounded(o.job), " is longer than the coordinator's limit of ", kMaxJobBytes, " bytes"));
    }
    if (rank >= 0) o.rank = static_cast<int>(rank);
    o.lr = static_cast<float>(lr);
    o.weight_decay = static_cast<float>(weight_decay);
    o.seed = static_cast<uint64_t>(seed);
    if (!(comm_timeout_s > 0) || !(join_timeout_s > 0) || !(linger_s >= 0) || !(rejoin_grace_s >= 0)) {
      return absl::InvalidArgumentError(
          "flags --comm-timeout, --join-timeout must be > 0, --linger and --rejoin-grace >= 0");
    }
    MUONSHARD_RETURN_IF_ERROR(CountFlag("max-restarts", max_restarts, &o.max_restarts));
    MUONSHARD_RETURN_IF_ERROR(CountFlag("min-workers", min_workers, &o.min_workers));
    MUONSHARD_RETURN_IF_ERROR(CountFlag("checkpoint-keep", checkpoint_keep, &o.checkpoint_keep));
    MUONSHARD_RETURN_IF_ERROR(CountFlag("buddy-every", buddy_every, &o.buddy_every));
    o.rejoin_grace = absl::Seconds(rejoin_grace_s);
    o.comm_timeout = absl::Seconds(comm_timeout_s);
    o.join_timeout = absl::Seconds(join_timeout_s);
    o.linger = absl::Seconds(linger_s);
    return ValidateWorkerOptions(o);
  }
};

// Signals received so far; written by the handler (lock-free atomics are
// async-signal-safe).
std::atomic<int> g_signals{0};

void OnStopSignal(int /*sig*/) {
  // A second signal exits at once: a collective can block for the comm
  // timeout before the run reaches a step boundary.
  if (g_signals.fetch_add(1) >= 1) _exit(1);
}

// Turns SIGTERM / SIGINT into `stop` (checked by the run at step
// boundaries and by --linger). A handler rather than sigwait: OpenBLAS
// starts its threads before main() with the signals unblocked, so a blocked
// mask cannot keep the signals away from every thread. The watcher thread
// polls the handler's counter.
class SignalWatcher {
 public:
  SignalWatcher() {
    struct sigaction action = {};
    action.sa_handler = OnStopSignal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGINT, &action, nullptr);
    thread_ = std::thread([this] { Watch(); });
  }
  ~SignalWatcher() {
    done_.Notify();
    thread_.join();
  }
  const absl::Notification* stop() const { return &stop_; }

 private:
  void Watch() {
    while (!done_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
      if (g_signals.load() > 0 && !stop_.HasBeenNotified()) {
        std::cerr << "muonshard-worker: signal received: stopping at the next step boundary (again to exit now)\n";
        stop_.Notify();
      }
    }
  }

  absl::Notification stop_;
  absl::Notification done_;
  std::thread thread_;
};

int Main(int argc, char** argv) {
  FlagSet flag_set(kUsage);
  Flags flags;
  flags.Register(flag_set);
  absl::StatusOr<std::vector<std::string>> positional = flag_set.Parse(ArgsOf(argc, argv));
  if (flag_set.help_requested()) {
    std::cout << flag_set.Usage();
    return 0;
  }
  if (flag_set.version_requested()) {
    std::cout << VersionLine("muonshard-worker") << "\n";
    return 0;
  }
  absl::Status s = positional.ok() ? flags.Finalize() : positional.status();
  if (s.ok() && !positional->empty()) s = absl::InvalidArgumentError("unexpected arguments");
  if (!s.ok()) {
    std::cerr << "error: " << s.message() << "\n" << flag_set.UsageHint() << "\n";
    return ExitCodeFor(s);
  }
  SignalWatcher watcher;
  flags.o.stop = watcher.stop();
  s = flags.o.reference ? RunReference(flags.o) : RunWorker(flags.o);
  if (!s.ok()) std::cerr << "muonshard-worker: error: " << s << "\n";
  return ExitCodeFor(s);
}

}  // namespace
}  // namespace muonshard::worker

int main(int argc, char** argv) { return muonshard::worker::Main(argc, argv); }
