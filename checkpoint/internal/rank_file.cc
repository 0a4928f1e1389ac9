#include "checkpoint/internal/rank_file.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "checkpoint/index.h"
#include "checkpoint/internal/checksums.h"
#include "common/status_macros.h"

namespace muonshard::checkpoint::internal {
namespace {

// Reads chunks [first, last) of `piece` into `dest` (the first chunk's
// start) and checks each one's crc32.
absl::Status ReadChunks(const RandomAccessFile& file, const v1::StatePiece& piece, int64_t chunk, int64_t first,
                        int64_t last, char* dest) {
  const int64_t begin = first * chunk;
  const int64_t end = std::min(last * chunk, PieceBytes(piece));
  MUONSHARD_RETURN_IF_ERROR(file.ReadAt(piece.data_offset() + begin, dest, end - begin));
  for (int64_t c = first; c < last; ++c) {
    const int64_t lo = c * chunk;
    const int64_t n = std::min(chunk, PieceBytes(piece) - lo);
    if (Crc32(0, dest + (lo - begin), n) != piece.chunk_crc32(static_cast<int>(c))) {
      return absl::DataLossError(absl::StrCat("\"", file.path(), "\": key \"", piece.key(),
                                              "\": crc32 mismatch in bytes [", lo, ", ", lo + n,
                                              ") of its data (corrupt file)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenRankFile(Env* env, const std::string& path) {
  auto file = env->NewRandomAccessFile(path);
  if (absl::IsNotFound(file.status())) {
    return absl::DataLossError(absl::StrCat("rank file is missing: ", file.status().message()));
  }
  return file;
}

absl::StatusOr<RankFileHeader> ReadRankFileHeader(const RandomAccessFile& file, int64_t size) {
  RankFileHeader out;
  auto fail = [&file](const absl::Status& s) { return Annotate(s, absl::StrCat("\"", file.path(), "\"")); };
  char first8[8] = {};
  if (size >= 8) {
    absl::Status s = file.ReadAt(0, first8, 8);
    if (!s.ok()) return fail(s);
  }
  auto length = SafetensorsHeaderLength(absl::string_view(first8, size >= 8 ? 8 : 0), size);
  if (!length.ok()) return fail(length.status());
  std::string json(static_cast<size_t>(*length), '\0');
  absl::Status s = file.ReadAt(8, json.data(), *length);
  if (!s.ok()) return fail(s);
  auto header = ParseSafetensorsHeader(json, size);
  if (!header.ok()) return fail(header.status());
  out.header = *std::move(header);
  out.bytes_read = 8 + *length;
  for (int i = 0; i < static_cast<int>(out.header.entries.size()); ++i) out.by_key[out.header.entries[i].key] = i;
  return out;
}

absl::Status CheckPieceInHeader(const RankFileHeader& header, const v1::StatePiece& piece,
                                const RandomAccessFile& file) {
  auto it = header.by_key.find(piece.key());
  if (it == header.by_key.end()) {
    return absl::DataLossError(absl::StrCat("\"", file.path(), "\": no key \"", piece.key(), "\" in its header"));
  }
  const SafetensorsEntry& e = header.header.entries[it->second];
  const int64_t numel = piece.end() - piece.begin();
  if (e.dtype != "F32" || e.shape != std::vector<int64_t>{numel} ||
      header.header.data_start + e.begin != piece.data_offset()) {
    return absl::DataLossError(absl::StrCat("\"", file.path(), "\": key \"", piece.key(), "\" is not F32 [", numel,
                                            "] at byte ", piece.data_offset(), " as the index says"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ReadVerified(const RandomAccessFile& file, const v1::StatePiece& piece, int64_t chunk_bytes,
                                     int64_t offset, int64_t bytes, char* dest, std::vector<char>* scratch) {
  if (bytes <= 0) return 0;
  const int64_t piece_bytes = PieceBytes(piece);
  const int64_t end = offset + bytes;
  const int64_t chunks = ChunkCount(piece_bytes, chunk_bytes);
  // Chunks wholly inside [offset, end) go straight to `dest`; the piece's
  // last chunk may be short, so reaching the piece's end completes it.
  const int64_t full_first = (offset + chunk_bytes - 1) / chunk_bytes;
  const int64_t full_last = end == piece_bytes ? chunks : end / chunk_bytes;
  int64_t read = 0;
  if (full_first < full_last) {
    MUONSHARD_RETURN_IF_ERROR(
        ReadChunks(file, piece, chunk_bytes, full_first, full_last, dest + (full_first * chunk_bytes - offset)));
    read += std::min(full_last * chunk_bytes, piece_bytes) - full_first * chunk_bytes;
  }
  const int64_t head = offset / chunk_bytes;
  const int64_t tail = (end - 1) / chunk_bytes;
  for (int64_t c : {head, tail}) {
    if (c >= full_first && c < full_last) continue;
    const int64_t lo = c * chunk_bytes;
    const int64_t hi = std::min(lo + chunk_bytes, piece_bytes);
    scratch->resize(static_cast<size_t>(hi - lo));
    MUONSHARD_RETURN_IF_ERROR(ReadChunks(file, piece, chunk_bytes, c, c + 1, scratch->data()));
    const int64_t from = std::max(lo, offset);
    const int64_t to = std::min(hi, end);
    std::memcpy(dest + (from - offset), scratch->data() + (from - lo), static_cast<size_t>(to - from));
    read += hi - lo;
    if (head == tail) break;  // one partial chunk serves both ends
  }
  return read;
}

}  // namespace muonshard::checkpoint::internal
