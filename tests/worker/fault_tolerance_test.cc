// Fault injection on real processes on 127.0.0.1 (NOTE [Recovery] in
// worker/rank_session.h): a muonshard-coordinator (heartbeat timeout 2 s), a
// 4-rank plan, 4 muonshard-worker processes training the deterministic
// regression workload with --reduce-order rank, checkpointing every few
// steps, --resume and --max-restarts. The test plays the supervisor
// (Kubernetes' pod restart, compose's restart: on-failure): a killed worker
// is started again with the same command line.
//
// Faults: kill -9 of a worker at a random step; SIGSTOP of a worker (a hung
// host: no TCP reset) and SIGCONT after the coordinator noticed; two kills in
// a row; kill -9 of the coordinator and a restart on the same data directory
// and port. Every run must end bit-identical to the unsharded reference run
// of the same steps (muonshard-worker --reference): the rank-order
// reduction makes an uninterrupted sharded run bit-identical to it, and a
// recovery must change nothing. The workers' /metrics must count the
// restarts (muonshard_worker_restarts_total) and the recovery phases.
//
// The random step and victim come from a seed printed by each test (set
// MUONSHARD_FAULT_SEED to replay one). Every wait is bounded.

#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "client/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/http_get.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "worker/params_file.h"

namespace muonshard::worker {
namespace {

using ::muonshard::testing::BinaryPath;
using ::muonshard::testing::ChildProcess;
using ::muonshard::testing::CommandResult;
using ::muonshard::testing::CoordinatorProcess;
using ::muonshard::testing::HttpGet;
using ::muonshard::testing::PollUntil;
using ::muonshard::testing::PrometheusSample;
using ::muonshard::testing::ReadFileOrEmpty;
using ::muonshard::testing::ReadJsonIntField;
using ::muonshard::testing::RunCommand;
using ::muonshard::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kWorld = 4;
constexpr int kSteps = 60;
constexpr int kCheckpointEvery = 5;
// Bounds of waits that succeed in seconds; reached only on failure.
constexpr absl::Duration kBound = absl::Seconds(120);

uint32_t Seed() {
  const char* env = std::getenv("MUONSHARD_FAULT_SEED");
  uint32_t seed = 0;
  if (env != nullptr && absl::SimpleAtoi(env, &seed)) return seed;
  return std::random_device()();
}

class FaultToleranceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = Seed();
    rng_.seed(seed_);
    std::cerr << "MUONSHARD_FAULT_SEED=" << seed_ << "\n";
    ASSERT_NO_FATAL_FAILURE(StartCoordinator({}));
    client::ConnectionOptions o;
    o.coordinator = coordinator_->address();
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::CoordinatorClient> client,
                                   client::CoordinatorClient::Connect(o));
    v1::SubmitPlanRequest submit;
    *submit.mutable_request() =
        ::muonshard::testing::MakeRequest(::muonshard::testing::DenseManifest(2, 64, 96, 80), kWorld, 1, 1, v1::SEED);
    v1::SubmitPlanResponse submitted;
    auto ctx = client->NewContext();
    MUONSHARD_ASSERT_OK(client::FromGrpcStatus(client->stub().SubmitPlan(ctx.get(), submit, &submitted)));
    version_ = submitted.version();
  }

  // Starts (or restarts, on the same data directory and port) the
  // coordinator.
  void StartCoordinator(std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--heartbeat-timeout", "2"});
    if (coordinator_ != nullptr) extra.insert(extra.end(), {"--listen", coordinator_->address()});
    coordinator_.reset();
    MUONSHARD_ASSERT_OK_AND_ASSIGN(CoordinatorProcess p,
                                   CoordinatorProcess::Start(dir_.Join("data"), dir_.path(), extra));
    coordinator_ = std::make_unique<CoordinatorProcess>(std::move(p));
  }

  std::vector<std::string> Args(int rank, bool checkpoints) const {
    std::vector<std::string> args = {
        BinaryPath("muonshard-worker"), "--coordinator", coordinator_->address(), "--job", "ft",
        "--plan-version", absl::StrCat(version_), "--rank", absl::StrCat(rank), "--steps", absl::StrCat(kSteps),
        "--workload", "regression", "--reduce-order", "rank", "--lr", "0.01", "--blas-threads", "1",
        "--metrics-port", "0", "--port-file", PortFile(rank), "--comm-timeout", "60", "--join-timeout", "60",
        "--max-restarts", "3", "--rejoin-grace", "60", "--log-every", "1000000", "--linger", "120",
        "--dump-params", dir_.Join("sharded.safetensors")};
    if (checkpoints) {
      args.insert(args.end(), {"--checkpoint-dir", dir_.Join("ckpt"), "--checkpoint-every",
                               absl::StrCat(kCheckpointEvery), "--resume"});
    }
    return args;
  }

  std::string PortFile(int rank) const { return dir_.Join(absl::StrCat("w", rank, ".port")); }

  // Starts rank `rank`'s process (again, after a kill: the supervisor's
  // restart with the same command line).
  void Launch(int rank, bool checkpoints = true) {
    const int n = ++launches_[rank];
    std::remove(PortFile(rank).c_str());
    const std::string name = absl::StrCat("w", rank, "-", n);
    MUONSHARD_ASSERT_OK_AND_ASSIGN(ChildProcess p, ChildProcess::Start(Args(rank, checkpoints), dir_.Join(name + ".out"),
                                                                       dir_.Join(name + ".err")));
    workers_[rank] = std::make_unique<ChildProcess>(std::move(p));
  }

  void LaunchAll(bool checkpoints = true) {
    for (int r = 0; r < kWorld; ++r) ASSERT_NO_FATAL_FAILURE(Launch(r, checkpoints));
  }

  // Rank `rank`'s /metrics, or an error while it is not serving.
  absl::StatusOr<std::string> Metrics(int rank) {
    int port = -1;
    if (!ReadJsonIntField(ReadFileOrEmpty(PortFile(rank)), "metrics_port", &port) || port <= 0) {
      return absl::UnavailableError(absl::StrCat("rank ", rank, " has no port file yet"));
    }
    return HttpGet("127.0.0.1", port, "/metrics");
  }

  double Sample(int rank, const std::string& name, const std::map<std::string, std::string>& labels = {}) {
    absl::StatusOr<std::string> text = Metrics(rank);
    if (!text.ok()) return -1;
    return PrometheusSample(*text, name, labels).value_or(-1);
  }

  // Waits until rank `rank` has completed `steps` optimizer steps since its
  // process started.
  void WaitForSteps(int rank, int steps) {
    MUONSHARD_ASSERT_OK(PollUntil(
        [&] { return Sample(rank, "muonshard_worker_steps_total") >= steps || !Alive(rank); }, kBound,
        absl::StrCat("rank ", rank, " at step ", steps)));
    ASSERT_TRUE(Alive(rank)) << Log(rank);
  }

  // Waits until rank `rank` has recovered `restarts` times.
  void WaitForRestarts(int rank, int restarts) {
    MUONSHARD_ASSERT_OK(PollUntil(
        [&] { return Sample(rank, "muonshard_worker_restarts_total") >= restarts || !Alive(rank); }, kBound,
        absl::StrCat("rank ", rank, "'s restart ", restarts)));
    ASSERT_TRUE(Alive(rank)) << Log(rank);
  }

  bool Alive(int rank) { return workers_[rank]->running() && !workers_[rank]->TryWait().has_value(); }

  std::string Log(int rank) const { return workers_[rank] == nullptr ? "" : workers_[rank]->Err(); }

  void Kill(int rank) {
    workers_[rank]->Signal(SIGKILL);
    workers_[rank]->Kill();  // reaps
  }

  int RandomInt(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  // Waits for the run to end (rank 0's merged dump), checks every rank's
  // restarts counter (at least the faults it lived through: a rank can need
  // one more when a second failure hits the group while it re-forms), ends
  // the lingering workers (each must exit 0) and compares the result with
  // the reference.
  void FinishAndCompare(const std::vector<int>& restarts_by_rank, int max_restarts = 3) {
    const std::string dump = dir_.Join("sharded.safetensors");
    MUONSHARD_ASSERT_OK(PollUntil(
        [&] {
          bool any_dead = false;
          for (int r = 0; r < kWorld; ++r) any_dead = any_dead || !Alive(r);
          return !ReadFileOrEmpty(dump).empty() || any_dead;
        },
        kBound, "the run's dump"));
    for (int r = 0; r < kWorld; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r));
      ASSERT_TRUE(Alive(r)) << Log(r);
      const double restarts = Sample(r, "muonshard_worker_restarts_total");
      EXPECT_GE(restarts, restarts_by_rank[r]);
      EXPECT_LE(restarts, max_restarts);
      EXPECT_EQ(Sample(r, "muonshard_worker_recovery_seconds_count", {{"phase", "rendezvous"}}), restarts);
    }
    for (int r = 0; r < kWorld; ++r) workers_[r]->Signal(SIGTERM);
    for (int r = 0; r < kWorld; ++r) {
      MUONSHARD_ASSERT_OK_AND_ASSIGN(const int code, workers_[r]->WaitForExit(kBound));
      EXPECT_EQ(code, 0) << "rank " << r << ":\n" << Log(r);
    }
    ExpectBitIdenticalToReference(dump);
  }

  void TearDown() override {
    if (!HasFailure()) return;
    for (int r = 0; r < kWorld; ++r) std::cerr << "---- rank " << r << " (last process):\n" << Log(r);
    if (coordinator_ != nullptr) std::cerr << "---- coordinator:\n" << coordinator_->Log();
  }

  void ExpectBitIdenticalToReference(const std::string& dump) {
    const std::string reference = dir_.Join("reference.safetensors");
    MUONSHARD_ASSERT_OK_AND_ASSIGN(
        CommandResult r,
        RunCommand({BinaryPath("muonshard-worker"), "--reference", "--coordinator", coordinator_->address(),
                    "--plan-version", absl::StrCat(version_), "--steps", absl::StrCat(kSteps), "--workload",
                    "regression", "--lr", "0.01", "--blas-threads", "1", "--dump-params", reference},
                   dir_.path(), kBound));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    MUONSHARD_ASSERT_OK_AND_ASSIGN(ParamsFile sharded, ReadParamsFile(dump));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(ParamsFile expected, ReadParamsFile(reference));
    const ParamsComparison cmp = CompareParams(sharded, expected, /*rtol=*/0);
    EXPECT_TRUE(cmp.bit_identical()) << ::testing::PrintToString(cmp.mismatches);
  }

  TempDir dir_;
  uint32_t seed_ = 0;
  std::mt19937 rng_;
  std::unique_ptr<CoordinatorProcess> coordinator_;
  int64_t version_ = 0;
  std::unique_ptr<ChildProcess> workers_[kWorld];
  int launches_[kWorld] = {};
};

// A killed worker (no goodbye; its peers' collectives fail on the closed
// connection) comes back through its supervisor; the survivors report,
// re-join, wait for it, and everyone restores the newest checkpoint.
TEST_F(FaultToleranceTest, KillNineOfAWorkerAtARandomStep_RecoversBitIdentical) {
  ASSERT_NO_FATAL_FAILURE(LaunchAll());
  const int victim = RandomInt(1, kWorld - 1);
  const int step = RandomInt(2, kSteps / 2);
  std::cerr << "killing rank " << victim << " at step " << step << "\n";
  ASSERT_NO_FATAL_FAILURE(WaitForSteps(0, step));
  Kill(victim);
  ASSERT_NO_FATAL_FAILURE(Launch(victim));
  std::vector<int> restarts(kWorld, 1);
  restarts[victim] = 0;  // a new process: its first run
  ASSERT_NO_FATAL_FAILURE(FinishAndCompare(restarts));
  EXPECT_THAT(Log(0), HasSubstr("recovered into generation"));
}

// A frozen worker (SIGSTOP: no TCP reset) is declared failed at the
// heartbeat timeout; the survivors leave their collective, re-join and wait
// for the group; the frozen one, thawed, finds its membership gone and
// recovers the same way.
TEST_F(FaultToleranceTest, FrozenWorker_ThawedAfterTheTimeout_AllRecoverBitIdentical) {
  ASSERT_NO_FATAL_FAILURE(LaunchAll());
  const int victim = RandomInt(1, kWorld - 1);
  const int step = RandomInt(2, kSteps / 2);
  std::cerr << "freezing rank " << victim << " at step " << step << "\n";
  ASSERT_NO_FATAL_FAILURE(WaitForSteps(0, step));
  workers_[victim]->Signal(SIGSTOP);
  // The survivors are waiting for it in the new generation's group barrier.
  MUONSHARD_ASSERT_OK(PollUntil([&] { return absl::StrContains(Log(0), "reported the error"); }, kBound,
                                "rank 0 noticing the frozen peer"));
  workers_[victim]->Signal(SIGCONT);
  ASSERT_NO_FATAL_FAILURE(FinishAndCompare(std::vector<int>(kWorld, 1)));
}

TEST_F(FaultToleranceTest, TwoKillsInARow_RecoversTwiceBitIdentical) {
  ASSERT_NO_FATAL_FAILURE(LaunchAll());
  const int first = RandomInt(1, kWorld - 1);
  const int second = first == kWorld - 1 ? 1 : first + 1;
  const int step = RandomInt(2, kSteps / 3);
  std::cerr << "killing rank " << first << " at step " << step << ", then rank " << second << "\n";
  ASSERT_NO_FATAL_FAILURE(WaitForSteps(0, step));
  Kill(first);
  ASSERT_NO_FATAL_FAILURE(Launch(first));
  ASSERT_NO_FATAL_FAILURE(WaitForRestarts(0, 1));
  Kill(second);
  ASSERT_NO_FATAL_FAILURE(Launch(second));
  std::vector<int> restarts(kWorld, 2);
  restarts[first] = 1;   // its new process lived through the second failure
  restarts[second] = 0;  // a new process
  ASSERT_NO_FATAL_FAILURE(FinishAndCompare(restarts));
}

// NOTE [Adoption] (coordinator.proto): the coordinator dies (kill -9) and
// comes back on the same data directory; the workers' heartbeats re-register
// them and training goes on with no recovery and no generation move.
// Without checkpoints: their barriers are the coordinator's only other use
// during the run (NOTE [Barriers across a coordinator restart]).
TEST_F(FaultToleranceTest, CoordinatorKillNineAndRestart_TrainingGoesOnWithoutARecovery) {
  ASSERT_NO_FATAL_FAILURE(LaunchAll(/*checkpoints=*/false));
  const int step = RandomInt(2, kSteps / 2);
  std::cerr << "killing the coordinator at step " << step << "\n";
  ASSERT_NO_FATAL_FAILURE(WaitForSteps(0, step));
  const double generation = Sample(0, "muonshard_worker_generation");
  coordinator_->Signal(SIGKILL);
  MUONSHARD_ASSERT_OK(coordinator_->WaitForExit(kBound).status());
  absl::SleepFor(absl::Seconds(1));
  ASSERT_NO_FATAL_FAILURE(StartCoordinator({}));
  ASSERT_NO_FATAL_FAILURE(FinishAndCompare(std::vector<int>(kWorld, 0), /*max_restarts=*/0));
  EXPECT_THAT(coordinator_->Log(), HasSubstr("adopt"));
  EXPECT_GT(generation, 0);
}

}  // namespace
}  // namespace muonshard::worker
