#include "checkpoint/reader.h"

#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/index.h"
#include "checkpoint/internal/checksums.h"
#include "checkpoint/internal/rank_file.h"
#include "checkpoint/reads.h"
#include "common/env.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "plan/planner.h"

namespace muonshard::checkpoint {
namespace {

std::string Join(const std::string& dir, absl::string_view name) { return absl::StrCat(dir, "/", name); }

absl::Status Damaged(const std::string& where, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(where, ": ", what));
}

// The highest step-N of `dir` with an index.json; nullopt when none.
absl::StatusOr<std::optional<int64_t>> ScanSteps(Env* env, const std::string& dir) {
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<std::string> names, env->GetChildren(dir));
  std::optional<int64_t> best;
  for (const std::string& name : names) {
    std::optional<int64_t> step = ParseStepDirName(name);
    if (!step || (best && *step <= *best)) continue;
    MUONSHARD_ASSIGN_OR_RETURN(bool indexed, env->FileExists(Join(Join(dir, name), kIndexFileName)));
    if (indexed) best = step;
  }
  return best;
}

// The bytes of a step's metadata files, each read once and checked against
// checksums.sha256 before anything parses them (NOTE [Metadata checksums] in
// writer.cc).
struct Metadata {
  std::string index;
  std::string plan;
  std::string request;
};

absl::StatusOr<internal::Checksums> ReadChecksums(Env* env, const std::string& step_dir) {
  const std::string path = Join(step_dir, kChecksumsFileName);
  auto text = env->ReadFileToString(path);
  if (!text.ok()) {
    // No fallback to an unchecked index: that would accept any edit of one.
    // Someone who vouches for an older step's metadata can write the file
    // with plain sha256sum: its format is this one.
    return Damaged(path, absl::StrCat("missing or unreadable, so the index cannot be checked (damaged, or saved "
                                      "by a build before checksums; to vouch for it, run `sha256sum ",
                                      kIndexFileName, " ", kPlanFileName, " ", kRequestFileName, " > ",
                                      kChecksumsFileName, "` in the step directory): ", text.status().message()));
  }
  return internal::Checksums::Parse(*text, path);
}

absl::StatusOr<std::string> ReadChecked(Env* env, const std::string& step_dir, absl::string_view name,
                                        const internal::Checksums& sums) {
  const std::string path = Join(step_dir, name);
  auto bytes = env->ReadFileToString(path);
  if (!bytes.ok()) return Damaged(path, bytes.status().message());
  MUONSHARD_RETURN_IF_ERROR(sums.Check(name, *bytes, path));
  return *std::move(bytes);
}

absl::StatusOr<Metadata> ReadMetadata(Env* env, const std::string& step_dir) {
  Metadata m;
  // The index first: without one the directory is no checkpoint at all.
  auto index = env->ReadFileToString(Join(step_dir, kIndexFileName));
  if (!index.ok()) {
    return Damaged(step_dir, absl::StrCat("no readable ", kIndexFileName,
                                          " (torn, or not a checkpoint): ", index.status().message()));
  }
  m.index = *std::move(index);
  MUONSHARD_ASSIGN_OR_RETURN(internal::Checksums sums, ReadChecksums(env, step_dir));
  MUONSHARD_RETURN_IF_ERROR(sums.Check(kIndexFileName, m.index, Join(step_dir, kIndexFileName)));
  MUONSHARD_ASSIGN_OR_RETURN(m.plan, ReadChecked(env, step_dir, kPlanFileName, sums));
  MUONSHARD_ASSIGN_OR_RETURN(m.request, ReadChecked(env, step_dir, kRequestFileName, sums));
  return m;
}

absl::Status ParseBinaryProto(const std::string& path, const std::string& bytes, google::protobuf::Message* message) {
  if (!message->ParseFromString(bytes)) return Damaged(path, absl::StrCat("not a binary ", message->GetTypeName()));
  return absl::OkStatus();
}

absl::Status ParseIndex(const std::string& step_dir, const std::string& json, v1::CheckpointIndex* index) {
  const std::string path = Join(step_dir, kIndexFileName);
  absl::Status parsed = FromJson(json, index, path);
  if (!parsed.ok()) return absl::DataLossError(parsed.message());
  return Annotate(ValidateIndex(*index), path);
}

// plan.pb and request.pb belong to the index: same content hash, same world.
absl::Status CheckPlanFiles(const Checkpoint& c) {
  if (c.plan.content_hash() != c.index.plan_hash() || planner::ContentHash(c.request) != c.index.plan_hash()) {
    return Damaged(c.step_dir,
                   absl::StrCat(kPlanFileName, " or ", kRequestFileName, " is not of plan ", c.index.plan_hash()));
  }
  if (c.plan.ranks_size() != c.index.files_size()) {
    return Damaged(c.step_dir, absl::StrCat("the plan has ", c.plan.ranks_size(), " ranks, the index ",
                                            c.index.files_size(), " files"));
  }
  return absl::OkStatus();
}

absl::Status CheckFilesPresent(const Checkpoint& c) {
  for (const v1::CheckpointFile& f : c.index.files()) {
    const std::string path = Join(c.step_dir, f.name());
    auto size = c.env->GetFileSize(path);
    if (!size.ok()) {
      return Damaged(path,
                     absl::StrCat("rank ", f.rank(), "'s file is missing or unreadable: ", size.status().message()));
    }
    if (*size != f.size_bytes()) {
      return Damaged(path, absl::StrCat(*size, " bytes, the index says ", f.size_bytes(), " (truncated?)"));
    }
  }
  return absl::OkStatus();
}

// The rank files a load reads from, opened on first use with their headers.
class SourceFiles {
 public:
  explicit SourceFiles(const Checkpoint& c) : checkpoint_(c), files_(c.index.files_size()) {}

  int64_t bytes_read() const { return bytes_read_; }

  absl::Status Copy(const Read& read, char* dest) {
    MUONSHARD_ASSIGN_OR_RETURN(Source * source, Get(read.file));
    const v1::StatePiece& piece = checkpoint_.index.tensors(read.tensor).states(read.state).pieces(read.piece);
    MUONSHARD_RETURN_IF_ERROR(internal::CheckPieceInHeader(source->header, piece, *source->file));
    MUONSHARD_ASSIGN_OR_RETURN(int64_t n,
                               internal::ReadVerified(*source->file, piece, checkpoint_.index.checksum_chunk_bytes(),
                                                      read.piece_offset, read.bytes, dest, &scratch_));
    bytes_read_ += n;
    return absl::OkStatus();
  }

 private:
  struct Source {
    std::unique_ptr<RandomAccessFile> file;
    internal::RankFileHeader header;
  };

  absl::StatusOr<Source*> Get(int index) {
    if (files_[index] != nullptr) return files_[index].get();
    const v1::CheckpointFile& f = checkpoint_.index.files(index);
    MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                               internal::OpenRankFile(checkpoint_.env, Join(checkpoint_.step_dir, f.name())));
    MUONSHARD_ASSIGN_OR_RETURN(int64_t size, file->Size());
    if (size != f.size_bytes()) {
      return Damaged(file->path(), absl::StrCat(size, " bytes, the index says ", f.size_bytes()));
    }
    MUONSHARD_ASSIGN_OR_RETURN(internal::RankFileHeader header, internal::ReadRankFileHeader(*file, size));
    bytes_read_ += header.bytes_read;
    files_[index] = std::make_unique<Source>(Source{std::move(file), std::move(header)});
    return files_[index].get();
  }

  const Checkpoint& checkpoint_;
  std::vector<std::unique_ptr<Source>> files_;
  std::vector<char> scratch_;
  int64_t bytes_read_ = 0;
};

}  // namespace

absl::StatusOr<int64_t> LatestStep(const std::string& dir, const OpenOptions& options) {
  Env* env = options.env;
  MUONSHARD_ASSIGN_OR_RETURN(bool is_dir, env->IsDirectory(dir));
  if (!is_dir) return absl::NotFoundError(absl::StrCat("checkpoint directory \"", dir, "\" does not exist"));
  const std::string latest = Join(dir, kLatestFileName);
  auto content = env->ReadFileToString(latest);
  if (content.ok()) {
    std::optional<int64_t> step = ParseStepDirName(absl::StripAsciiWhitespace(*content));
    if (!step) return Damaged(latest, absl::StrCat("holds \"", *content, "\", not step-N"));
    return *step;
  }
  if (!absl::IsNotFound(content.status())) return content.status();
  MUONSHARD_ASSIGN_OR_RETURN(std::optional<int64_t> scanned, ScanSteps(env, dir));
  if (!scanned) return absl::NotFoundError(absl::StrCat("no committed checkpoint in \"", dir, "\""));
  return *scanned;
}

absl::StatusOr<Checkpoint> OpenCheckpoint(const std::string& dir, std::optional<int64_t> step,
                                          const OpenOptions& options) {
  if (!step) {
    MUONSHARD_ASSIGN_OR_RETURN(step, LatestStep(dir, options));
  }
  Checkpoint c;
  c.env = options.env;
  c.root = dir;
  c.step_dir = Join(dir, StepDirName(*step));
  MUONSHARD_ASSIGN_OR_RETURN(bool exists, c.env->IsDirectory(c.step_dir));
  if (!exists) {
    MUONSHARD_ASSIGN_OR_RETURN(bool torn, c.env->FileExists(Join(dir, TempStepDirName(*step))));
    if (torn) {
      return Damaged(dir, absl::StrCat("step ", *step, " is incomplete: ", TempStepDirName(*step),
                                       " was never committed (a save died mid-way?)"));
    }
    return absl::NotFoundError(absl::StrCat("no step ", *step, " in checkpoint directory \"", dir, "\""));
  }
  MUONSHARD_ASSIGN_OR_RETURN(Metadata metadata, ReadMetadata(c.env, c.step_dir));
  MUONSHARD_RETURN_IF_ERROR(ParseIndex(c.step_dir, metadata.index, &c.index));
  if (c.index.step() != *step) {
    return Damaged(c.step_dir, absl::StrCat("its index is of step ", c.index.step()));
  }
  MUONSHARD_RETURN_IF_ERROR(ParseBinaryProto(Join(c.step_dir, kPlanFileName), metadata.plan, &c.plan));
  MUONSHARD_RETURN_IF_ERROR(ParseBinaryProto(Join(c.step_dir, kRequestFileName), metadata.request, &c.request));
  MUONSHARD_RETURN_IF_ERROR(CheckPlanFiles(c));
  MUONSHARD_RETURN_IF_ERROR(CheckFilesPresent(c));
  return c;
}

absl::Status CheckCompatible(const v1::CheckpointIndex& index, const v1::Plan& plan) {
  absl::flat_hash_map<absl::string_view, const v1::CheckpointTensor*> saved;
  for (const v1::CheckpointTensor& t : index.tensors()) saved[t.name()] = &t;
  for (const v1::PlannedTensor& t : plan.tensors()) {
    MUONSHARD_RETURN_IF_ERROR(CheckFormatHolds(t));
    auto it = saved.find(t.name());
    if (it == saved.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name(), "\" is not in the checkpoint (model \"", index.model(), "\")"));
    }
    const v1::CheckpointTensor& s = *it->second;
    if (s.shape_size() != t.shape_size() || !std::equal(t.shape().begin(), t.shape().end(), s.shape().begin())) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name(), "\" has another shape in the checkpoint"));
    }
    if (s.optimizer() != t.optimizer()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name(), "\" was saved for ",
                                                     v1::Optimizer_Name(s.optimizer()), ", the plan uses ",
                                                     v1::Optimizer_Name(t.optimizer())));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadResult> LoadRankState(const Checkpoint& checkpoint, absl::Span<const StateShard> shards) {
  IndexLookup lookup(checkpoint.index);
  SourceFiles files(checkpoint);
  for (const StateShard& shard : shards) {
    if (static_cast<int64_t>(shard.data.size()) != shard.spec.numel()) {
      return absl::InvalidArgumentError(absl::StrCat("shard \"", shard.spec.name, "\" ", StateKindName(shard.spec.kind),
                                                     " has room for ", shard.data.size(), " elements, not ",
                                                     shard.spec.numel()));
    }
    MUONSHARD_ASSIGN_OR_RETURN(std::vector<Read> reads, ComputeReads(lookup, shard.spec));
    char* base = reinterpret_cast<char*>(shard.data.data());
    for (const Read& r : reads) MUONSHARD_RETURN_IF_ERROR(files.Copy(r, base + r.dest_element * 4));
  }
  LoadResult result;
  result.scalars.step = checkpoint.index.step();
  result.scalars.beta1_pow = checkpoint.index.scalars().beta1_pow();
  result.scalars.beta2_pow = checkpoint.index.scalars().beta2_pow();
  result.bytes_read = files.bytes_read();
  return result;
}

}  // namespace muonshard::checkpoint
