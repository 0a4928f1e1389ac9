// muonshard-bench-checkpoint: save / verify / reshard-on-load throughput for
// a DeepSeek-V3-shaped MoE (MLA attention, one dense layer, routed + shared
// experts) scaled down to ~1.6 GB of fp32 optimizer state. Saves it under
// W=8 ep=4, then loads every rank of other layouts (reads straight into the
// new ranks' buffers, chunk crc32s checked), warm (page cache) and cold
// (each file's pages dropped with posix_fadvise first), after a first pass
// into freshly allocated buffers, and with
// --write-reshard writes one resharded checkpoint. Figures are in docs/benchmarks.md (Checkpoints).
//
//   muonshard-bench-checkpoint --dir /tmp/ckpt-bench [--threads 2] [--layers 6] [--write-reshard]
//
// Everything under --dir is removed at the end.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "checkpoint/reshard_plan.h"
#include "checkpoint/state.h"
#include "checkpoint/verify.h"
#include "checkpoint/writer.h"
#include "common/env.h"
#include "common/flags.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"

namespace muonshard::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string dir = "/tmp/muonshard-ckpt-bench";
  int threads = 2;
  int layers = 6;
  bool write_reshard = false;
};

// DeepSeek-V3's block structure at 1/7 of its width: hidden 1024, MLA
// (q_lora 384, kv_lora 128, 8 heads of 64+32), 32 routed experts of ffn 256
// plus a shared one, vocab 16k.
v1::ModelManifest ScaledMoe(int layers) {
  const int64_t hidden = 1024, q_lora = 384, kv_lora = 128, heads = 8, nope = 64, rope = 32, v_head = 64;
  const int64_t dense_ffn = 2816, expert_ffn = 256, vocab = 16000;
  const int experts = 32;
  testing::ManifestBuilder b("deepseek-v3-scaled");
  b.Add("model.embed_tokens.weight", {vocab, hidden});
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    b.Add(p + "self_attn.q_a_proj.weight", {q_lora, hidden})
        .Add(p + "self_attn.q_a_layernorm.weight", {q_lora})
        .Add(p + "self_attn.q_b_proj.weight", {heads * (nope + rope), q_lora})
        .Add(p + "self_attn.kv_a_proj_with_mqa.weight", {kv_lora + rope, hidden})
        .Add(p + "self_attn.kv_a_layernorm.weight", {kv_lora})
        .Add(p + "self_attn.kv_b_proj.weight", {heads * (nope + v_head), kv_lora})
        .Add(p + "self_attn.o_proj.weight", {hidden, heads * v_head});
    if (l == 0) {
      b.Add(p + "mlp.gate_proj.weight", {dense_ffn, hidden})
          .Add(p + "mlp.up_proj.weight", {dense_ffn, hidden})
          .Add(p + "mlp.down_proj.weight", {hidden, dense_ffn});
    } else {
      for (int e = 0; e < experts; ++e) {
        const std::string q = absl::StrCat(p, "mlp.experts.", e, ".");
        b.Add(q + "gate_proj.weight", {expert_ffn, hidden})
            .Add(q + "up_proj.weight", {expert_ffn, hidden})
            .Add(q + "down_proj.weight", {hidden, expert_ffn});
      }
      b.Add(p + "mlp.gate.weight", {experts, hidden})
          .Add(p + "mlp.gate.e_score_correction_bias", {experts}, v1::FP32)
          .Add(p + "mlp.shared_experts.gate_proj.weight", {expert_ffn, hidden})
          .Add(p + "mlp.shared_experts.up_proj.weight", {expert_ffn, hidden})
          .Add(p + "mlp.shared_experts.down_proj.weight", {hidden, expert_ffn});
    }
    b.Add(p + "input_layernorm.weight", {hidden}).Add(p + "post_attention_layernorm.weight", {hidden});
  }
  b.Add("model.norm.weight", {hidden}).Add("lm_head.weight", {vocab, hidden});
  return b.Build();
}

struct Planned {
  v1::PlanRequest request;
  v1::Plan plan;
};

absl::StatusOr<Planned> PlanFor(const v1::ModelManifest& m, int world, int ep) {
  auto request = planner::CanonicalizeRequest(testing::MakeRequest(m, world, 1, ep, v1::SEED));
  if (!request.ok()) return request.status();
  auto plan = planner::ComputePlan(*request);
  if (!plan.ok()) return plan.status();
  return Planned{*std::move(request), *std::move(plan)};
}

// One rank's state in one buffer; values need not mean anything here.
struct RankState {
  std::vector<float> storage;
  std::vector<StateShard> shards;
};

absl::StatusOr<std::unique_ptr<RankState>> Allocate(const v1::Plan& plan, int rank, bool fill) {
  auto specs = ExpectedShards(plan, rank);
  if (!specs.ok()) return specs.status();
  auto s = std::make_unique<RankState>();
  s->storage.resize(static_cast<size_t>(TotalNumel(*specs)));
  if (fill) {
    for (size_t i = 0; i < s->storage.size(); ++i) s->storage[i] = static_cast<float>(i % 1000) * 1e-3f;
  }
  int64_t at = 0;
  for (ShardSpec& spec : *specs) {
    const int64_t n = spec.numel();
    s->shards.push_back({std::move(spec), absl::Span<float>(s->storage.data() + at, static_cast<size_t>(n))});
    at += n;
  }
  return s;
}

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

void Report(absl::string_view what, int64_t bytes, double seconds) {
  std::cout << absl::StrFormat("| %-46s | %9.3f | %7.3f | %6.2f |\n", what, bytes / 1e9, seconds,
                               bytes / 1e9 / seconds);
}

// Writes every rank's file (threads take ranks round-robin) and commits.
absl::Status Save(const std::string& dir, const Planned& p, const std::vector<std::unique_ptr<RankState>>& ranks,
                  int threads) {
  std::vector<absl::Status> status(threads);
  std::vector<std::thread> workers;
  Scalars scalars;
  scalars.step = 100;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int r = t; r < p.plan.ranks_size() && status[t].ok(); r += threads) {
        RankFileTarget target{dir, 100, p.plan.content_hash(), r, p.plan.ranks_size(), ""};
        status[t] = WriteRankFile(target, ranks[r]->shards, scalars).status();
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return CommitCheckpoint(dir, 100, p.plan, p.request);
}

void DropCaches(const Checkpoint& c) {
  for (const v1::CheckpointFile& f : c.index.files()) {
    auto file = c.env->NewRandomAccessFile(absl::StrCat(c.step_dir, "/", f.name()));
    if (file.ok()) (*file)->DropCache();
  }
}

// Loads every rank into its preallocated state (threads take ranks
// round-robin); bytes read.
absl::StatusOr<int64_t> LoadAll(const Checkpoint& c, const std::vector<std::unique_ptr<RankState>>& ranks,
                                int threads) {
  std::vector<absl::Status> status(threads);
  std::atomic<int64_t> bytes{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (size_t r = t; r < ranks.size() && status[t].ok(); r += threads) {
        auto loaded = LoadRankState(c, ranks[r]->shards);
        if (!loaded.ok()) {
          status[t] = loaded.status();
          return;
        }
        bytes += loaded->bytes_read;
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return bytes.load();
}

// Every rank's state of `plan`, allocated and touched: page faults on fresh
// memory cost as much as the load itself on some VMs (0.3 GB/s here), and a
// worker has its buffers long before it loads.
absl::StatusOr<std::vector<std::unique_ptr<RankState>>> AllocateAll(const v1::Plan& plan, bool fill) {
  std::vector<std::unique_ptr<RankState>> ranks;
  for (int r = 0; r < plan.ranks_size(); ++r) {
    auto state = Allocate(plan, r, fill);
    if (!state.ok()) return state.status();
    ranks.push_back(*std::move(state));
  }
  return ranks;
}

absl::Status LoadCase(const Checkpoint& c, const v1::ModelManifest& m, int world, int ep, int threads) {
  auto to = PlanFor(m, world, ep);
  if (!to.ok()) return to.status();
  auto summary = SummarizeReshard(c.index, c.plan, to->plan);
  if (!summary.ok()) return summary.status();
  const std::string label = absl::StrFormat("load W=8 ep=4 -> W=%d ep=%d", world, ep);
  // Filled, not zeroed: zero pages may be shared (KSM) and fault again on
  // the first real write.
  auto ranks = AllocateAll(to->plan, /*fill=*/true);
  if (!ranks.ok()) return ranks.status();
  // Pass 1 is the first write into the buffers (on this VM it pays a
  // first-touch cost the fill does not remove); 2 reads from the page cache;
  // 3 from disk.
  for (const char* pass : {"first pass", "warm", "cold"}) {
    if (absl::string_view(pass) == "cold") DropCaches(c);
    const auto start = Clock::now();
    auto bytes = LoadAll(c, *ranks, threads);
    if (!bytes.ok()) return bytes.status();
    Report(absl::StrCat(label, ", ", pass), *bytes, Seconds(start));
  }
  std::cerr << absl::StrFormat("  %s: %.1f%% of the state changes rank\n", label,
                               100.0 * summary->moved_bytes() / summary->state_bytes());
  return absl::OkStatus();
}

absl::Status Run(const Options& o) {
  const v1::ModelManifest manifest = ScaledMoe(o.layers);
  auto from = PlanFor(manifest, 8, 4);
  if (!from.ok()) return from.status();
  const std::string src = absl::StrCat(o.dir, "/src"), out = absl::StrCat(o.dir, "/out");
  std::cout << absl::StrFormat("model %s: %d tensors, %d threads\n\n", manifest.model(), manifest.tensors_size(),
                               o.threads);
  std::cout << "| operation                                      | GB        | s       | GB/s   |\n"
               "|------------------------------------------------|-----------|---------|--------|\n";
  auto ranks = AllocateAll(from->plan, /*fill=*/true);
  if (!ranks.ok()) return ranks.status();
  auto start = Clock::now();
  if (absl::Status s = Save(src, *from, *ranks, o.threads); !s.ok()) return s;
  ranks->clear();
  auto c = OpenCheckpoint(src);
  if (!c.ok()) return c.status();
  const v1::CheckpointSummary summary = SummarizeCheckpoint(*c);
  Report("save W=8 ep=4 (write, crc32, fsync, commit)", summary.file_bytes(), Seconds(start));
  start = Clock::now();
  if (absl::Status s = VerifyCheckpoint(*c).status(); !s.ok()) return s;
  Report("verify (ckpt inspect), warm", summary.file_bytes(), Seconds(start));
  for (auto [world, ep] : {std::pair{8, 4}, std::pair{4, 2}, std::pair{8, 2}}) {
    if (absl::Status s = LoadCase(*c, manifest, world, ep, o.threads); !s.ok()) return s;
  }
  if (!o.write_reshard) return absl::OkStatus();
  auto to = PlanFor(manifest, 4, 2);
  if (!to.ok()) return to.status();
  DropCaches(*c);
  start = Clock::now();
  auto written = ReshardCheckpoint(*c, to->plan, to->request, out);
  if (!written.ok()) return written.status();
  Report("reshard to disk W=8 ep=4 -> W=4 ep=2 (read GB)", written->bytes_read(), Seconds(start));
  return absl::OkStatus();
}

}  // namespace
}  // namespace muonshard::checkpoint

int main(int argc, char** argv) {
  muonshard::checkpoint::Options o;
  muonshard::FlagSet flags("usage: muonshard-bench-checkpoint [--dir D] [--threads T] [--layers L] [--write-reshard]");
  flags.String("dir", &o.dir, "scratch directory (removed at the end)");
  flags.Int("threads", &o.threads, "ranks saved / loaded concurrently");
  flags.Int("layers", &o.layers, "decoder layers (6: ~1.6 GB of state)");
  flags.Bool("write-reshard", &o.write_reshard, "also write a resharded checkpoint (W=4 ep=2) to disk");
  auto parsed = flags.Parse(muonshard::ArgsOf(argc, argv));
  if (!parsed.ok() || flags.help_requested() || o.threads < 1 || o.layers < 2) {
    std::cerr << flags.Usage();
    return 2;
  }
  std::error_code ec;
  if (std::filesystem::exists(o.dir, ec)) {
    std::cerr << "--dir " << o.dir << " exists; pick a fresh one (it is removed at the end)\n";
    return 2;
  }
  absl::Status s = muonshard::checkpoint::Run(o);
  std::filesystem::remove_all(o.dir, ec);
  if (!s.ok()) {
    std::cerr << "error: " << s << "\n";
    return 1;
  }
  return 0;
}
