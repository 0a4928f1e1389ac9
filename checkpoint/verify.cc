#include "checkpoint/verify.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/index.h"
#include "checkpoint/internal/checksums.h"
#include "checkpoint/internal/rank_file.h"
#include "common/status_macros.h"

namespace muonshard::checkpoint {
namespace {

// Blocks of the bytes between pieces (headers, Paddle's beta powers).
constexpr int64_t kStreamBytes = int64_t{4} << 20;

std::vector<std::vector<const v1::StatePiece*>> PiecesByFile(const v1::CheckpointIndex& index) {
  std::vector<std::vector<const v1::StatePiece*>> by_file(index.files_size());
  for (const v1::CheckpointTensor& t : index.tensors()) {
    for (const v1::TensorStatePieces& s : t.states()) {
      for (const v1::StatePiece& p : s.pieces()) by_file[p.file()].push_back(&p);
    }
  }
  for (auto& pieces : by_file) {
    std::sort(pieces.begin(), pieces.end(),
              [](const v1::StatePiece* a, const v1::StatePiece* b) { return a->data_offset() < b->data_offset(); });
  }
  return by_file;
}

// Reads a file front to back once: the whole-file crc32 from every byte, and
// each piece's chunk crc32s on the way.
class FileScan {
 public:
  FileScan(const RandomAccessFile& file, int64_t chunk) : file_(file), chunk_(chunk) {}

  absl::Status SkipTo(int64_t end) {
    while (pos_ < end) {
      const int64_t n = std::min(kStreamBytes, end - pos_);
      buffer_.resize(static_cast<size_t>(n));
      MUONSHARD_RETURN_IF_ERROR(file_.ReadAt(pos_, buffer_.data(), n));
      crc_ = internal::Crc32(crc_, buffer_.data(), n);
      pos_ += n;
    }
    return absl::OkStatus();
  }

  absl::Status Piece(const v1::StatePiece& p) {
    if (p.data_offset() < pos_) {
      return absl::DataLossError(
          absl::StrCat("\"", file_.path(), "\": key \"", p.key(), "\" overlaps the previous piece"));
    }
    MUONSHARD_RETURN_IF_ERROR(SkipTo(p.data_offset()));
    const int64_t bytes = PieceBytes(p);
    for (int c = 0; c < p.chunk_crc32_size(); ++c) {
      const int64_t n = std::min(chunk_, bytes - c * chunk_);
      buffer_.resize(static_cast<size_t>(n));
      MUONSHARD_RETURN_IF_ERROR(file_.ReadAt(pos_, buffer_.data(), n));
      const uint32_t crc = internal::Crc32(0, buffer_.data(), n);
      if (crc != p.chunk_crc32(c)) {
        return absl::DataLossError(absl::StrCat("\"", file_.path(), "\": key \"", p.key(),
                                                "\": crc32 mismatch in bytes [", c * chunk_, ", ", c * chunk_ + n,
                                                ") of its data (corrupt file)"));
      }
      crc_ = internal::Crc32Combine(crc_, crc, n);
      pos_ += n;
    }
    return absl::OkStatus();
  }

  uint32_t crc() const { return crc_; }

 private:
  const RandomAccessFile& file_;
  const int64_t chunk_;
  int64_t pos_ = 0;
  uint32_t crc_ = 0;
  std::vector<char> buffer_;
};

absl::Status VerifyFile(const Checkpoint& c, const v1::CheckpointFile& f,
                        const std::vector<const v1::StatePiece*>& pieces) {
  MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                             internal::OpenRankFile(c.env, absl::StrCat(c.step_dir, "/", f.name())));
  MUONSHARD_ASSIGN_OR_RETURN(int64_t size, file->Size());
  if (size != f.size_bytes()) {
    return absl::DataLossError(
        absl::StrCat("\"", file->path(), "\": ", size, " bytes, the index says ", f.size_bytes(), " (truncated?)"));
  }
  MUONSHARD_ASSIGN_OR_RETURN(internal::RankFileHeader header, internal::ReadRankFileHeader(*file, size));
  for (const v1::StatePiece* p : pieces) MUONSHARD_RETURN_IF_ERROR(internal::CheckPieceInHeader(header, *p, *file));
  FileScan scan(*file, c.index.checksum_chunk_bytes());
  for (const v1::StatePiece* p : pieces) MUONSHARD_RETURN_IF_ERROR(scan.Piece(*p));
  MUONSHARD_RETURN_IF_ERROR(scan.SkipTo(size));
  if (scan.crc() != f.crc32()) {
    return absl::DataLossError(absl::StrCat("\"", file->path(), "\": whole-file crc32 ", scan.crc(),
                                            ", the index says ", f.crc32(), " (corrupt file)"));
  }
  return absl::OkStatus();
}

}  // namespace

v1::CheckpointSummary SummarizeCheckpoint(const Checkpoint& checkpoint) {
  const v1::CheckpointIndex& index = checkpoint.index;
  v1::CheckpointSummary s;
  s.set_step_dir(checkpoint.step_dir);
  s.set_step(index.step());
  s.set_plan_hash(index.plan_hash());
  s.set_plan_version(index.plan_version());
  s.set_model(index.model());
  *s.mutable_topology() = index.topology();
  *s.mutable_policy() = index.policy();
  *s.mutable_scalars() = index.scalars();
  s.set_tensors(index.tensors_size());
  for (const v1::CheckpointFile& f : index.files()) {
    v1::CheckpointSummary::RankBytes* r = s.add_ranks();
    r->set_rank(f.rank());
    r->set_file(f.name());
    r->set_file_bytes(f.size_bytes());
    s.set_file_bytes(s.file_bytes() + f.size_bytes());
  }
  for (const v1::CheckpointTensor& t : index.tensors()) {
    for (const v1::TensorStatePieces& st : t.states()) {
      for (const v1::StatePiece& p : st.pieces()) {
        v1::CheckpointSummary::RankBytes* r = s.mutable_ranks(p.file());
        r->set_state_bytes(r->state_bytes() + PieceBytes(p));
        r->set_pieces(r->pieces() + 1);
        s.set_state_bytes(s.state_bytes() + PieceBytes(p));
      }
    }
  }
  return s;
}

absl::StatusOr<v1::CheckpointSummary> VerifyCheckpoint(const Checkpoint& checkpoint) {
  const auto pieces = PiecesByFile(checkpoint.index);
  for (int f = 0; f < checkpoint.index.files_size(); ++f) {
    MUONSHARD_RETURN_IF_ERROR(VerifyFile(checkpoint, checkpoint.index.files(f), pieces[f]));
  }
  v1::CheckpointSummary s = SummarizeCheckpoint(checkpoint);
  s.set_verified(true);
  return s;
}

}  // namespace muonshard::checkpoint
