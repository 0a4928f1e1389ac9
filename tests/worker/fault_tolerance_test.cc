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
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/coordinator_client.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "importer/tp_split.h"
#include "re2/re2.h"
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

// One plan of an elastic run: from `from_step` (the checkpoint its group
// restored), `world` ranks ran plan `version`.
struct Segment {
  int64_t version = 0;
  int world = 0;
  int64_t from_step = 0;
};

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
  // coordinator; `extra` flags win over the defaults.
  void StartCoordinator(std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--heartbeat-timeout", "2"});
    if (coordinator_ != nullptr) extra.insert(extra.end(), {"--listen", coordinator_->address()});
    coordinator_.reset();
    MUONSHARD_ASSERT_OK_AND_ASSIGN(CoordinatorProcess p,
                                   CoordinatorProcess::Start(dir_.Join("data"), dir_.path(), extra));
    coordinator_ = std::make_unique<CoordinatorProcess>(std::move(p));
  }

  // Rank `rank`'s command line. An elastic job's workers name neither their
  // rank nor the plan version (a resize renumbers them and changes the
  // plan): `rank` then only names the process's slot in this test.
  std::vector<std::string> Args(int rank, bool checkpoints) const {
    std::vector<std::string> args = {BinaryPath("muonshard-worker"),
                                     "--coordinator",
                                     coordinator_->address(),
                                     "--job",
                                     "ft",
                                     "--steps",
                                     absl::StrCat(kSteps),
                                     "--workload",
                                     workload_,
                                     "--reduce-order",
                                     "rank",
                                     "--lr",
                                     "0.01",
                                     "--blas-threads",
                                     "1",
                                     "--metrics-port",
                                     "0",
                                     "--port-file",
                                     PortFile(rank),
                                     "--comm-timeout",
                                     "60",
                                     "--join-timeout",
                                     "60",
                                     "--log-every",
                                     "1000000",
                                     "--linger",
                                     "120",
                                     "--dump-params",
                                     dir_.Join("sharded.safetensors")};
    if (elastic_) {
      args.insert(args.end(),
                  {"--max-restarts", "10", "--min-workers", absl::StrCat(min_workers_), "--rejoin-grace", "3"});
    } else {
      args.insert(args.end(), {"--plan-version", absl::StrCat(version_), "--rank", absl::StrCat(rank), "--max-restarts",
                               "3", "--rejoin-grace", "60"});
    }
    if (buddy_every_ > 0) args.insert(args.end(), {"--buddy-every", absl::StrCat(buddy_every_)});
    if (checkpoints) {
      args.insert(args.end(), {"--checkpoint-dir", dir_.Join("ckpt"), "--checkpoint-every",
                               absl::StrCat(kCheckpointEvery), "--checkpoint-keep", "2", "--resume"});
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
    MUONSHARD_ASSERT_OK_AND_ASSIGN(
        ChildProcess p,
        ChildProcess::Start(Args(rank, checkpoints), dir_.Join(name + ".out"), dir_.Join(name + ".err")));
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
    MUONSHARD_ASSERT_OK(PollUntil([&] { return Sample(rank, "muonshard_worker_steps_total") >= steps || !Alive(rank); },
                                  kBound, absl::StrCat("rank ", rank, " at step ", steps)));
    ASSERT_TRUE(Alive(rank)) << Log(rank);
  }

  // Waits until rank `rank` has recovered `restarts` times.
  void WaitForRestarts(int rank, int restarts) {
    MUONSHARD_ASSERT_OK(
        PollUntil([&] { return Sample(rank, "muonshard_worker_restarts_total") >= restarts || !Alive(rank); }, kBound,
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
  // the unsharded reference run.
  void FinishAndCompare(const std::vector<int>& restarts_by_rank, int max_restarts = 3) {
    FinishAndCompareTo(
        restarts_by_rank, [&] { return RunReference(); }, max_restarts);
  }

  // The same against the dump `expected` writes (and names).
  void FinishAndCompareTo(const std::vector<int>& restarts_by_rank,
                          const std::function<absl::StatusOr<std::string>()>& expected, int max_restarts = 3) {
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
      EXPECT_LE(restarts, elastic_ ? 10 : max_restarts);
      EXPECT_EQ(Sample(r, "muonshard_worker_recovery_seconds_count", {{"phase", "rendezvous"}}), restarts);
    }
    for (int r = 0; r < kWorld; ++r) workers_[r]->Signal(SIGTERM);
    for (int r = 0; r < kWorld; ++r) {
      MUONSHARD_ASSERT_OK_AND_ASSIGN(const int code, workers_[r]->WaitForExit(kBound));
      EXPECT_EQ(code, 0) << "rank " << r << ":\n" << Log(r);
    }
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::string expected_dump, expected());
    MUONSHARD_ASSERT_OK_AND_ASSIGN(ParamsFile got, ReadParamsFile(dump));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(ParamsFile want, ReadParamsFile(expected_dump));
    const ParamsComparison cmp = CompareParams(got, want, /*rtol=*/0);
    EXPECT_TRUE(cmp.bit_identical()) << ::testing::PrintToString(cmp.mismatches);
  }

  // The unsharded reference run of the same steps; its dump.
  absl::StatusOr<std::string> RunReference() {
    const std::string reference = dir_.Join("reference.safetensors");
    absl::StatusOr<CommandResult> r =
        RunCommand({BinaryPath("muonshard-worker"), "--reference", "--coordinator", coordinator_->address(),
                    "--plan-version", absl::StrCat(version_), "--steps", absl::StrCat(kSteps), "--workload",
                    "regression", "--lr", "0.01", "--blas-threads", "1", "--dump-params", reference},
                   dir_.path(), kBound);
    if (!r.ok()) return r.status();
    if (r->exit_code != 0) return absl::InternalError(absl::StrCat("reference run failed: ", r->err));
    return reference;
  }

  // Runs `segments` one after the other, each as a job of its own on its
  // plan from the previous one's checkpoint to the next one's first step;
  // the last one's dump.
  absl::StatusOr<std::string> Replay(const std::vector<Segment>& segments) {
    const std::string dump = dir_.Join("replay.safetensors");
    for (size_t i = 0; i < segments.size(); ++i) {
      const int64_t until = i + 1 < segments.size() ? segments[i + 1].from_step : kSteps;
      std::cerr << "replay: plan version " << segments[i].version << " on " << segments[i].world << " ranks, steps "
                << segments[i].from_step << ".." << until << "\n";
      if (until == segments[i].from_step && i + 1 < segments.size()) continue;
      std::vector<ChildProcess> ranks;
      for (int r = 0; r < segments[i].world; ++r) {
        std::vector<std::string> args = {BinaryPath("muonshard-worker"),
                                         "--coordinator",
                                         coordinator_->address(),
                                         "--job",
                                         absl::StrCat("replay-", i),
                                         "--plan-version",
                                         absl::StrCat(segments[i].version),
                                         "--rank",
                                         absl::StrCat(r),
                                         "--steps",
                                         absl::StrCat(until),
                                         "--workload",
                                         workload_,
                                         "--reduce-order",
                                         "rank",
                                         "--lr",
                                         "0.01",
                                         "--blas-threads",
                                         "1",
                                         "--metrics-port",
                                         "-1",
                                         "--log-every",
                                         "1000000",
                                         "--checkpoint-dir",
                                         dir_.Join("replay-ckpt"),
                                         "--checkpoint-every",
                                         absl::StrCat(kCheckpointEvery),
                                         "--resume",
                                         "--dump-params",
                                         dump};
        const std::string name = dir_.Join(absl::StrCat("replay-", i, "-", r));
        absl::StatusOr<ChildProcess> p = ChildProcess::Start(args, name + ".out", name + ".err");
        if (!p.ok()) return p.status();
        ranks.push_back(*std::move(p));
      }
      for (ChildProcess& p : ranks) {
        absl::StatusOr<int> code = p.WaitForExit(kBound);
        if (!code.ok()) return code.status();
        if (*code != 0) return absl::InternalError(absl::StrCat("replay segment ", i, " failed: ", p.Err()));
      }
    }
    return dump;
  }

  void TearDown() override {
    if (!HasFailure()) return;
    for (int r = 0; r < kWorld; ++r) std::cerr << "---- rank " << r << " (last process):\n" << Log(r);
    if (coordinator_ != nullptr) std::cerr << "---- coordinator:\n" << coordinator_->Log();
  }

  TempDir dir_;
  bool elastic_ = false;
  int min_workers_ = kWorld - 1;  // elastic
  std::string workload_ = "regression";
  int buddy_every_ = 0;  // NOTE [Buddy copies]
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
  // --checkpoint-keep 2: the older steps were deleted as newer ones committed.
  int steps_kept = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_.Join("ckpt"))) {
    steps_kept += absl::StartsWith(entry.path().filename().string(), "step-") ? 1 : 0;
  }
  EXPECT_EQ(steps_kept, 2);
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
  // Every survivor has recovered, so the group has re-formed: a second kill
  // while one of them is still restoring merges the two recoveries into one
  // (its counter counts completed recoveries; seen once in CI, rank 3 at 1).
  for (int r = 0; r < kWorld; ++r) {
    if (r != first) {
      ASSERT_NO_FATAL_FAILURE(WaitForRestarts(r, 1));
    }
  }
  Kill(second);
  ASSERT_NO_FATAL_FAILURE(Launch(second));
  std::vector<int> restarts(kWorld, 2);
  restarts[first] = 1;   // its new process lived through the second failure
  restarts[second] = 0;  // a new process
  ASSERT_NO_FATAL_FAILURE(FinishAndCompare(restarts));
}

// NOTE [Buddy copies] (worker/buddy_copies.h): no checkpoint directory at
// all; every 5 steps each rank copies its state to its buddy. A killed
// rank's replacement gets its state from the buddy, the others restore
// their own snapshot: nothing is read from disk, at most 5 steps are lost,
// and the run still ends bit-identical.
TEST_F(FaultToleranceTest, KillNineWithBuddyCopies_RestoresFromMemoryBitIdentical) {
  buddy_every_ = 5;
  ASSERT_NO_FATAL_FAILURE(LaunchAll(/*checkpoints=*/false));
  const int victim = RandomInt(1, kWorld - 1);
  const int step = RandomInt(2 * buddy_every_, kSteps / 2);
  std::cerr << "killing rank " << victim << " at step " << step << "\n";
  ASSERT_NO_FATAL_FAILURE(WaitForSteps(0, step));
  EXPECT_GT(Sample(0, "muonshard_worker_buddy_bytes"), 0);
  Kill(victim);
  ASSERT_NO_FATAL_FAILURE(Launch(victim, /*checkpoints=*/false));
  std::vector<int> restarts(kWorld, 1);
  restarts[victim] = 0;
  ASSERT_NO_FATAL_FAILURE(FinishAndCompare(restarts));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(RE2::PartialMatch(Log(r), R"(restored step [1-9]\d* from buddy copies)")) << "rank " << r << ":\n"
                                                                                          << Log(r);
  }
  EXPECT_THAT(Log(victim), HasSubstr("1 rank(s) from their buddy, no disk read"));
}

// A rank that fails on its own (here: its checkpoint shard is damaged)
// reports its error before it exits: its peers, waiting for it in the
// restore's collective, print its own words (DATA_LOSS naming the file), not
// just a closed connection or a timeout.
TEST_F(FaultToleranceTest, DamagedShardOfOneRank_PeersPrintThatRanksOwnError) {
  ASSERT_NO_FATAL_FAILURE(LaunchAll());
  const std::string dump = dir_.Join("sharded.safetensors");
  MUONSHARD_ASSERT_OK(PollUntil([&] { return !ReadFileOrEmpty(dump).empty() || !Alive(0); }, kBound, "the run"));
  for (int r = 0; r < kWorld; ++r) workers_[r]->Kill();
  const int victim = RandomInt(1, kWorld - 1);
  const std::string shard =
      dir_.Join(absl::StrCat("ckpt/step-", kSteps, "/rank-0000", victim, "-of-0000", kWorld, ".safetensors"));
  std::string bytes = ReadFileOrEmpty(shard);
  ASSERT_GT(bytes.size(), 64u) << shard;
  bytes[bytes.size() - 8] ^= 0x5a;  // a data byte: the chunk's checksum no longer matches
  {
    std::ofstream out(shard, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  std::cerr << "damaged rank " << victim << "'s shard\n";
  ASSERT_NO_FATAL_FAILURE(LaunchAll());  // the same job again, resuming
  MUONSHARD_ASSERT_OK(PollUntil([&] { return absl::StrContains(Log(0), "DATA_LOSS"); }, kBound,
                                "rank 0 printing the damaged rank's error"));
  // NOTE [Job failure]: the damaged rank's error ended the job; every peer
  // ends with it.
  EXPECT_THAT(Log(0), HasSubstr(absl::StrCat("rank ", victim, " (")));
  EXPECT_THAT(Log(0), HasSubstr("failed: DATA_LOSS"));
  EXPECT_THAT(Log(0), HasSubstr("crc32 mismatch"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const int code, workers_[victim]->WaitForExit(kBound));
  EXPECT_EQ(code, 1) << Log(victim);
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
  // The adoption grace is two heartbeat timeouts of the restarted
  // coordinator: 6 s each here, since on a loaded 2-core CI machine the four
  // workers' channels took up to 3.5 s to find it again (measured), longer
  // than the 2 s timeout's 4 s grace leaves room for.
  ASSERT_NO_FATAL_FAILURE(StartCoordinator({"--heartbeat-timeout", "6"}));
  ASSERT_NO_FATAL_FAILURE(FinishAndCompare(std::vector<int>(kWorld, 0), /*max_restarts=*/0));
  EXPECT_THAT(coordinator_->Log(), HasSubstr("adopt"));
  EXPECT_GT(generation, 0);
}

// The plans a worker ran, from its log: its first join, then every
// recovery's "recovered into generation G ... continuing from step S" with
// the plan and world of its join of generation G.
std::vector<Segment> SegmentsOf(const std::string& log) {
  std::vector<Segment> segments;
  std::map<int64_t, Segment> joined;  // by generation
  for (const std::string& line : std::vector<std::string>(absl::StrSplit(log, '\n'))) {
    int64_t generation = 0;
    Segment s;
    if (RE2::PartialMatch(line, R"(joined job "\S+" as rank \d+ of (\d+), generation (\d+), plan version (\d+))",
                          &s.world, &generation, &s.version)) {
      joined[generation] = s;
      if (segments.empty()) segments.push_back(s);
    } else if (RE2::PartialMatch(line, R"(recovered into generation (\d+) .*continuing from step (\d+))", &generation,
                                 &s.from_step)) {
      Segment next = joined[generation];
      next.from_step = s.from_step;
      segments.push_back(next);
    }
  }
  return segments;
}

// NOTE [Elastic jobs] (coordinator.proto): rank `victim` is killed and stays
// away past the rejoin grace (3 s); the coordinator re-plans the job for the
// 3 ranks left, which restore the newest checkpoint under the new plan
// (reshard on load) and go on. The victim's slot then starts a new process,
// which grows the job back to 4 ranks. The run must end bit-identical to a
// run that switched to the same plans at the same steps by hand: each plan
// run as its own job from the previous one's checkpoint.
TEST_F(FaultToleranceTest, ShrinkFourToThreeAndGrowBack_EqualsARunThatSwitchedPlansAtTheSameSteps) {
  elastic_ = true;
  ASSERT_NO_FATAL_FAILURE(LaunchAll());
  const int victim = RandomInt(1, kWorld - 1);
  const int step = RandomInt(2, kSteps / 4);
  std::cerr << "killing slot " << victim << " at step " << step << "\n";
  ASSERT_NO_FATAL_FAILURE(WaitForSteps(0, step));
  Kill(victim);
  // Shrunk: slot 0's process runs another plan, on 3 ranks.
  MUONSHARD_ASSERT_OK(
      PollUntil([&] { return Sample(0, "muonshard_worker_plan_version") > static_cast<double>(version_) || !Alive(0); },
                kBound, "the shrink"));
  ASSERT_TRUE(Alive(0)) << Log(0);
  // What an operator sees: why the job moved, and its elasticity.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(
      CommandResult workers,
      RunCommand({BinaryPath("muonshardctl"), "workers", "--coordinator", coordinator_->address()}, dir_.path()));
  EXPECT_EQ(workers.exit_code, 0) << workers.err;
  EXPECT_THAT(workers.out, HasSubstr("moved: shrunk from 4 to 3 ranks"));
  EXPECT_THAT(workers.out, HasSubstr("elastic: 3..4 ranks"));
  ASSERT_NO_FATAL_FAILURE(WaitForSteps(0, static_cast<int>(Sample(0, "muonshard_worker_steps_total")) + 3));
  ASSERT_NO_FATAL_FAILURE(Launch(victim));  // capacity returns: grow back
  std::vector<int> restarts(kWorld, 2);     // the shrink, the grow
  restarts[victim] = 0;
  ASSERT_NO_FATAL_FAILURE(FinishAndCompareTo(restarts, [&] { return Replay(SegmentsOf(Log(0))); }));
}

// With tp 2 a rank's tensor-parallel group breaks with its partner: rank 2
// or 3 is killed and stays away; the coordinator drops its whole block (the
// replica of ranks 2 and 3, its partner included: a job with tp shrinks and
// grows by whole blocks, NOTE [Elastic jobs]) and re-plans the job sticky
// with tp 2 on 2 ranks; they restore the newest checkpoint under it and go
// on. The partner, dropped while present, waits to re-join (a block grows
// back whole); the victim's slot then starts a new process, which completes
// the block: the job grows back to 4 ranks. The run must end bit-identical
// to the same plans run one after another by hand.
TEST_F(FaultToleranceTest, TpTwoShrinksAndGrowsBackByAWholeReplica_EqualsARunThatSwitchedPlansAtTheSameSteps) {
  elastic_ = true;
  min_workers_ = 2;
  workload_ = "synthetic";  // a tp rank holds shards, not the whole parameters the regression needs
  client::ConnectionOptions o;
  o.coordinator = coordinator_->address();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::CoordinatorClient> client,
                                 client::CoordinatorClient::Connect(o));
  v1::ModelManifest manifest = ::muonshard::testing::DenseManifest(2, 64, 96, 80);
  importer::TpSplitOptions split;
  split.tp = 2;
  MUONSHARD_ASSERT_OK(importer::MarkTensorParallel(split, &manifest));
  v1::SubmitPlanRequest submit;
  *submit.mutable_request() = ::muonshard::testing::MakeRequest(manifest, kWorld, 1, 1, v1::SEED);
  submit.mutable_request()->mutable_topology()->set_tp(2);
  v1::SubmitPlanResponse submitted;
  auto ctx = client->NewContext();
  MUONSHARD_ASSERT_OK(client::FromGrpcStatus(client->stub().SubmitPlan(ctx.get(), submit, &submitted)));
  version_ = submitted.version();  // the latest: what elastic workers join

  ASSERT_NO_FATAL_FAILURE(LaunchAll());
  const int step = RandomInt(2, kSteps / 4);
  ASSERT_NO_FATAL_FAILURE(WaitForSteps(0, step));
  // Elastic workers take ranks in join order: find each slot's.
  std::map<int, int> slot_of;  // rank -> slot
  for (int slot = 0; slot < kWorld; ++slot) {
    int rank = -1;
    ASSERT_TRUE(ReadJsonIntField(ReadFileOrEmpty(PortFile(slot)), "rank", &rank)) << PortFile(slot);
    slot_of[rank] = slot;
  }
  ASSERT_EQ(slot_of.size(), static_cast<size_t>(kWorld));
  const int victim_rank = RandomInt(2, 3);
  const int victim = slot_of[victim_rank], partner = slot_of[5 - victim_rank];
  const int survivors[] = {slot_of[0], slot_of[1]};
  std::cerr << "killing rank " << victim_rank << " (slot " << victim << ") after step " << step << "\n";
  Kill(victim);
  MUONSHARD_ASSERT_OK(PollUntil(
      [&] {
        return Sample(survivors[0], "muonshard_worker_plan_version") > static_cast<double>(version_) ||
               !Alive(survivors[0]);
      },
      kBound, "the shrink"));
  ASSERT_TRUE(Alive(survivors[0])) << Log(survivors[0]);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(
      CommandResult workers,
      RunCommand({BinaryPath("muonshardctl"), "workers", "--coordinator", coordinator_->address()}, dir_.path()));
  EXPECT_EQ(workers.exit_code, 0) << workers.err;
  EXPECT_THAT(workers.out, HasSubstr("moved: shrunk from 4 to 2 ranks"));
  EXPECT_THAT(workers.out, HasSubstr("whole blocks of 2 ranks"));
  // The partner waits to re-join; the victim's slot brings the block back.
  ASSERT_NO_FATAL_FAILURE(
      WaitForSteps(survivors[0], static_cast<int>(Sample(survivors[0], "muonshard_worker_steps_total")) + 3));
  ASSERT_TRUE(Alive(partner)) << Log(partner);  // retrying its join (UNAVAILABLE: half a block)
  ASSERT_NO_FATAL_FAILURE(Launch(victim));
  std::vector<int> restarts(kWorld, 2);  // the shrink, the grow
  restarts[victim] = 0;
  restarts[partner] = 1;  // its first recovery, into the grown job
  ASSERT_NO_FATAL_FAILURE(FinishAndCompareTo(restarts, [&] { return Replay(SegmentsOf(Log(survivors[0]))); }));
  EXPECT_EQ(SegmentsOf(Log(survivors[0])).size(), 3u) << Log(survivors[0]);
}

}  // namespace
}  // namespace muonshard::worker
