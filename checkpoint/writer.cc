#include "checkpoint/writer.h"

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "absl/base/casts.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/internal/checksums.h"
#include "checkpoint/safetensors.h"
#include "common/env.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "plan/model.h"
#include "plan/planner.h"

namespace muonshard::checkpoint {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so must the host be");

constexpr char kFormatTag[] = "muonshard.checkpoint.v1";

std::string Join(const std::string& dir, absl::string_view name) { return absl::StrCat(dir, "/", name); }

// A key of the file being written: a state piece (shard != nullptr) or one of
// Paddle's beta-power scalars.
struct Entry {
  const StateShard* shard = nullptr;
  std::string key;
  const float* data = nullptr;
  int64_t bytes = 0;
  int64_t offset = 0;  // relative to the data section
};

absl::Status CheckTarget(const RankFileTarget& target, const Scalars& scalars, const WriteOptions& options) {
  if (target.dir.empty()) return absl::InvalidArgumentError("checkpoint directory is empty");
  if (target.step < 0) return absl::InvalidArgumentError(absl::StrCat("step ", target.step, " is negative"));
  if (scalars.step != target.step) {
    return absl::InvalidArgumentError(
        absl::StrCat("scalars are of step ", scalars.step, ", the save of step ", target.step));
  }
  if (target.world_size <= 0 || target.rank < 0 || target.rank >= target.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", target.rank, " of world ", target.world_size));
  }
  if (target.plan_hash.empty()) return absl::InvalidArgumentError("plan hash is empty");
  if (options.checksum_chunk_bytes <= 0 || options.checksum_chunk_bytes % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checksum chunk of ", options.checksum_chunk_bytes, " bytes is not a positive multiple of 4"));
  }
  return absl::OkStatus();
}

// Keys and data offsets, state pieces first (in the caller's order), then
// Paddle's beta powers. INVALID_ARGUMENT on a bad shard or a repeated key.
absl::StatusOr<std::vector<Entry>> LayOut(absl::Span<const StateShard> shards, KeyStyle style, const float* beta_pows) {
  std::vector<Entry> entries;
  absl::flat_hash_set<std::string> keys;
  std::vector<const ShardSpec*> adamw;
  for (const StateShard& s : shards) {
    const ShardSpec& spec = s.spec;
    if (spec.tp_copy > 0) continue;  // tp rank 0 saves a replicated tensor
    if (spec.name.empty() || spec.begin < 0 || spec.numel() <= 0 ||
        static_cast<int64_t>(s.data.size()) != spec.numel()) {
      return absl::InvalidArgumentError(absl::StrCat("shard \"", spec.name, "\" ", StateKindName(spec.kind), " [",
                                                     spec.begin, ", ", spec.end, ") holds ", s.data.size(),
                                                     " elements"));
    }
    Entry e{&s,
            PieceKey(style, spec.name, spec.dtype, spec.kind, spec.begin, spec.end, spec.tp > 1 ? spec.tp_rank : -1),
            s.data.data(), spec.numel() * 4};
    if (!keys.insert(e.key).second) {
      return absl::InvalidArgumentError(absl::StrCat("two shards have the key \"", e.key, "\""));
    }
    if (spec.kind == StateKind::kMoment1) adamw.push_back(&spec);
    entries.push_back(std::move(e));
  }
  if (style == KeyStyle::kPaddle) {
    for (const ShardSpec* spec : adamw) {
      for (int which : {1, 2}) {
        entries.push_back({nullptr, PaddleBetaPowKey(spec->name, spec->dtype, which), &beta_pows[which - 1], 4});
      }
    }
  }
  int64_t at = 0;
  for (Entry& e : entries) {
    e.offset = at;
    at += e.bytes;
  }
  return entries;
}

std::string EncodeHeader(const std::vector<Entry>& entries, const RankFileTarget& target) {
  std::vector<SafetensorsEntry> st;
  st.reserve(entries.size());
  for (const Entry& e : entries) st.push_back({e.key, "F32", {e.bytes / 4}, e.offset, e.offset + e.bytes});
  return EncodeSafetensorsHeader(st, {{"format", kFormatTag},
                                      {"plan_hash", target.plan_hash},
                                      {"rank", absl::StrCat(target.rank)},
                                      {"world_size", absl::StrCat(target.world_size)},
                                      {"step", absl::StrCat(target.step)}});
}

// Writes the file, filling `record` with its size, crc32 and every piece.
absl::Status WriteData(const std::string& path, const std::string& header, const std::vector<Entry>& entries,
                       const RankFileTarget& target, const WriteOptions& options, v1::CheckpointRankRecord* record) {
  MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, options.env->NewWritableFile(path));
  MUONSHARD_RETURN_IF_ERROR(file->Append(header));
  uint32_t crc = internal::Crc32(0, header.data(), static_cast<int64_t>(header.size()));
  int64_t written = static_cast<int64_t>(header.size());
  const int64_t file_bytes = written + (entries.empty() ? 0 : entries.back().offset + entries.back().bytes);
  const int64_t chunk = options.checksum_chunk_bytes;
  const int total = static_cast<int>(
      std::count_if(entries.begin(), entries.end(), [](const Entry& e) { return e.shard != nullptr; }));
  int pieces = 0;
  for (const Entry& e : entries) {
    v1::StatePiece* piece = nullptr;
    if (e.shard != nullptr) {
      v1::CheckpointRankRecord::Piece* p = record->add_pieces();
      p->set_tensor(e.shard->spec.name);
      p->set_kind(ToProto(e.shard->spec.kind));
      piece = p->mutable_piece();
      piece->set_key(e.key);
      piece->set_begin(e.shard->spec.begin);
      piece->set_end(e.shard->spec.end);
      if (e.shard->spec.tp > 1) piece->set_tp_rank(e.shard->spec.tp_rank);
      piece->set_data_offset(written);
    }
    const char* bytes = reinterpret_cast<const char*>(e.data);
    for (int64_t off = 0; off < e.bytes; off += chunk) {
      const int64_t n = std::min(chunk, e.bytes - off);
      const uint32_t c = internal::Crc32(0, bytes + off, n);
      if (piece != nullptr) piece->add_chunk_crc32(c);
      crc = internal::Crc32Combine(crc, c, n);
      MUONSHARD_RETURN_IF_ERROR(file->Append(absl::string_view(bytes + off, static_cast<size_t>(n))));
    }
    written += e.bytes;
    if (e.shard != nullptr && options.on_piece_written) {
      options.on_piece_written({target.rank, ++pieces, total, written, file_bytes});
    }
  }
  MUONSHARD_RETURN_IF_ERROR(file->Sync());
  MUONSHARD_RETURN_IF_ERROR(file->Close());
  v1::CheckpointFile* f = record->mutable_file();
  f->set_rank(target.rank);
  f->set_size_bytes(written);
  f->set_crc32(crc);
  return absl::OkStatus();
}

// ---- Commit ----

bool SameBits(float a, float b) { return absl::bit_cast<uint32_t>(a) == absl::bit_cast<uint32_t>(b); }

absl::StatusOr<std::vector<v1::CheckpointRankRecord>> ReadRecords(const std::string& tmp, const v1::Plan& plan,
                                                                  int64_t step, const CommitOptions& options) {
  const int world = plan.ranks_size();
  std::vector<v1::CheckpointRankRecord> records(world);
  for (int r = 0; r < world; ++r) {
    const std::string path = Join(tmp, RankRecordName(r, world));
    auto json = options.env->ReadFileToString(path);
    if (!json.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", r, " has not written its checkpoint file: ", json.status().message()));
    }
    absl::Status parsed = FromJson(*json, &records[r], path);
    if (!parsed.ok()) return absl::DataLossError(parsed.message());
    const v1::CheckpointRankRecord& rec = records[r];
    if (rec.step() != step || rec.plan_hash() != plan.content_hash() || rec.rank() != r || rec.world_size() != world) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": written for step ", rec.step(), ", plan ", rec.plan_hash(), ", rank ", rec.rank(), " of ",
          rec.world_size(), "; the commit is for step ", step, ", plan ", plan.content_hash(), ", world ", world));
    }
    if (rec.save_id() != options.save_id) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": left by save attempt \"", rec.save_id(), "\", this one is \"", options.save_id, "\""));
    }
    const v1::CheckpointRankRecord& first = records[0];
    if (rec.key_style() != first.key_style() || rec.checksum_chunk_bytes() != first.checksum_chunk_bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": key style or checksum chunk differs from rank 0's"));
    }
    // Bitwise: every AdamW parameter steps together, so every rank holds the
    // very same beta powers; any difference is a bug upstream.
    if (!SameBits(rec.scalars().beta1_pow(), first.scalars().beta1_pow()) ||
        !SameBits(rec.scalars().beta2_pow(), first.scalars().beta2_pow())) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", r, " saved beta powers (", rec.scalars().beta1_pow(), ", ", rec.scalars().beta2_pow(),
                       "), rank 0 (", first.scalars().beta1_pow(), ", ", first.scalars().beta2_pow(), ")"));
    }
  }
  return records;
}

absl::Status CheckFileSizes(Env* env, const std::string& tmp, const std::vector<v1::CheckpointRankRecord>& records) {
  for (const v1::CheckpointRankRecord& rec : records) {
    const std::string path = Join(tmp, rec.file().name());
    MUONSHARD_ASSIGN_OR_RETURN(int64_t size, env->GetFileSize(path));
    if (size != rec.file().size_bytes()) {
      return absl::DataLossError(
          absl::StrCat(path, ": ", size, " bytes on disk, ", rec.file().size_bytes(), " written"));
    }
  }
  return absl::OkStatus();
}

v1::CheckpointTensor TensorEntry(const v1::PlannedTensor& t, int tp) {
  v1::CheckpointTensor out;
  out.set_name(t.name());
  *out.mutable_shape() = t.shape();
  out.set_dtype(t.dtype());
  out.set_optimizer(t.optimizer());
  out.set_numel(t.numel());
  if (tp > 1 && planner::IsTpSplit(t)) {
    out.set_tp(tp);
    out.set_tp_dim(planner::TpSplitDim(t.shape_size(), t.layout(), t.tp_split()));
  }
  for (StateKind kind : KindsOf(t.optimizer())) out.add_states()->set_kind(ToProto(kind));
  return out;
}

// Sorts each state's pieces and checks they tile [0, numel) exactly (TP:
// every shard's [0, numel / tp), in tp rank order).
absl::Status SortAndCheckCoverage(v1::CheckpointTensor* t) {
  const int tp = std::max(1, t->tp());
  const int64_t shard_numel = t->numel() / tp;
  for (v1::TensorStatePieces& state : *t->mutable_states()) {
    auto* pieces = state.mutable_pieces();
    std::sort(pieces->begin(), pieces->end(), [](const v1::StatePiece& a, const v1::StatePiece& b) {
      return std::make_pair(a.tp_rank(), a.begin()) < std::make_pair(b.tp_rank(), b.begin());
    });
    const std::string what = absl::StrCat("tensor \"", t->name(), "\" ", v1::StateKind_Name(state.kind()));
    int shard = 0;
    int64_t at = 0;
    auto missing = [&](int64_t end) {
      return absl::FailedPreconditionError(absl::StrCat(what, tp > 1 ? absl::StrCat(" tp rank ", shard) : "",
                                                        ": elements [", at, ", ", end, ") were saved by no rank"));
    };
    for (const v1::StatePiece& p : *pieces) {
      for (; shard < p.tp_rank(); ++shard, at = 0) {
        if (at != shard_numel) return missing(shard_numel);
      }
      if (p.begin() != at) {
        if (p.begin() > at) return missing(p.begin());
        return absl::FailedPreconditionError(
            absl::StrCat(what, ": elements [", p.begin(), ", ", at, ") were saved twice"));
      }
      at = p.end();
    }
    for (; shard < tp - 1; ++shard, at = 0) {
      if (at != shard_numel) return missing(shard_numel);
    }
    if (at != shard_numel) return missing(shard_numel);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CheckpointIndex> BuildIndex(const v1::Plan& plan, int64_t step,
                                               const std::vector<v1::CheckpointRankRecord>& records,
                                               const CommitOptions& options) {
  v1::CheckpointIndex index;
  index.set_format_version(kCheckpointFormatVersion);
  index.set_step(step);
  index.set_plan_hash(plan.content_hash());
  index.set_plan_version(options.plan_version);
  index.set_model(plan.model());
  *index.mutable_topology() = plan.topology();
  *index.mutable_policy() = plan.policy();
  *index.mutable_optimizer() = options.optimizer;
  *index.mutable_scalars() = records[0].scalars();
  index.set_checksum_chunk_bytes(records[0].checksum_chunk_bytes());
  index.set_key_style(records[0].key_style());
  absl::flat_hash_map<absl::string_view, int> by_name;
  for (int i = 0; i < plan.tensors_size(); ++i) {
    MUONSHARD_RETURN_IF_ERROR(CheckFormatHolds(plan.tensors(i)));
    *index.add_tensors() = TensorEntry(plan.tensors(i), plan.topology().tp());
    by_name[plan.tensors(i).name()] = i;
  }
  for (int r = 0; r < static_cast<int>(records.size()); ++r) {
    *index.add_files() = records[r].file();
    for (const v1::CheckpointRankRecord::Piece& p : records[r].pieces()) {
      auto it = by_name.find(p.tensor());
      v1::CheckpointTensor* t = it == by_name.end() ? nullptr : index.mutable_tensors(it->second);
      v1::TensorStatePieces* state = nullptr;
      for (int s = 0; t != nullptr && s < t->states_size(); ++s) {
        if (t->states(s).kind() == p.kind()) state = t->mutable_states(s);
      }
      if (state == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat("rank ", r, " saved \"", p.tensor(), "\" ",
                                                          v1::StateKind_Name(p.kind()), ", which the plan has not"));
      }
      v1::StatePiece* piece = state->add_pieces();
      *piece = p.piece();
      piece->set_file(r);
    }
  }
  for (v1::CheckpointTensor& t : *index.mutable_tensors()) MUONSHARD_RETURN_IF_ERROR(SortAndCheckCoverage(&t));
  MUONSHARD_RETURN_IF_ERROR(ValidateIndex(index));
  return index;
}

// Removes everything in the temporary step directory that the index does not
// name: rank records, and files of an earlier attempt at this step.
absl::Status RemoveStrays(Env* env, const std::string& tmp, const v1::CheckpointIndex& index) {
  absl::flat_hash_set<std::string> keep = {kPlanFileName, kRequestFileName};
  for (const v1::CheckpointFile& f : index.files()) keep.insert(f.name());
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<std::string> names, env->GetChildren(tmp));
  for (const std::string& name : names) {
    if (!keep.contains(name)) MUONSHARD_RETURN_IF_ERROR(env->RemoveTree(Join(tmp, name)));
  }
  return absl::OkStatus();
}

// The name `latest` holds, or "" when there is none. Any other error is
// returned: taking an unreadable `latest` for none would let ClearTarget
// move the step it names aside.
absl::StatusOr<std::string> LatestName(Env* env, const std::string& dir) {
  absl::StatusOr<std::string> content = env->ReadFileToString(Join(dir, kLatestFileName));
  if (absl::IsNotFound(content.status())) return "";
  if (!content.ok()) return content.status();
  std::string name = *std::move(content);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return name;
}

// A complete step-N left by a commit that crashed before moving `latest` is
// moved aside (and removed by the cleanup); the one `latest` names never is.
absl::Status ClearTarget(Env* env, const std::string& dir, int64_t step) {
  const std::string final_dir = Join(dir, StepDirName(step));
  MUONSHARD_ASSIGN_OR_RETURN(bool exists, env->FileExists(final_dir));
  if (!exists) return absl::OkStatus();
  MUONSHARD_ASSIGN_OR_RETURN(const std::string latest, LatestName(env, dir));
  if (latest == StepDirName(step)) {
    return absl::AlreadyExistsError(absl::StrCat(final_dir, " exists and is the latest checkpoint"));
  }
  const std::string aside = Join(dir, absl::StrCat(StepDirName(step), ".replaced.tmp"));
  MUONSHARD_RETURN_IF_ERROR(env->RemoveTree(aside));
  return env->RenameFile(final_dir, aside);
}

// What earlier saves left in `dir` besides `in_progress` (a step-N.tmp that
// ranks may be writing into): step-*.tmp of saves that died or failed,
// step-N.replaced.tmp moved aside by ClearTarget, temporaries of `latest`.
// Best effort: leftovers are never loaded, only take space; what cannot be
// removed now is retried by the next save.
void RemoveLeftovers(Env* env, const std::string& dir, absl::string_view in_progress) {
  auto names = env->GetChildren(dir);
  if (!names.ok()) return;
  for (const std::string& name : *names) {
    const bool step_tmp = absl::StartsWith(name, "step-") && absl::EndsWith(name, ".tmp");
    if ((step_tmp && name != in_progress) || absl::StartsWith(name, absl::StrCat(kLatestFileName, ".tmp."))) {
      env->RemoveTree(Join(dir, name)).IgnoreError();
    }
  }
}

// After a commit: leftovers, and the steps beyond keep_last (never `step`).
void CleanUp(Env* env, const std::string& dir, int64_t step, int keep_last) {
  RemoveLeftovers(env, dir, /*in_progress=*/"");
  if (keep_last <= 0) return;
  auto names = env->GetChildren(dir);
  if (!names.ok()) return;
  std::vector<int64_t> steps;
  for (const std::string& name : *names) {
    if (auto s = ParseStepDirName(name)) steps.push_back(*s);
  }
  std::sort(steps.begin(), steps.end());
  const int excess = static_cast<int>(steps.size()) - keep_last;
  for (int i = 0; i < excess; ++i) {
    if (steps[i] != step) env->RemoveTree(Join(dir, StepDirName(steps[i]))).IgnoreError();
  }
}

// NOTE [Metadata checksums]
// The rank files are covered by the index (a crc32 per chunk and per file),
// but nothing covered the index itself: an edited optimizer scalar, or a
// digit of an offset or crc that still parsed and validated, was loaded as
// is. checksums.sha256 holds the SHA-256 of the exact bytes of index.json,
// plan.pb and request.pb, computed from the bytes handed to the writes (not
// read back), so that anything changing them later is caught. Placement:
//  - inside step-N.tmp, written (fsynced, directory too) after the files it
//    covers and before the rename: the rename is the commit, so every
//    committed step has its sums, and a step without them is damaged (or of
//    a build before the sums), never "committed but unchecked" — the reader
//    refuses it rather than trust an index it cannot check;
//  - not in `latest`: that names one step, while older steps are loaded by
//    number (`--step N`, keep_last), a step renamed just before a crash is
//    valid with `latest` still naming the previous one, and without `latest`
//    the newest step is found by scanning; each step carries its own;
//  - not a field of index.json: a digest inside the bytes it digests needs a
//    canonical form minus that field; a separate file checks the bytes as
//    they are, and plain `sha256sum -c` can check it too.
// The reader reads each file once, checks those bytes, then parses the same
// bytes: nothing unchecked is ever interpreted.
absl::Status WriteMetadataFiles(Env* env, const std::string& tmp, const v1::CheckpointIndex& index,
                                const v1::Plan& plan, const v1::PlanRequest& canonical) {
  const std::string plan_bytes = SerializeDeterministic(plan);
  const std::string request_bytes = SerializeDeterministic(canonical);
  MUONSHARD_ASSIGN_OR_RETURN(const std::string index_json, ToJson(index, /*pretty=*/false));
  MUONSHARD_RETURN_IF_ERROR(WriteFileAtomic(env, Join(tmp, kPlanFileName), plan_bytes));
  MUONSHARD_RETURN_IF_ERROR(WriteFileAtomic(env, Join(tmp, kRequestFileName), request_bytes));
  // Before the index and its sums: they may not be taken for strays.
  MUONSHARD_RETURN_IF_ERROR(RemoveStrays(env, tmp, index));
  // WriteFileAtomic fsyncs each file and the directory, so everything the
  // index describes is durable before the step can be renamed.
  MUONSHARD_RETURN_IF_ERROR(WriteFileAtomic(env, Join(tmp, kIndexFileName), index_json));
  const internal::NamedBytes covered[] = {
      {kIndexFileName, index_json}, {kPlanFileName, plan_bytes}, {kRequestFileName, request_bytes}};
  return WriteFileAtomic(env, Join(tmp, kChecksumsFileName), internal::EncodeChecksums(covered));
}

void Stage(const CommitOptions& options, absl::string_view stage) {
  if (options.on_stage) options.on_stage(stage);
}

v1::CheckpointRankRecord NewRecord(const RankFileTarget& target, const Scalars& scalars, const WriteOptions& options) {
  v1::CheckpointRankRecord record;
  record.set_step(target.step);
  record.set_plan_hash(target.plan_hash);
  record.set_rank(target.rank);
  record.set_world_size(target.world_size);
  record.set_checksum_chunk_bytes(options.checksum_chunk_bytes);
  record.set_key_style(std::string(KeyStyleName(options.key_style)));
  record.set_save_id(target.save_id);
  record.mutable_scalars()->set_beta1_pow(scalars.beta1_pow);
  record.mutable_scalars()->set_beta2_pow(scalars.beta2_pow);
  record.mutable_file()->set_name(RankFileName(target.rank, target.world_size));
  return record;
}

// The rank's file, then its record beside it.
absl::Status WriteRankFiles(const std::string& tmp, const std::vector<Entry>& entries, const RankFileTarget& target,
                            const WriteOptions& options, v1::CheckpointRankRecord* record) {
  const std::string path = Join(tmp, record->file().name());
  MUONSHARD_RETURN_IF_ERROR(WriteData(path, EncodeHeader(entries, target), entries, target, options, record));
  MUONSHARD_ASSIGN_OR_RETURN(std::string json, ToJson(*record, /*pretty=*/false));
  return WriteFileAtomic(options.env, Join(tmp, RankRecordName(target.rank, target.world_size)), json);
}

// NOTE [Failed saves]
// A failed save must not keep its files: on a nearly full disk a leftover
// step-N.tmp makes the next save fail too. Who removes what follows from who
// may still be writing:
//  - a rank whose WriteRankFile fails removes its own file and record (an
//    earlier attempt's too: same names), never the directory: the other
//    ranks of the save may be writing into it, and learn of the failure only
//    at the barrier;
//  - the committer, past the barrier (no rank writes any more), removes the
//    whole step-N.tmp when the commit fails before the rename: a save it
//    refused or found incomplete can never be committed. So does a process
//    that writes every rank (SaveCheckpoint, ReshardCheckpoint) when one of
//    its writes fails; a job's rank 0 whose barrier failed may call
//    AbandonSave;
//  - rank 0, at the start of every save and before it writes a byte (so the
//    space is back for this save), removes what earlier runs left: other
//    steps' step-*.tmp (a save killed mid-way, or whose rank 0 never reached
//    the commit), steps moved aside, temporaries of `latest`. Not its own
//    step-N.tmp: other ranks may already be writing there; what an earlier
//    attempt at the same step left in it is overwritten, refused by save_id
//    or removed as a stray by the commit.
// None of them touches a committed step-N or `latest`.
void RemoveOwnFiles(Env* env, const std::string& tmp, const RankFileTarget& target) {
  env->RemoveTree(Join(tmp, RankFileName(target.rank, target.world_size))).IgnoreError();
  env->RemoveTree(Join(tmp, RankRecordName(target.rank, target.world_size))).IgnoreError();
}

// The commit up to the rename of step-N.tmp to step-N, after which the step
// is complete.
absl::Status CompleteStep(const std::string& dir, int64_t step, const v1::Plan& plan, const v1::PlanRequest& request,
                          const CommitOptions& options) {
  MUONSHARD_ASSIGN_OR_RETURN(v1::PlanRequest canonical, planner::CanonicalizeRequest(request));
  if (planner::ContentHash(canonical) != plan.content_hash()) {
    return absl::InvalidArgumentError(absl::StrCat("the request's content hash ", planner::ContentHash(canonical),
                                                   " is not the plan's ", plan.content_hash()));
  }
  if (plan.ranks_size() == 0) return absl::InvalidArgumentError("the plan has no ranks");
  const std::string tmp = Join(dir, TempStepDirName(step));
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<v1::CheckpointRankRecord> records, ReadRecords(tmp, plan, step, options));
  MUONSHARD_RETURN_IF_ERROR(CheckFileSizes(options.env, tmp, records));
  MUONSHARD_ASSIGN_OR_RETURN(v1::CheckpointIndex index, BuildIndex(plan, step, records, options));
  MUONSHARD_RETURN_IF_ERROR(WriteMetadataFiles(options.env, tmp, index, plan, canonical));
  Stage(options, "index-written");
  MUONSHARD_RETURN_IF_ERROR(ClearTarget(options.env, dir, step));
  return options.env->RenameFile(tmp, Join(dir, StepDirName(step)));
}

}  // namespace

absl::StatusOr<v1::CheckpointRankRecord> WriteRankFile(const RankFileTarget& target,
                                                       absl::Span<const StateShard> shards, const Scalars& scalars,
                                                       const WriteOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(CheckTarget(target, scalars, options));
  const float beta_pows[2] = {scalars.beta1_pow, scalars.beta2_pow};
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<Entry> entries, LayOut(shards, options.key_style, beta_pows));
  const std::string tmp = Join(target.dir, TempStepDirName(target.step));
  // See NOTE [Failed saves] for who removes what.
  if (target.rank == 0) RemoveLeftovers(options.env, target.dir, TempStepDirName(target.step));
  // A new DIR must survive a crash once its first step is committed; the
  // commit's rename and fsync of DIR cover step-N.tmp.
  MUONSHARD_RETURN_IF_ERROR(CreateDirsDurably(options.env, target.dir));
  MUONSHARD_RETURN_IF_ERROR(options.env->CreateDirs(tmp));
  v1::CheckpointRankRecord record = NewRecord(target, scalars, options);
  absl::Status written = WriteRankFiles(tmp, entries, target, options, &record);
  if (!written.ok()) {
    RemoveOwnFiles(options.env, tmp, target);
    return written;
  }
  return record;
}

absl::Status CommitCheckpoint(const std::string& dir, int64_t step, const v1::Plan& plan,
                              const v1::PlanRequest& request, const CommitOptions& options) {
  if (absl::Status s = CompleteStep(dir, step, plan, request, options); !s.ok()) {
    AbandonSave(dir, step, options.env).IgnoreError();  // NOTE [Failed saves]
    return s;
  }
  MUONSHARD_RETURN_IF_ERROR(options.env->SyncDir(dir));
  Stage(options, "renamed");
  MUONSHARD_RETURN_IF_ERROR(WriteFileAtomic(options.env, Join(dir, kLatestFileName), StepDirName(step) + "\n"));
  Stage(options, "latest-updated");
  CleanUp(options.env, dir, step, options.keep_last);
  return absl::OkStatus();
}

absl::Status AbandonSave(const std::string& dir, int64_t step, Env* env) {
  return env->RemoveTree(Join(dir, TempStepDirName(step)));
}

absl::Status SaveCheckpoint(const std::string& dir, int64_t step, const v1::Plan& plan, const v1::PlanRequest& request,
                            absl::Span<const std::vector<StateShard>> ranks, const Scalars& scalars,
                            const WriteOptions& write_options, const CommitOptions& commit_options) {
  if (static_cast<int>(ranks.size()) != plan.ranks_size()) {
    return absl::InvalidArgumentError(absl::StrCat(ranks.size(), " ranks of state for a plan of ", plan.ranks_size()));
  }
  for (int r = 0; r < plan.ranks_size(); ++r) {
    RankFileTarget target{dir, step, plan.content_hash(), r, plan.ranks_size(), commit_options.save_id};
    if (absl::Status s = WriteRankFile(target, ranks[r], scalars, write_options).status(); !s.ok()) {
      AbandonSave(dir, step, write_options.env).IgnoreError();  // every rank is ours: NOTE [Failed saves]
      return s;
    }
  }
  return CommitCheckpoint(dir, step, plan, request, commit_options);
}

}  // namespace muonshard::checkpoint
