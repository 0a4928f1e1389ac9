#include "tests/checkpoint/ckpt_test_util.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"

namespace muonshard::checkpoint::testing {
namespace {

uint64_t Fnv1a(absl::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// splitmix64's finalizer.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

v1::ModelManifest SmallDenseManifest() { return muonshard::testing::DenseManifest(2, 64, 96, 200); }

v1::ModelManifest SmallMoeManifest() {
  muonshard::testing::ManifestBuilder b("small-moe");
  const int64_t hidden = 32, ffn = 24, vocab = 150;
  const int experts = 4;
  b.Add("model.embed_tokens.weight", {vocab, hidden});
  for (int l = 0; l < 2; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    b.Add(p + "self_attn.q_proj.weight", {hidden, hidden})
        .Add(p + "self_attn.o_proj.weight", {hidden, hidden})
        .Add(p + "mlp.gate.weight", {experts, hidden})
        .Add(p + "mlp.experts.gate_up_proj", {experts, 2 * ffn, hidden})
        .Add(p + "mlp.experts.down_proj", {experts, hidden, ffn});
    for (int e = 0; e < experts; ++e) {
      b.Add(absl::StrCat(p, "mlp.experts.", e, ".extra_proj.weight"), {ffn, hidden});
    }
    b.Add(p + "input_layernorm.weight", {hidden}).Add(p + "post_attention_layernorm.weight", {hidden});
  }
  b.Add("model.norm.weight", {hidden}).Add("lm_head.weight", {vocab, hidden}, v1::FP32);
  return b.Build();
}

absl::StatusOr<PlanAndRequest> MakePlan(const v1::ModelManifest& manifest, int world_size, int pp, int ep,
                                        v1::Policy policy) {
  auto request = planner::CanonicalizeRequest(muonshard::testing::MakeRequest(manifest, world_size, pp, ep, policy));
  if (!request.ok()) return request.status();
  auto plan = planner::ComputePlan(*request);
  if (!plan.ok()) return plan.status();
  return PlanAndRequest{*std::move(request), *std::move(plan)};
}

float SyntheticValue(absl::string_view name, StateKind kind, int64_t element) {
  const uint64_t h = Mix(Fnv1a(name) ^ Mix(static_cast<uint64_t>(kind) + 1) ^ Mix(static_cast<uint64_t>(element) << 3));
  // Exponent of 1.0, 23 random mantissa bits: a float in [1, 2), never NaN.
  return absl::bit_cast<float>(0x3f800000u | static_cast<uint32_t>(h >> 41));
}

Scalars SyntheticScalars(int64_t step) {
  Scalars s;
  s.step = step;
  s.beta1_pow = 0.9f;
  s.beta2_pow = 0.95f;
  for (int64_t i = 0; i < step; ++i) {
    s.beta1_pow *= 0.9f;
    s.beta2_pow *= 0.95f;
  }
  return s;
}

absl::StatusOr<std::unique_ptr<RankBuffers>> AllocateRank(const v1::Plan& plan, int rank) {
  auto specs = ExpectedShards(plan, rank);
  if (!specs.ok()) return specs.status();
  auto out = std::make_unique<RankBuffers>();
  out->storage.assign(static_cast<size_t>(TotalNumel(*specs)), -1.0f);
  int64_t at = 0;
  for (ShardSpec& spec : *specs) {
    const int64_t n = spec.numel();
    out->shards.push_back({std::move(spec), absl::Span<float>(out->storage.data() + at, static_cast<size_t>(n))});
    at += n;
  }
  return out;
}

void FillSynthetic(RankBuffers& rank) {
  for (StateShard& s : rank.shards) {
    for (int64_t i = 0; i < s.spec.numel(); ++i) {
      s.data[i] = SyntheticValue(s.spec.name, s.spec.kind, s.spec.WholeIndex(i));
    }
  }
}

absl::StatusOr<std::vector<std::unique_ptr<RankBuffers>>> SyntheticState(const v1::Plan& plan) {
  std::vector<std::unique_ptr<RankBuffers>> ranks;
  for (int r = 0; r < plan.ranks_size(); ++r) {
    auto rank = AllocateRank(plan, r);
    if (!rank.ok()) return rank.status();
    FillSynthetic(**rank);
    ranks.push_back(*std::move(rank));
  }
  return ranks;
}

std::vector<std::vector<StateShard>> ShardLists(const std::vector<std::unique_ptr<RankBuffers>>& ranks) {
  std::vector<std::vector<StateShard>> out;
  for (const auto& r : ranks) out.push_back(r->shards);
  return out;
}

absl::Status CheckSynthetic(const RankBuffers& rank) {
  for (const StateShard& s : rank.shards) {
    for (int64_t i = 0; i < s.spec.numel(); ++i) {
      const float want = SyntheticValue(s.spec.name, s.spec.kind, s.spec.WholeIndex(i));
      if (absl::bit_cast<uint32_t>(s.data[i]) != absl::bit_cast<uint32_t>(want)) {
        return absl::InternalError(absl::StrCat("tensor \"", s.spec.name, "\" ", StateKindName(s.spec.kind),
                                                " element ", s.spec.WholeIndex(i), ": ", s.data[i], ", expected ",
                                                want));
      }
    }
  }
  return absl::OkStatus();
}

ScratchDir::ScratchDir() {
  std::string tmpl = absl::StrCat(::testing::TempDir(), "/ckpt-XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << tmpl;
  path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string ScratchDir::Sub(absl::string_view name) const { return absl::StrCat(path_, "/", name); }

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status WriteAll(const std::string& path, absl::string_view data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  return out ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", path));
}

absl::Status FlipByte(const std::string& path, int64_t offset) {
  auto bytes = ReadAll(path);
  if (!bytes.ok()) return bytes.status();
  if (offset < 0 || offset >= static_cast<int64_t>(bytes->size())) return absl::OutOfRangeError("offset");
  (*bytes)[static_cast<size_t>(offset)] ^= 0x40;
  return WriteAll(path, *bytes);
}

absl::Status TruncateFile(const std::string& path, int64_t size) {
  if (::truncate(path.c_str(), size) != 0) return absl::InternalError(absl::StrCat("truncate ", path));
  return absl::OkStatus();
}

ScopedFileSizeLimit::ScopedFileSizeLimit(int64_t bytes) {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  if (::sigaction(SIGXFSZ, &ignore, &saved_action_) != 0) ADD_FAILURE() << "sigaction(SIGXFSZ)";
  if (::getrlimit(RLIMIT_FSIZE, &saved_limit_) != 0) ADD_FAILURE() << "getrlimit(RLIMIT_FSIZE)";
  rlimit limit = saved_limit_;
  limit.rlim_cur = static_cast<rlim_t>(bytes);
  if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ADD_FAILURE() << "setrlimit(RLIMIT_FSIZE, " << bytes << ")";
}

ScopedFileSizeLimit::~ScopedFileSizeLimit() {
  // Lowering only the soft limit keeps raising it back allowed without root.
  if (::setrlimit(RLIMIT_FSIZE, &saved_limit_) != 0) ADD_FAILURE() << "restoring RLIMIT_FSIZE";
  ::sigaction(SIGXFSZ, &saved_action_, nullptr);
}

}  // namespace muonshard::checkpoint::testing
