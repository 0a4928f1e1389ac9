// Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/) from
// the repository's fixtures, with the project's own encoders, so every seed
// is an input the real code accepts (checked here before it is written):
//
//   build/fuzz/muonshard-fuzz-seeds fuzz/corpus     (from the repository root)
//
// Deterministic: running it again rewrites the same bytes. The seeds are
// committed; rerun it when a fixture or a message changes.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/index.h"
#include "checkpoint/state.h"
#include "common/proto_json.h"
#include "common/safetensors_header.h"
#include "importer/hf_import.h"
#include "importer/safetensors_import.h"
#include "muonshard/v1/checkpoint.pb.h"
#include "muonshard/v1/coordinator.pb.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"

namespace muonshard::fuzz {
namespace {

std::string out_dir;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "make_seeds: %s\n", what.c_str());
  std::exit(1);
}

void Check(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Die(absl::StrCat("cannot read ", path, " (run from the repository root)"));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = absl::StrCat(out_dir, "/", target);
  std::filesystem::create_directories(dir);
  std::ofstream out(absl::StrCat(dir, "/", name), std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) Die(absl::StrCat("cannot write ", dir, "/", name));
}

v1::ModelManifest Manifest(const std::string& path) {
  v1::ModelManifest m;
  Check(FromJson(Read(path), &m, path), path);
  return m;
}

// Layer 0 only, and of a MoE layer experts 0 and 1: seeds stay small, so
// each execution is quick, with every kind of tensor still there.
v1::ModelManifest Micro(const v1::ModelManifest& m) {
  v1::ModelManifest out;
  out.set_model(absl::StrCat(m.model(), "-micro"));
  for (const v1::TensorSpec& t : m.tensors()) {
    const std::string& n = t.name();
    const bool layer = n.find("layers.") != std::string::npos;
    if (layer && n.find("layers.0.") == std::string::npos) continue;
    const size_t e = n.find("experts.");
    if (e != std::string::npos && n.compare(e, 10, "experts.0.") != 0 && n.compare(e, 10, "experts.1.") != 0) continue;
    *out.add_tensors() = t;
  }
  return out;
}

v1::PlanRequest Request(const v1::ModelManifest& m, int world, int pp, int ep, v1::Policy policy) {
  v1::PlanRequest r;
  *r.mutable_manifest() = m;
  r.mutable_topology()->set_world_size(world);
  r.mutable_topology()->set_pp(pp);
  r.mutable_topology()->set_ep(ep);
  r.mutable_policy()->set_policy(policy);
  return r;
}

v1::Plan Plan(const v1::PlanRequest& r) {
  auto plan = planner::ComputePlan(r);
  Check(plan.status(), "planning a seed request");
  Check(planner::ValidatePlan(*plan), "validating a seed plan");
  return *std::move(plan);
}

std::string Json(const google::protobuf::Message& m) {
  auto json = ToJson(m);
  Check(json.status(), "JSON");
  return *json;
}

void Manifests(const v1::ModelManifest& llama, const v1::ModelManifest& moe) {
  Write("manifest_fuzzer", "tiny-llama.json", Read("examples/manifests/tiny-llama.json"));
  Write("manifest_fuzzer", "micro-moe.json", Json(moe));
  Write("manifest_fuzzer", "micro-llama.pb", SerializeDeterministic(llama));
  Write("manifest_fuzzer", "micro-moe.pb", SerializeDeterministic(moe));
  v1::ModelManifest small;  // every field of TensorSpec set
  small.set_model("fields");
  v1::TensorSpec* t = small.add_tensors();
  t->set_name("model.layers.0.mlp.experts.1.up_proj.weight");
  t->add_shape(8);
  t->add_shape(4);
  t->set_dtype(v1::FP16);
  t->set_expert(1);
  t->set_stage(0);
  t->set_optimizer(v1::MUON);
  t->set_layout(v1::IN_OUT);
  v1::TensorSpec* b = small.add_tensors();
  b->set_name("model.norm.weight");
  b->add_shape(4);
  b->set_dtype(v1::FP32);
  b->set_optimizer(v1::ADAMW);
  Write("manifest_fuzzer", "fields.json", Json(small));
  Write("manifest_fuzzer", "fields.pb", SerializeDeterministic(small));
}

std::vector<v1::PlanRequest> PlanRequests(const v1::ModelManifest& llama, const v1::ModelManifest& moe) {
  std::vector<v1::PlanRequest> requests;
  requests.push_back(Request(llama, 4, 1, 1, v1::SEED));
  requests.push_back(Request(moe, 8, 1, 2, v1::BALANCED));
  v1::PlanRequest staged = Request(moe, 8, 2, 2, v1::SEED_ALL);
  staged.mutable_policy()->set_comm_buffer_mb(1);
  staged.mutable_policy()->set_per_dtype(true);
  staged.mutable_policy()->add_muon_exclude_patterns(".*embed_tokens.*");
  staged.mutable_policy()->add_muon_exclude_patterns("lm_head");
  staged.mutable_policy()->set_ns_steps(3);
  staged.mutable_policy()->set_grad_dtype(v1::FP32);
  requests.push_back(staged);
  Write("plan_request_fuzzer", "micro-llama-seed-4.json", Json(requests[0]));
  Write("plan_request_fuzzer", "micro-moe-balanced-8-ep2.pb", SerializeDeterministic(requests[1]));
  Write("plan_request_fuzzer", "micro-moe-pp2-ep2-options.pb", SerializeDeterministic(requests[2]));
  return requests;
}

void Plans(const std::vector<v1::PlanRequest>& requests) {
  const char* names[] = {"micro-llama-seed-4.pb", "micro-moe-balanced-8-ep2.pb", "micro-moe-pp2-ep2-options.pb"};
  for (size_t i = 0; i < requests.size(); ++i)
    Write("plan_fuzzer", names[i], SerializeDeterministic(Plan(requests[i])));
}

// HF configs, the big ones cut to a few layers and experts so that an
// execution stays fast (the families' code paths are the same).
void HfConfigs() {
  for (const char* path : {"examples/configs/tiny-llama.config.json", "examples/configs/tiny-moe.config.json"}) {
    Write("hf_config_fuzzer", std::filesystem::path(path).filename().string(), Read(path));
  }
  const std::map<std::string, int64_t> caps = {
      {"num_hidden_layers", 4},  {"n_routed_experts", 8},    {"num_experts", 8}, {"num_local_experts", 8},
      {"moe_num_experts", 8},    {"num_experts_per_tok", 2}, {"moe_k", 2},       {"first_k_dense_replace", 1},
      {"moe_layer_end_index", 3}};
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::directory_iterator("tests/importer/configs")) {
    if (entry.path().extension() == ".json") paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  for (const std::filesystem::path& path : paths) {
    // The text as written (order and spacing kept), each capped number cut.
    std::string json = Read(path.string());
    for (const auto& [key, cap] : caps) {
      const std::string quoted = absl::StrCat("\"", key, "\"");
      size_t at = json.find(quoted);
      if (at == std::string::npos) continue;
      at = json.find_first_not_of(" \t\n:", at + quoted.size());
      const size_t end = json.find_first_not_of("0123456789", at);
      int64_t value = 0;
      if (end == at || !absl::SimpleAtoi(json.substr(at, end - at), &value) || value <= cap) continue;
      json.replace(at, end - at, absl::StrCat(cap));
    }
    Check(importer::ImportHfConfig(json, importer::ImportOptions()).status(), absl::StrCat("shrunk ", path.string()));
    Write("hf_config_fuzzer", path.filename().string(), json);
  }
}

// A whole safetensors file: header + zeroed data.
std::string SafetensorsFile(const std::vector<SafetensorsEntry>& entries,
                            const std::map<std::string, std::string>& metadata) {
  std::string file = EncodeSafetensorsHeader(entries, metadata);
  const int64_t data = entries.empty() ? 0 : entries.back().end;
  file.append(static_cast<size_t>(data), '\0');
  return file;
}

void SafetensorsSeeds(const v1::ModelManifest& llama) {
  const std::vector<SafetensorsEntry> mixed = {
      {"model.embed_tokens.weight", "BF16", {16, 8}, 0, 256},
      {"model.layers.0.mlp.experts.3.up_proj.weight", "F32", {4, 8}, 256, 384},
      {"model.layers.0.mlp.experts.gate_up_proj", "F16", {2, 4, 4}, 384, 448},
      {"model.norm.weight", "F32", {8}, 448, 480},
      {"step", "I64", {}, 480, 488},
  };
  Write("safetensors_header_fuzzer", "mixed.safetensors", SafetensorsFile(mixed, {{"format", "pt"}}));
  Write("safetensors_header_fuzzer", "empty.safetensors", SafetensorsFile({}, {}));
  // A checkpoint rank file's keys (structured style), fp32 state.
  std::vector<SafetensorsEntry> rank;
  int64_t at = 0;
  for (const char* key : {"w/master/0-32", "w/momentum/0-32", "b/master/0-4", "b/moment1/0-4"}) {
    const int64_t n = std::string(key).find("-32") != std::string::npos ? 32 : 4;
    rank.push_back({key, "F32", {n}, at, at + 4 * n});
    at += 4 * n;
  }
  Write("safetensors_header_fuzzer", "checkpoint-rank.safetensors", SafetensorsFile(rank, {}));

  // model.safetensors.index.json: the tiny llama over two shards.
  std::string index = "{\n  \"metadata\": {\"total_size\": 1234},\n  \"weight_map\": {\n";
  for (int i = 0; i < llama.tensors_size(); ++i) {
    absl::StrAppend(&index, "    \"", llama.tensors(i).name(), "\": \"model-0000", i < llama.tensors_size() / 2 ? 1 : 2,
                    "-of-00002.safetensors\"", i + 1 < llama.tensors_size() ? ",\n" : "\n");
  }
  index += "  }\n}\n";
  Check(importer::ParseSafetensorsIndex(index, "seed").status(), "seed index");
  Write("safetensors_index_fuzzer", "micro-llama.index.json", index);
  Write("safetensors_index_fuzzer", "one-file.index.json",
        R"({"weight_map": {"a.weight": "model.safetensors", "b.weight": "model.safetensors"}})");
}

// An index.json that ValidateIndex accepts: two ranks, a MUON tensor in
// rank 0's file, an AdamW tensor split over both, and a MUON tensor saved
// tensor-parallel (tp 2 over its rows: shard t in rank t's file).
void CheckpointIndexSeeds() {
  v1::CheckpointIndex index;
  index.set_format_version(checkpoint::kCheckpointFormatVersion);
  index.set_step(100);
  index.set_plan_hash("sha256:00");
  index.set_model("seed");
  index.mutable_topology()->set_world_size(2);
  index.mutable_topology()->set_pp(1);
  index.mutable_topology()->set_ep(1);
  index.set_checksum_chunk_bytes(64);
  index.set_key_style("structured");
  std::vector<int64_t> file_end = {64, 64};  // data starts after a 64-byte header
  auto add_piece = [&](v1::TensorStatePieces* state, const v1::CheckpointTensor& t, int file, int64_t begin,
                       int64_t end) {
    auto kind = checkpoint::FromProto(state->kind());
    Check(kind.status(), "kind");
    v1::StatePiece* p = state->add_pieces();
    p->set_file(file);
    if (t.tp() > 1) p->set_tp_rank(file);
    p->set_key(checkpoint::PieceKey(checkpoint::KeyStyle::kStructured, t.name(), t.dtype(), *kind, begin, end,
                                    t.tp() > 1 ? file : -1));
    p->set_begin(begin);
    p->set_end(end);
    p->set_data_offset(file_end[file]);
    file_end[file] += (end - begin) * 4;
    for (int64_t c = 0; c < checkpoint::ChunkCount((end - begin) * 4, 64); ++c) p->add_chunk_crc32(0x1234u + c);
  };
  v1::CheckpointTensor* w = index.add_tensors();
  w->set_name("model.layers.0.mlp.up_proj.weight");
  w->add_shape(8);
  w->add_shape(4);
  w->set_dtype(v1::BF16);
  w->set_optimizer(v1::MUON);
  w->set_numel(32);
  for (v1::StateKind k : {v1::MASTER, v1::MOMENTUM}) {
    v1::TensorStatePieces* s = w->add_states();
    s->set_kind(k);
    add_piece(s, *w, 0, 0, 32);
  }
  v1::CheckpointTensor* b = index.add_tensors();
  b->set_name("model.norm.weight");
  b->add_shape(24);
  b->set_dtype(v1::FP32);
  b->set_optimizer(v1::ADAMW);
  b->set_numel(24);
  for (v1::StateKind k : {v1::MASTER, v1::MOMENT1, v1::MOMENT2}) {
    v1::TensorStatePieces* s = b->add_states();
    s->set_kind(k);
    add_piece(s, *b, 0, 0, 10);
    add_piece(s, *b, 1, 10, 24);
  }
  v1::CheckpointTensor* q = index.add_tensors();
  q->set_name("model.layers.0.self_attn.q_proj.weight");
  q->add_shape(4);
  q->add_shape(6);
  q->set_dtype(v1::BF16);
  q->set_optimizer(v1::MUON);
  q->set_numel(24);
  q->set_tp(2);
  q->set_tp_dim(0);
  for (v1::StateKind k : {v1::MASTER, v1::MOMENTUM}) {
    v1::TensorStatePieces* s = q->add_states();
    s->set_kind(k);
    add_piece(s, *q, 0, 0, 12);
    add_piece(s, *q, 1, 0, 12);
  }
  for (int r = 0; r < 2; ++r) {
    v1::CheckpointFile* f = index.add_files();
    f->set_name(checkpoint::RankFileName(r, 2));
    f->set_rank(r);
    f->set_size_bytes(file_end[r]);
    f->set_crc32(0xabcdu + r);
  }
  index.mutable_scalars()->set_beta1_pow(0.9f);
  index.mutable_optimizer()->set_lr(0.02);
  Check(checkpoint::ValidateIndex(index), "seed index");
  Write("checkpoint_index_fuzzer", "two-ranks.index.json", Json(index));
  index.set_key_style("paddle");
  Write("checkpoint_index_fuzzer", "two-ranks-paddle.index.json", Json(index));
}

// Scripts for coordinator_requests_fuzzer: op byte, 2-byte length, message.
class Script {
 public:
  Script& Op(uint8_t op) {
    bytes_.push_back(static_cast<char>(op));
    return *this;
  }
  Script& Op(uint8_t op, uint8_t arg) {
    Op(op);
    bytes_.push_back(static_cast<char>(arg));
    return *this;
  }
  Script& Op(uint8_t op, const google::protobuf::Message& m) {
    const std::string body = SerializeDeterministic(m);
    if (body.size() > 0xffff) Die("seed request over 64 KiB");
    Op(op);
    bytes_.push_back(static_cast<char>(body.size() & 0xff));
    bytes_.push_back(static_cast<char>(body.size() >> 8));
    bytes_ += body;
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// The op numbers of coordinator_requests_fuzzer.cc.
enum : uint8_t {
  kSubmitPlan,
  kGetPlan,
  kListPlans,
  kDiffPlans,
  kJoinJob,
  kHeartbeat,
  kLeaveJob,
  kReportError,
  kListWorkers,
  kSetKey,
  kGetKey,
  kWaitKeys,
  kCancelWait,
  kWatch,
  kNext,
  kDropWatcher,
  kAdvanceClock,
  kShutdown,
};

void CoordinatorSeeds(const v1::ModelManifest& llama) {
  v1::SubmitPlanRequest submit;
  *submit.mutable_request() = Request(llama, 2, 1, 1, v1::SEED);
  auto join = [](int rank, int64_t version, int min_workers) {
    v1::JoinJobRequest j;
    j.set_job("train");
    j.set_host(absl::StrCat("host-", rank));
    j.set_device("cpu");
    j.set_incarnation(1000 + rank);
    j.set_rank(rank);
    j.set_plan_version(version);
    j.set_min_workers(min_workers);
    return j;
  };
  v1::HeartbeatRequest hb;
  hb.set_job("train");
  hb.set_rank(0);
  hb.set_generation(1);
  hb.set_incarnation(1000);
  v1::SetKeyRequest set;
  set.set_job("train");
  set.set_generation(1);
  set.set_key("gloo/0");
  set.set_value("address-of-rank-0");
  v1::WaitKeysRequest wait;
  wait.set_job("train");
  wait.set_generation(1);
  wait.add_keys("gloo/0");
  wait.add_keys("gloo/1");
  wait.set_timeout_ms(5000);
  v1::GetKeyRequest get;
  get.set_job("train");
  get.set_generation(1);
  get.set_key("gloo/0");
  v1::WatchRequest watch;
  watch.set_from_version(0);
  watch.set_job("train");
  v1::ReportErrorRequest report;
  report.set_job("train");
  report.set_rank(1);
  report.set_incarnation(1001);
  report.set_generation(1);
  report.set_message("step 3 failed");
  v1::LeaveJobRequest leave;
  leave.set_job("train");
  leave.set_rank(0);
  leave.set_incarnation(1000);
  v1::GetPlanRequest view;
  view.set_version(1);
  view.set_rank(1);
  view.set_with_request(true);

  Script training;
  training.Op(kSubmitPlan, submit).Op(kWatch, watch).Op(kJoinJob, join(0, 1, 0)).Op(kJoinJob, join(1, 1, 0));
  training.Op(kHeartbeat, hb).Op(kWaitKeys, wait).Op(kSetKey, set).Op(kGetKey, get).Op(kNext, 0);
  training.Op(kGetPlan, view).Op(kReportError, report).Op(kAdvanceClock, 11).Op(kListWorkers, v1::ListWorkersRequest());
  training.Op(kLeaveJob, leave).Op(kNext, 0).Op(kCancelWait, 0).Op(kDropWatcher, 0);
  Write("coordinator_requests_fuzzer", "training.bin", training.bytes());

  // Elastic: four ranks, min 2; one stops heartbeating and the job shrinks.
  v1::SubmitPlanRequest submit4;
  *submit4.mutable_request() = Request(llama, 4, 1, 1, v1::BALANCED);
  v1::DiffPlansRequest diff;
  diff.set_from_version(1);
  diff.set_to_version(0);
  diff.set_limit(4);
  v1::ListPlansRequest list;
  list.set_after_version(0);
  list.set_page_size(1);
  Script elastic;
  elastic.Op(kSubmitPlan, submit4).Op(kWatch, watch);
  for (int r = 0; r < 4; ++r) elastic.Op(kJoinJob, join(r, 1, 2));
  elastic.Op(kAdvanceClock, 6);
  for (int r = 0; r < 3; ++r) {
    v1::HeartbeatRequest h = hb;
    h.set_rank(r);
    h.set_incarnation(1000 + r);
    elastic.Op(kHeartbeat, h);
  }
  elastic.Op(kAdvanceClock, 6).Op(kNext, 0).Op(kDiffPlans, diff).Op(kListPlans, list).Op(kGetPlan, view);
  Write("coordinator_requests_fuzzer", "elastic.bin", elastic.bytes());

  // Requests over the limits and after shutdown.
  v1::SubmitPlanRequest too_big;
  *too_big.mutable_request() = Request(llama, 1000, 1, 1, v1::SEED);
  v1::SetKeyRequest long_key = set;
  long_key.set_key(std::string(100, 'k'));
  Script limits;
  limits.Op(kSubmitPlan, too_big).Op(kJoinJob, join(0, 7, 0)).Op(kSetKey, long_key).Op(kSubmitPlan, submit);
  limits.Op(kShutdown).Op(kJoinJob, join(0, 1, 0)).Op(kWatch, watch).Op(kGetPlan, view);
  Write("coordinator_requests_fuzzer", "limits-and-shutdown.bin", limits.bytes());
}

void CliFlagSeeds() {
  auto args = [](std::vector<std::string> a) { return absl::StrJoin(a, std::string(1, '\0')); };
  Write("cli_flags_fuzzer", "plan.args",
        args({"--manifest", "m.json", "--world-size", "8", "--policy", "balanced", "--output", "json"}));
  Write("cli_flags_fuzzer", "equals-and-lists.args",
        args({"--world_size=4", "--pp=2", "--ep", "2", "--per-dtype", "--exclude", ".*norm.*", "--exclude=lm_head",
              "--comm-buffer-mb=64", "--ns-steps=3", "--manifest=m.json", "positional"}));
  Write("cli_flags_fuzzer", "kinds.args",
        args({"--timeout=1.5e0", "--dry-run=false", "--version", "-3", "--rank=2", "--coordinator", "127.0.0.1:5000",
              "--muon-exclude", "x", "--", "--rank", "after-dashes"}));
  Write("cli_flags_fuzzer", "help.args", args({"--help"}));
  Write("cli_flags_fuzzer", "bad.args", args({"--world-size", "many", "--bogus"}));
}

}  // namespace
}  // namespace muonshard::fuzz

int main(int argc, char** argv) {
  using namespace muonshard::fuzz;  // NOLINT: main
  if (argc != 2) Die("usage: muonshard-fuzz-seeds OUT_DIR   (from the repository root)");
  out_dir = argv[1];
  const auto llama = Micro(Manifest("examples/manifests/tiny-llama.json"));
  const auto moe = Micro(Manifest("examples/manifests/tiny-moe.json"));
  Manifests(llama, moe);
  Plans(PlanRequests(llama, moe));
  HfConfigs();
  SafetensorsSeeds(llama);
  CheckpointIndexSeeds();
  CoordinatorSeeds(llama);
  CliFlagSeeds();
  std::fprintf(stderr, "make_seeds: wrote %s\n", out_dir.c_str());
  return 0;
}
