// Train, save, resume under another plan, continue: the central
// checkpoint promise, with the real sharded optimizer (threads as ranks,
// in-process communicators). Gradients depend only on (tensor, step,
// element), identical on every rank, so the uninterrupted trajectory does
// not depend on the world size and any layout can continue it: same world
// size -> bit-identical, otherwise within 1e-5 (the mean of n equal fp32
// values is exact for n a power of two and within an ulp otherwise).
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "gtest/gtest.h"
#include "importer/tp_split.h"
#include "kernels/kernel_backend.h"
#include "plan/model.h"
#include "plan/plan_view.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/worker/fake_device_backend.h"
#include "tests/worker/optimizer_test_util.h"
#include "worker/optimizer/gradient_source.h"
#include "worker/optimizer/sharded_optimizer.h"

namespace muonshard::checkpoint {
namespace {

using worker::ShardedOptimizer;

// A deterministic value in [-scale, scale) of (name, salt, element).
float Value(const std::string& name, int64_t salt, int64_t element, float scale) {
  uint64_t h = std::hash<std::string>{}(name) ^ (static_cast<uint64_t>(salt) * 0x9E3779B97F4A7C15ull);
  h ^= static_cast<uint64_t>(element) + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return scale * (static_cast<float>(h >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
}

// Every rank of one plan: communicators, backends, optimizers.
struct Job {
  v1::PlanRequest request;  // what the plan was computed from
  v1::Plan plan;
  worker::testing::PlanComms comms;
  std::vector<std::unique_ptr<kernels::KernelBackend>> backends;
  std::vector<std::unique_ptr<ShardedOptimizer>> ranks;
};

std::unique_ptr<kernels::KernelBackend> MakeBackend(bool fake_device) {
  if (fake_device) return std::make_unique<worker::testing::FakeDeviceBackend>();
  return kernels::CreateCpuKernelBackend();
}

std::unique_ptr<Job> StartJob(const v1::ModelManifest& manifest, int world, int ep, v1::Policy policy,
                              bool fake_device = false, int tp = 1) {
  auto job = std::make_unique<Job>();
  v1::PlanRequest request = testing::MakeRequest(manifest, world, 1, ep, policy);
  request.mutable_topology()->set_tp(tp);
  job->request = request;
  auto plan = planner::ComputePlan(request);
  EXPECT_TRUE(plan.ok()) << plan.status();
  job->plan = *std::move(plan);
  auto comms = worker::testing::CreateInProcessPlanComms(job->plan);
  EXPECT_TRUE(comms.ok()) << comms.status();
  job->comms = *std::move(comms);
  for (int r = 0; r < world; ++r) {
    auto view = planner::ExtractRankView(job->plan, r);
    EXPECT_TRUE(view.ok()) << view.status();
    job->backends.push_back(MakeBackend(fake_device));
    auto opt =
        ShardedOptimizer::Create(*view, job->comms.by_rank[r], job->backends.back().get(), worker::OptimizerConfig());
    EXPECT_TRUE(opt.ok()) << opt.status();
    job->ranks.push_back(*std::move(opt));
  }
  return job;
}

// Runs fn(rank) on one thread per rank (collectives need them all).
void OnEveryRank(Job& job, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> status(job.ranks.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < job.ranks.size(); ++r) threads.emplace_back([&, r] { status[r] = fn(r); });
  for (std::thread& t : threads) t.join();
  for (size_t r = 0; r < status.size(); ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
}

// The whole tensor's index of element `i` of held part `h` (a TP shard's
// elements are strided in the whole tensor).
int64_t WholeElement(const worker::HeldTensor& h, int64_t i) {
  if (h.tp <= 1) return h.element_begin + i;
  return planner::TpShardRunsOf(*h.spec, h.tp, h.tp_rank).WholeIndex(h.element_begin + i);
}

void SetInitialParameters(Job& job) {
  for (auto& opt : job.ranks) {
    for (const worker::HeldTensor& h : opt->held_tensors()) {
      std::vector<float> v(h.numel());
      for (int64_t i = 0; i < h.numel(); ++i) v[i] = Value(h.spec->name(), -1, WholeElement(h, i), 0.5f);
      ASSERT_TRUE(opt->SetParameter(h.tensor, v).ok());
    }
  }
}

void Train(Job& job, int64_t from, int64_t to) {
  OnEveryRank(job, [&](int r) -> absl::Status {
    ShardedOptimizer& opt = *job.ranks[r];
    for (int64_t step = from; step < to; ++step) {
      worker::GradientMap grads;
      for (const worker::HeldTensor& h : opt.held_tensors()) {
        std::vector<float>& g = grads.Mutable(h.tensor);
        g.resize(h.numel());
        for (int64_t i = 0; i < h.numel(); ++i) g[i] = Value(h.spec->name(), step, WholeElement(h, i), 1.0f);
      }
      auto stats = opt.Step(grads);
      if (!stats.ok()) return stats.status();
    }
    return absl::OkStatus();
  });
}

void Save(Job& job, const std::string& dir, int64_t step) {
  OnEveryRank(job, [&](int r) -> absl::Status {
    auto shards = job.ranks[r]->StateShards();
    if (!shards.ok()) return shards.status();
    RankFileTarget target{dir, step, job.plan.content_hash(), r, job.plan.topology().world_size(), ""};
    return WriteRankFile(target, *shards, job.ranks[r]->scalars()).status();
  });
  MUONSHARD_ASSERT_OK(CommitCheckpoint(dir, step, job.plan, job.request));
}

void Resume(Job& job, const std::string& dir) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(Checkpoint ckpt, OpenCheckpoint(dir));
  MUONSHARD_ASSERT_OK(CheckCompatible(ckpt.index, job.plan));
  std::vector<Scalars> scalars(job.ranks.size());
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<StateShard> shards, job.ranks[r]->StateShards());
    MUONSHARD_ASSERT_OK_AND_ASSIGN(LoadResult loaded, LoadRankState(ckpt, shards));
    scalars[r] = loaded.scalars;
  }
  OnEveryRank(job, [&](int r) { return job.ranks[r]->RestoreFromState(scalars[r]); });
}

// Full fp32 masters by tensor name, assembled from every rank's parts.
std::map<std::string, std::vector<float>> Masters(Job& job) {
  std::vector<std::map<int, std::vector<float>>> per_rank(job.ranks.size());
  OnEveryRank(job, [&](int r) -> absl::Status {
    auto m = job.ranks[r]->GatherMasters();
    if (!m.ok()) return m.status();
    per_rank[r] = *std::move(m);
    return absl::OkStatus();
  });
  std::map<std::string, std::vector<float>> out;
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    for (const worker::HeldTensor& h : job.ranks[r]->held_tensors()) {
      std::vector<float>& full = out[h.spec->name()];
      full.resize(h.spec->numel());
      const std::vector<float>& part = per_rank[r].at(h.tensor);
      for (int64_t i = 0; i < h.numel(); ++i) full[WholeElement(h, i)] = part[i];
    }
  }
  return out;
}

// Every rank's optimizer state, by (tensor, kind) over the whole tensor's
// element space, assembled from the shards the ranks hold (StateShards).
std::map<std::pair<std::string, int>, std::vector<float>> WholeState(Job& job) {
  std::map<std::pair<std::string, int>, std::vector<float>> out;
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    auto shards = job.ranks[r]->StateShards();
    EXPECT_TRUE(shards.ok()) << shards.status();
    if (!shards.ok()) return out;
    for (const StateShard& s : *shards) {
      std::vector<float>& whole = out[{s.spec.name, static_cast<int>(s.spec.kind)}];
      whole.resize(s.spec.tensor_numel);
      for (int64_t i = 0; i < s.spec.numel(); ++i) whole[s.spec.WholeIndex(i)] = s.data[i];
    }
  }
  return out;
}

struct Case {
  std::string name;
  bool moe;
  int world;
  int ep;
  v1::Policy policy;
  // Both jobs on FakeDeviceBackend: the checkpoint shards are host copies
  // of device state (StateShards/RestoreFromState's mirror path).
  bool fake_device = false;
  // Every tensor FP32: the masters saved and loaded are the model copies
  // (NOTE [FP32 masters] in sharded_optimizer.h).
  bool fp32 = false;
};

v1::ModelManifest MaybeFp32(v1::ModelManifest m, bool fp32) {
  return fp32 ? worker::testing::WithDType(std::move(m), v1::FP32) : m;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ResumeTest : public ::testing::TestWithParam<Case> {};

TEST_P(ResumeTest, ContinuesTheUninterruptedRun) {
  const Case& c = GetParam();
  const v1::ModelManifest manifest =
      MaybeFp32(c.moe ? testing::MoeManifest(2, 64, 48, 8, 96) : testing::DenseManifest(2, 64, 96, 128), c.fp32);
  const int from_ep = c.moe ? 2 : 1;
  constexpr int kSteps = 3;
  // A fresh directory: suites run side by side (ctest -j, several checkouts).
  const testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string& dir = tmp.path();

  auto uninterrupted = StartJob(manifest, 4, from_ep, v1::SEED, c.fake_device);
  SetInitialParameters(*uninterrupted);
  Train(*uninterrupted, 0, kSteps);
  Save(*uninterrupted, dir, kSteps);
  const auto saved = WholeState(*uninterrupted);
  Train(*uninterrupted, kSteps, 2 * kSteps);
  const auto expected = Masters(*uninterrupted);

  auto resumed = StartJob(manifest, c.world, c.ep, c.policy, c.fake_device);
  Resume(*resumed, dir);
  EXPECT_EQ(resumed->ranks[0]->steps_done(), kSteps);
  // The loaded state is the saved state, bit for bit, on the new layout.
  const auto loaded = WholeState(*resumed);
  ASSERT_EQ(loaded.size(), saved.size());
  for (const auto& [key, want] : saved) EXPECT_TRUE(worker::testing::BitEqual(loaded.at(key), want)) << key.first;
  if (c.fp32) {
    // The model copies are the loaded masters.
    for (auto& opt : resumed->ranks) {
      for (const worker::HeldTensor& h : opt->held_tensors()) {
        MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<float> model, opt->ModelCopy(h.tensor));
        const std::vector<float>& master = loaded.at({h.spec->name(), static_cast<int>(StateKind::kMaster)});
        for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(model[i], master[WholeElement(h, i)]) << h.spec->name();
      }
    }
  }
  Train(*resumed, kSteps, 2 * kSteps);
  const auto actual = Masters(*resumed);

  ASSERT_EQ(actual.size(), expected.size());
  const bool same_layout = c.world == 4 && c.ep == from_ep && c.policy == v1::SEED;
  for (const auto& [name, want] : expected) {
    const std::vector<float>& got = actual.at(name);
    if (same_layout) {
      EXPECT_TRUE(worker::testing::BitEqual(got, want)) << name;
    } else {
      EXPECT_TRUE(worker::testing::NearScaled(got, want, 1e-5)) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ResumeTest,
    ::testing::Values(Case{"dense_w4_same", false, 4, 1, v1::SEED}, Case{"dense_w1", false, 1, 1, v1::SEED},
                      Case{"dense_w2", false, 2, 1, v1::SEED}, Case{"dense_w3", false, 3, 1, v1::SEED},
                      Case{"dense_w8", false, 8, 1, v1::SEED}, Case{"dense_w3_balanced", false, 3, 1, v1::BALANCED},
                      Case{"moe_w4_same", true, 4, 2, v1::SEED}, Case{"moe_w4_ep4", true, 4, 4, v1::SEED},
                      Case{"moe_w4_same_fake_device", true, 4, 2, v1::SEED, true},
                      Case{"dense_w3_balanced_fake_device", false, 3, 1, v1::BALANCED, true},
                      Case{"moe_w4_ep1", true, 4, 1, v1::SEED}, Case{"moe_w8_ep4_balanced", true, 8, 4, v1::BALANCED},
                      Case{"moe_w2_ep2", true, 2, 2, v1::SEED},
                      Case{"dense_fp32_w4_same", false, 4, 1, v1::SEED, false, true},
                      Case{"dense_fp32_w3", false, 3, 1, v1::SEED, false, true},
                      Case{"dense_fp32_w8", false, 8, 1, v1::SEED, false, true},
                      Case{"dense_fp32_w3_balanced_fake_device", false, 3, 1, v1::BALANCED, true, true},
                      Case{"moe_fp32_w4_same", true, 4, 2, v1::SEED, false, true},
                      Case{"moe_fp32_w4_ep1_balanced", true, 4, 1, v1::BALANCED, false, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// --- tensor parallelism: save under one tp, load under another ---

// Experts are split over TP too unless a layout has ep > 1 (there they stay
// whole, Paddle's expert_tensor_parallel_degree <= 1).
v1::ModelManifest TpManifest(bool moe, bool split_experts = true) {
  v1::ModelManifest m = moe ? testing::MoeManifest(2, 64, 48, 8, 96) : testing::DenseManifest(2, 64, 96, 128);
  importer::TpSplitOptions options;
  options.tp = 4;  // divisible by 4, so by 2 and 1 too
  options.split_experts = split_experts;
  EXPECT_TRUE(importer::MarkTensorParallel(options, &m).ok());
  return m;
}

struct TpCase {
  std::string name;
  bool moe;
  int from_world, from_tp;
  int to_world, to_tp;
  int from_ep = 1, to_ep = 1;
  bool fp32 = false;
};

void PrintTo(const TpCase& c, std::ostream* os) { *os << c.name; }

class TpResumeTest : public ::testing::TestWithParam<TpCase> {};

// Gradients depend on (tensor, step, whole element) only and the mean of
// 1, 2 or 4 equal values is exact, so every layout, tp included, continues
// the uninterrupted run bit for bit.
TEST_P(TpResumeTest, ContinuesTheUninterruptedRunBitForBit) {
  const TpCase& c = GetParam();
  const v1::ModelManifest manifest = MaybeFp32(TpManifest(c.moe, c.from_ep == 1 && c.to_ep == 1), c.fp32);
  constexpr int kSteps = 2;
  const testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  auto uninterrupted = StartJob(manifest, c.from_world, c.from_ep, v1::BALANCED, false, c.from_tp);
  SetInitialParameters(*uninterrupted);
  Train(*uninterrupted, 0, kSteps);
  Save(*uninterrupted, tmp.path(), kSteps);
  const auto saved = WholeState(*uninterrupted);
  Train(*uninterrupted, kSteps, 2 * kSteps);
  const auto expected = Masters(*uninterrupted);

  auto resumed = StartJob(manifest, c.to_world, c.to_ep, v1::BALANCED, false, c.to_tp);
  Resume(*resumed, tmp.path());
  // The state is the saved state, bit for bit, on the new layout.
  const auto loaded = WholeState(*resumed);
  ASSERT_EQ(loaded.size(), saved.size());
  for (const auto& [key, want] : saved) EXPECT_TRUE(worker::testing::BitEqual(loaded.at(key), want)) << key.first;
  Train(*resumed, kSteps, 2 * kSteps);
  const auto actual = Masters(*resumed);
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, want] : expected) EXPECT_TRUE(worker::testing::BitEqual(actual.at(name), want)) << name;
}

INSTANTIATE_TEST_SUITE_P(Layouts, TpResumeTest,
                         ::testing::Values(TpCase{"dense_w4tp2_to_w4tp1", false, 4, 2, 4, 1},
                                           TpCase{"dense_w4tp1_to_w4tp2", false, 4, 1, 4, 2},
                                           TpCase{"dense_w4tp2_same", false, 4, 2, 4, 2},
                                           TpCase{"dense_w4tp2_to_w8tp4", false, 4, 2, 8, 4},
                                           TpCase{"dense_w8tp4_to_w2tp2", false, 8, 4, 2, 2},
                                           TpCase{"moe_w4tp2_to_w4tp1", true, 4, 2, 4, 1},
                                           TpCase{"moe_w4tp1_to_w4tp2", true, 4, 1, 4, 2},
                                           // (W, tp, ep) -> (W', tp', ep'): experts whole, spread
                                           // over the tp ranks (ep rank = d * tp + t).
                                           TpCase{"moe_w4tp2ep2_to_w4tp1ep1", true, 4, 2, 4, 1, 2, 1},
                                           TpCase{"moe_w4tp1ep4_to_w4tp2ep2", true, 4, 1, 4, 2, 4, 2},
                                           TpCase{"moe_w8tp2ep4_to_w4tp2ep2", true, 8, 2, 4, 2, 4, 2},
                                           TpCase{"moe_w4tp2ep2_to_w8tp4ep4", true, 4, 2, 8, 4, 2, 4},
                                           TpCase{"moe_w8tp2ep8_to_w4tp2ep1", true, 8, 2, 4, 2, 8, 1},
                                           TpCase{"dense_fp32_w4tp2_to_w4tp1", false, 4, 2, 4, 1, 1, 1, true},
                                           TpCase{"dense_fp32_w4tp1_to_w8tp4", false, 4, 1, 8, 4, 1, 1, true},
                                           TpCase{"moe_fp32_w4tp2ep2_to_w4tp1ep1", true, 4, 2, 4, 1, 2, 1, true}),
                         [](const ::testing::TestParamInfo<TpCase>& info) { return info.param.name; });

// The round trip: (W=4, tp=2) -> (W=4, tp=1) -> (W=4, tp=2), each
// load bit-identical to what was saved, every shard of every state.
TEST(TpReshardTest, Tp2ToTp1AndBack_StateBitIdentical) {
  const v1::ModelManifest manifest = TpManifest(false);
  const testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  auto tp2 = StartJob(manifest, 4, 1, v1::BALANCED, false, 2);
  SetInitialParameters(*tp2);
  Train(*tp2, 0, 2);
  Save(*tp2, tmp.path() + "/a", 2);
  auto tp1 = StartJob(manifest, 4, 1, v1::BALANCED, false, 1);
  Resume(*tp1, tmp.path() + "/a");
  Save(*tp1, tmp.path() + "/b", 2);
  auto back = StartJob(manifest, 4, 1, v1::BALANCED, false, 2);
  Resume(*back, tmp.path() + "/b");
  const auto original = WholeState(*tp2);
  const auto via_tp1 = WholeState(*tp1);
  const auto round_trip = WholeState(*back);
  for (const auto& [key, want] : original) {
    EXPECT_TRUE(worker::testing::BitEqual(via_tp1.at(key), want)) << key.first;
    EXPECT_TRUE(worker::testing::BitEqual(round_trip.at(key), want)) << key.first;
  }
  // And shard by shard on the same ranks.
  for (size_t r = 0; r < tp2->ranks.size(); ++r) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<StateShard> a, tp2->ranks[r]->StateShards());
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<StateShard> b, back->ranks[r]->StateShards());
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(worker::testing::BitEqual(a[k].data, b[k].data)) << r;
  }
}

}  // namespace
}  // namespace muonshard::checkpoint
