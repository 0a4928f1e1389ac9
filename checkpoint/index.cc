#include "checkpoint/index.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace muonshard::checkpoint {
namespace {

constexpr absl::string_view kStepPrefix = "step-";

std::string RankStem(int rank, int world_size) { return absl::StrFormat("rank-%05d-of-%05d", rank, world_size); }

// Paddle names accumulators after the fp32 master weight of a low-precision
// parameter and after the parameter itself when it is fp32 already.
std::string PaddleAccumulatorStem(absl::string_view tensor, v1::DType dtype) {
  return dtype == v1::FP32 ? std::string(tensor) : absl::StrCat(tensor, "_fp32_master_0");
}

absl::Status Damaged(absl::string_view what) { return absl::DataLossError(absl::StrCat("checkpoint index: ", what)); }

absl::Status ValidateFiles(const v1::CheckpointIndex& index) {
  for (int i = 0; i < index.files_size(); ++i) {
    const v1::CheckpointFile& f = index.files(i);
    if (f.rank() != i) return Damaged(absl::StrCat("file ", i, " (\"", f.name(), "\") has rank ", f.rank()));
    if (f.name().empty() || absl::StrContains(f.name(), "/") || f.size_bytes() < 8) {
      return Damaged(absl::StrCat("file ", i, ": bad name \"", f.name(), "\" or size ", f.size_bytes()));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidatePieces(const v1::CheckpointIndex& index, const v1::CheckpointTensor& t,
                            const v1::TensorStatePieces& state) {
  const std::string what = absl::StrCat("tensor \"", t.name(), "\" ", v1::StateKind_Name(state.kind()));
  // Tensor-parallel: every shard's [0, numel / tp), shard after shard.
  const int tp = std::max(1, t.tp());
  const int64_t shard_numel = t.numel() / tp;
  int shard = 0;
  int64_t at = 0;
  for (const v1::StatePiece& p : state.pieces()) {
    if (at == shard_numel && shard + 1 < tp) {
      ++shard;
      at = 0;
    }
    if (p.tp_rank() != (tp > 1 ? shard : 0) || p.begin() != at || p.end() <= p.begin() || p.end() > shard_numel) {
      return Damaged(absl::StrCat(what, ": piece [", p.begin(), ", ", p.end(), ") of tp rank ", p.tp_rank(),
                                  " does not continue the tiling of [0, ", shard_numel, ") at ", at, " of tp rank ",
                                  shard));
    }
    if (p.file() < 0 || p.file() >= index.files_size()) {
      return Damaged(absl::StrCat(what, ": piece [", p.begin(), ", ", p.end(), ") names file ", p.file()));
    }
    const int64_t file_size = index.files(p.file()).size_bytes();
    if (p.data_offset() < 8 || p.data_offset() > file_size - PieceBytes(p)) {
      return Damaged(absl::StrCat(what, ": piece \"", p.key(), "\" lies outside ", index.files(p.file()).name()));
    }
    if (p.chunk_crc32_size() != ChunkCount(PieceBytes(p), index.checksum_chunk_bytes())) {
      return Damaged(absl::StrCat(what, ": piece \"", p.key(), "\" has ", p.chunk_crc32_size(), " checksums"));
    }
    at = p.end();
  }
  if (shard != tp - 1 || at != shard_numel) {
    return Damaged(absl::StrCat(what, ": elements [", at, ", ", shard_numel, ") of tp rank ", shard, " (of ", tp,
                                ") are in no piece"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTensor(const v1::CheckpointIndex& index, const v1::CheckpointTensor& t) {
  int64_t numel = 1;
  for (int64_t d : t.shape()) numel = d > 0 && numel <= (int64_t{1} << 50) / d ? numel * d : -1;
  if (t.shape_size() == 0 || numel != t.numel()) {
    return Damaged(absl::StrCat("tensor \"", t.name(), "\": shape does not match numel ", t.numel()));
  }
  if (t.optimizer() != v1::MUON && t.optimizer() != v1::ADAMW) {
    return Damaged(absl::StrCat("tensor \"", t.name(), "\": optimizer is neither MUON nor ADAMW"));
  }
  if (t.tp() < 0 ||
      (t.tp() > 1 && (t.tp_dim() < 0 || t.tp_dim() >= t.shape_size() || t.shape(t.tp_dim()) % t.tp() != 0))) {
    return Damaged(absl::StrCat("tensor \"", t.name(), "\": tp ", t.tp(), " does not split dimension ", t.tp_dim()));
  }
  const std::vector<StateKind> kinds = KindsOf(t.optimizer());
  if (t.states_size() != static_cast<int>(kinds.size())) {
    return Damaged(absl::StrCat("tensor \"", t.name(), "\": ", t.states_size(), " states for ",
                                v1::Optimizer_Name(t.optimizer())));
  }
  for (size_t k = 0; k < kinds.size(); ++k) {
    if (t.states(k).kind() != ToProto(kinds[k])) {
      return Damaged(absl::StrCat("tensor \"", t.name(), "\": state ", k, " is ",
                                  v1::StateKind_Name(t.states(k).kind()), ", expected ",
                                  v1::StateKind_Name(ToProto(kinds[k]))));
    }
    absl::Status s = ValidatePieces(index, t, t.states(k));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view KeyStyleName(KeyStyle style) { return style == KeyStyle::kPaddle ? "paddle" : "structured"; }

absl::StatusOr<KeyStyle> ParseKeyStyle(absl::string_view name) {
  if (name == "structured") return KeyStyle::kStructured;
  if (name == "paddle") return KeyStyle::kPaddle;
  return absl::InvalidArgumentError(absl::StrCat("key style \"", name, "\" is not one of structured, paddle"));
}

std::string StepDirName(int64_t step) { return absl::StrCat(kStepPrefix, step); }
std::string TempStepDirName(int64_t step) { return absl::StrCat(kStepPrefix, step, ".tmp"); }

std::optional<int64_t> ParseStepDirName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kStepPrefix) || name.empty()) return std::nullopt;
  for (char c : name) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(name, &step)) return std::nullopt;
  return step;
}

std::string RankFileName(int rank, int world_size) { return RankStem(rank, world_size) + ".safetensors"; }
std::string RankRecordName(int rank, int world_size) { return RankStem(rank, world_size) + ".json"; }

std::string PieceKey(KeyStyle style, absl::string_view tensor, v1::DType dtype, StateKind kind, int64_t begin,
                     int64_t end, int tp_rank) {
  if (style == KeyStyle::kStructured) {
    const std::string shard = tp_rank >= 0 ? absl::StrCat("tp", tp_rank, "/") : "";
    return absl::StrCat(tensor, "/", StateKindName(kind), "/", shard, begin, "-", end);
  }
  switch (kind) {
    case StateKind::kMaster:
      return absl::StrCat(tensor, "_fp32_master_0");
    case StateKind::kMomentum:
    case StateKind::kMoment1:
      return absl::StrCat(PaddleAccumulatorStem(tensor, dtype), "_moment1_0");
    case StateKind::kMoment2:
      return absl::StrCat(PaddleAccumulatorStem(tensor, dtype), "_moment2_0");
  }
  return std::string(tensor);
}

std::string PaddleBetaPowKey(absl::string_view tensor, v1::DType dtype, int which) {
  return absl::StrCat(PaddleAccumulatorStem(tensor, dtype), "_beta", which, "_pow_acc_0");
}

int64_t ChunkCount(int64_t bytes, int64_t chunk_bytes) {
  if (chunk_bytes <= 0) return 0;
  return (bytes + chunk_bytes - 1) / chunk_bytes;
}

absl::Status ValidateIndex(const v1::CheckpointIndex& index) {
  if (index.format_version() > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint format ", index.format_version(),
                                                      " is newer than this build's ", kCheckpointFormatVersion));
  }
  if (index.format_version() < 1) return Damaged(absl::StrCat("format_version ", index.format_version()));
  if (index.checksum_chunk_bytes() <= 0 || index.checksum_chunk_bytes() % 4 != 0) {
    return Damaged(absl::StrCat("checksum_chunk_bytes ", index.checksum_chunk_bytes()));
  }
  if (!ParseKeyStyle(index.key_style()).ok()) return Damaged(absl::StrCat("key_style \"", index.key_style(), "\""));
  if (index.files_size() == 0 || index.files_size() != index.topology().world_size()) {
    return Damaged(absl::StrCat(index.files_size(), " files for a world of ", index.topology().world_size()));
  }
  absl::Status s = ValidateFiles(index);
  if (!s.ok()) return s;
  absl::flat_hash_set<absl::string_view> names;
  for (const v1::CheckpointTensor& t : index.tensors()) {
    if (!names.insert(t.name()).second) return Damaged(absl::StrCat("tensor \"", t.name(), "\" is listed twice"));
    s = ValidateTensor(index, t);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace muonshard::checkpoint
