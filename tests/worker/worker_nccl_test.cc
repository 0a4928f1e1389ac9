// muonshard-worker --backend nccl on real GPUs: RunWorker in-process against
// a real muonshard-coordinator process (as worker_client_test drives the Gloo
// path), its fp32 masters compared with RunReference's (the unsharded CPU
// run). One GPU runs the single-rank cases; the two-rank case needs two
// (NCCL refuses two ranks of a group on one device). Every case skips
// cleanly when this process sees fewer devices than it needs, before
// starting any process.
//
// This binary links no CUDA library, as muonshard-worker links none: CUDA,
// cuBLAS and NCCL come through the GPU plugin, so /metrics (on in every
// case) starts its server threads in a process like the worker's. Linked
// directly, those libraries' static TLS leaves civetweb's 100 KiB thread
// stacks too small (see gpu/gpu_plugin.cc). worker_gpu_test holds the cases
// that need CUDA calls of their own.
//
// NOTE [GPU tolerance]
// The CUDA backend and the CPU reference compute the same step with
// different kernels, so the masters agree within a tolerance, never
// bit-for-bit. The cases use the synthetic workload: its gradients do not
// depend on the parameters, so the difference of one step is not fed back
// into the next one's gradients (with the regression workload a master one
// ulp off can round to another bf16 model copy and change every later
// gradient; see NOTE [Process tolerance] in worker_process_test.cc).
//   * --ns-precision fp32 on both: every Newton-Schulz matmul is fp32 on both
//     sides (cuBLASLt with CUBLAS_COMPUTE_32F, no TF32); they differ in
//     summation order and in the elementwise kernels' fused multiply-adds.
//     The kernel tests bound the orthogonalised matrix's relative error by
//     1e-4 (kFp32NsTolerance in tests/kernels/cuda_kernels_test.cc, measured
//     ~1e-6) and AdamW agrees to a few ulps. Each step's update is at most
//     of the order of the tensor's scale (lr 0.02 against initial values of
//     0.02), so after kSteps = 3 steps the masters differ by at most ~3e-4
//     of each tensor's scale: kFp32Rtol = 1e-3 leaves a factor 3 on a bound
//     that is itself ~100x what is measured. (Two CPU runs with 1 and 2
//     OpenBLAS threads, which differ only in summation order, measured
//     2.6e-7 on these cases.)
//   * The default precision (bf16 matmuls on the GPU, as Paddle) against a
//     reference that emulates bf16 on the CPU (--ns-precision bf16): the
//     rounding points are the same but a value on a rounding boundary can go
//     either way. On the CPU, the whole difference between bf16 emulation
//     and fp32 on the dense case after 3 steps measured 2.4e-3 of a tensor's
//     scale; runs that share the rounding points should differ by less, and
//     kBf16Rtol = 1e-2 leaves a factor 4 even over that whole difference.
// The per-tensor measure is max|a - e| / max|e| (params_file.h); each case
// prints its worst value so the GPU script's log shows the real margin.

#include <unistd.h>

#include <atomic>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/worker/worker_test_util.h"
#include "worker/internal/nccl_factory.h"
#include "worker/params_file.h"
#include "worker/worker_runner.h"

namespace muonshard::worker {
namespace {

using ::muonshard::testing::CoordinatorProcess;
using ::muonshard::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kSteps = 3;
constexpr double kFp32Rtol = 1e-3;  // NOTE [GPU tolerance]
constexpr double kBf16Rtol = 1e-2;  // NOTE [GPU tolerance]

// Through the plugin, as the worker counts them; 0 without a device.
int DeviceCount() {
  absl::StatusOr<int> devices = internal::VisibleCudaDevices();
  return devices.ok() ? *devices : 0;
}

#define SKIP_WITHOUT_DEVICES(n)                                                           \
  do {                                                                                    \
    const int have = DeviceCount();                                                       \
    if (have < (n)) GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found " << have; \
  } while (0)

// One coordinator process per test binary process (ctest runs each case in
// its own), started by the first case that has its devices. Killed at exit.
struct Coordinator {
  TempDir dir;
  std::unique_ptr<CoordinatorProcess> process;
  std::unique_ptr<client::CoordinatorClient> client;
};

Coordinator* StartCoordinator() {
  auto* c = new Coordinator();
  auto p = CoordinatorProcess::Start(c->dir.Join("data"), c->dir.path());
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return c;
  c->process = std::make_unique<CoordinatorProcess>(*std::move(p));
  client::ConnectionOptions o;
  o.coordinator = c->process->address();
  auto client = client::CoordinatorClient::Connect(o);
  EXPECT_TRUE(client.ok()) << client.status();
  if (client.ok()) c->client = *std::move(client);
  return c;
}

// Destroyed at exit, which kills and reaps the coordinator process.
Coordinator& Shared() {
  static const std::unique_ptr<Coordinator> c(StartCoordinator());
  return *c;
}

absl::StatusOr<int64_t> Submit(const v1::PlanRequest& request) {
  Coordinator& c = Shared();
  if (c.client == nullptr) return absl::UnavailableError("no coordinator");
  v1::SubmitPlanRequest submit;
  *submit.mutable_request() = request;
  v1::SubmitPlanResponse response;
  auto ctx = c.client->NewContext();
  absl::Status s = client::FromGrpcStatus(c.client->stub().SubmitPlan(ctx.get(), submit, &response));
  if (!s.ok()) return s;
  return response.version();
}

std::string UniqueJob(const std::string& base) {
  static std::atomic<int> counter{0};
  return absl::StrCat(base, "-", getpid(), "-", counter.fetch_add(1));
}

// Options of a synthetic-workload nccl run of plan `version`, dumping to
// `dump`.
WorkerOptions NcclRunOptions(int64_t version, const std::string& dump) {
  WorkerOptions o;
  o.connection.coordinator = Shared().process->address();
  o.job = UniqueJob("nccl");
  o.plan_version = version;
  o.backend = "nccl";
  o.workload = "synthetic";
  o.steps = kSteps;
  // /metrics on: its server's threads must start with the CUDA libraries
  // loaded (the GPU plugin keeps their TLS out of the static block; see
  // the file comment).
  o.metrics_port = 0;
  o.comm_timeout = absl::Seconds(60);
  o.dump_params = dump;
  return o;
}

// The reference (CPU, unsharded) of the run `o`, with its own Newton-Schulz
// precision; the comparison of `o`'s dump with it, printed.
ParamsComparison CompareWithReference(const WorkerOptions& o, const std::string& ns_precision, double rtol,
                                      const TempDir& dir) {
  WorkerOptions ref = o;
  ref.reference = true;
  ref.backend = "gloo";
  ref.ns_precision = ns_precision;
  ref.blas_threads = 1;
  ref.dump_params = dir.Join(absl::StrCat("reference-", ns_precision, ".safetensors"));
  std::ostringstream log;
  ref.log = &log;
  absl::Status s = RunReference(ref);
  EXPECT_TRUE(s.ok()) << s << "\n" << log.str();
  absl::StatusOr<ParamsFile> actual = ReadParamsFile(o.dump_params);
  absl::StatusOr<ParamsFile> expected = ReadParamsFile(ref.dump_params);
  EXPECT_TRUE(actual.ok()) << actual.status();
  EXPECT_TRUE(expected.ok()) << expected.status();
  if (!actual.ok() || !expected.ok()) return {};
  EXPECT_EQ(actual->metadata["backend"], "nccl");
  EXPECT_EQ(actual->metadata["ns_precision"], o.ns_precision);
  ParamsComparison cmp = CompareParams(*actual, *expected, rtol);
  EXPECT_TRUE(cmp.mismatches.empty()) << ::testing::PrintToString(cmp.mismatches);
  EXPECT_EQ(cmp.tensors.size(), expected->tensors.size());
  if (const TensorComparison* worst = cmp.worst(); worst != nullptr) {
    std::cout << "nccl (ns " << o.ns_precision << ") vs reference (ns " << ns_precision
              << "): worst error relative to tensor scale " << worst->rel << " (\"" << worst->name << "\"), rtol "
              << rtol << "\n";
  }
  return cmp;
}

// A dense and a MoE manifest, one rank: every group has one rank, so the run
// is the CUDA kernels on device buffers with no communicator.
TEST(WorkerNcclTest, OneRank_Fp32NewtonSchulz_MatchesTheCpuReference) {
  SKIP_WITHOUT_DEVICES(1);
  for (const auto& [name, manifest, schedule] :
       {std::tuple("dense", ::muonshard::testing::DenseManifest(2, 64, 96, 80), "auto"),
        std::tuple("moe", ::muonshard::testing::MoeManifest(2, 64, 32, 4, 80), "auto"),
        // No communicator at one rank: the kernels alone, with the events of
        // NOTE [Stream-pipelined step] on the backend's stream.
        std::tuple("moe", ::muonshard::testing::MoeManifest(2, 64, 32, 4, 80), "pipelined")}) {
    SCOPED_TRACE(absl::StrCat(name, ", ", schedule));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const int64_t version, Submit(::muonshard::testing::MakeRequest(manifest, 1)));
    TempDir dir;
    WorkerOptions o = NcclRunOptions(version, dir.Join("nccl.safetensors"));
    o.ns_precision = "fp32";
    o.step_schedule = schedule;
    std::ostringstream log;
    o.log = &log;
    MUONSHARD_ASSERT_OK(RunWorker(o)) << log.str();
    EXPECT_THAT(log.str(), HasSubstr("0 NCCL communicator(s)"));
    EXPECT_THAT(log.str(), HasSubstr("CUDA device 0 of "));
    EXPECT_THAT(log.str(), HasSubstr(absl::StrCat("step ", kSteps, "/", kSteps)));
    const ParamsComparison cmp = CompareWithReference(o, "fp32", kFp32Rtol, dir);
    EXPECT_TRUE(cmp.ok()) << "failed " << cmp.failed() << "\n" << log.str();
    EXPECT_FALSE(cmp.tensors.empty());
  }
}

TEST(WorkerNcclTest, OneRank_DefaultBf16NewtonSchulz_MatchesTheBf16EmulatingReference) {
  SKIP_WITHOUT_DEVICES(1);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const int64_t version, Submit(::muonshard::testing::MakeRequest(
                                                            ::muonshard::testing::DenseManifest(2, 64, 96, 80), 1)));
  TempDir dir;
  WorkerOptions o = NcclRunOptions(version, dir.Join("nccl.safetensors"));
  std::ostringstream log;
  o.log = &log;
  MUONSHARD_ASSERT_OK(RunWorker(o)) << log.str();
  EXPECT_THAT(log.str(), HasSubstr("Newton-Schulz precision default"));
  const ParamsComparison cmp = CompareWithReference(o, "bf16", kBf16Rtol, dir);
  EXPECT_TRUE(cmp.ok()) << "failed " << cmp.failed() << "\n" << log.str();
}

// Explicit --cuda-device past the visible devices: the CUDA backend's
// UNAVAILABLE, annotated with the device, after joining (the job's
// generation moves, as for any failed worker).
TEST(WorkerNcclTest, CudaDevicePastTheVisibleOnes_UnavailableNamingTheDevice) {
  SKIP_WITHOUT_DEVICES(1);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const int64_t version, Submit(::muonshard::testing::MakeRequest(
                                                            ::muonshard::testing::DenseManifest(1, 32, 48, 40), 1)));
  WorkerOptions o = NcclRunOptions(version, "");
  o.cuda_device = DeviceCount();
  std::ostringstream log;
  o.log = &log;
  EXPECT_THAT(RunWorker(o), ::muonshard::testing::StatusIs(absl::StatusCode::kUnavailable,
                                                           HasSubstr(absl::StrCat("device ", o.cuda_device))));
}

// Two nccl ranks of `request` at fp32 Newton-Schulz on `schedule`, one GPU
// each, against the CPU reference.
void RunTwoRanksAgainstTheReference(const v1::PlanRequest& request, const std::string& schedule) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const int64_t version, Submit(request));
  TempDir dir;
  WorkerOptions o = NcclRunOptions(version, dir.Join("nccl.safetensors"));
  o.ns_precision = "fp32";
  o.step_schedule = schedule;
  // Rank r runs on device r (rank modulo the devices).
  const std::vector<testing::RankRun> runs = testing::RunRanksAsThreads(o, 2);
  for (int r = 0; r < 2; ++r) {
    MUONSHARD_ASSERT_OK(runs[r].status) << runs[r].log;
    EXPECT_THAT(runs[r].log, HasSubstr(absl::StrCat("CUDA device ", r, " of ")));
    EXPECT_THAT(runs[r].log, ::testing::Not(HasSubstr(" 0 NCCL communicator(s)")));
  }
  const ParamsComparison cmp = CompareWithReference(o, "fp32", kFp32Rtol, dir);
  EXPECT_TRUE(cmp.ok()) << "failed " << cmp.failed();
}

// Two ranks as threads, one GPU each: a dense plan (one group of two: one
// NCCL communicator per rank) and a MoE plan with expert parallelism 2.
TEST(WorkerNcclTest, TwoRanksOneGpuEach_Fp32NewtonSchulz_MatchesTheCpuReference) {
  SKIP_WITHOUT_DEVICES(2);
  struct Case {
    const char* name;
    v1::PlanRequest request;
  };
  const Case cases[] = {
      {"dense", ::muonshard::testing::MakeRequest(::muonshard::testing::DenseManifest(2, 64, 96, 80), 2)},
      {"moe_ep2", ::muonshard::testing::MakeRequest(::muonshard::testing::MoeManifest(2, 64, 32, 4, 80), 2, 1, 2)},
  };
  // Sequential on one stream, and pipelined: each communicator on a stream
  // of its own, ordered by events (NOTE [Stream-pipelined step]).
  for (const Case& c : cases) {
    for (const char* schedule : {"auto", "pipelined"}) {
      SCOPED_TRACE(absl::StrCat(c.name, ", ", schedule));
      RunTwoRanksAgainstTheReference(c.request, schedule);
    }
  }
}

}  // namespace
}  // namespace muonshard::worker
