#ifndef MUONSHARD_CHECKPOINT_INTERNAL_RANK_FILE_H_
#define MUONSHARD_CHECKPOINT_INTERNAL_RANK_FILE_H_

// Reading one rank file of a checkpoint: its safetensors header, the check
// that the header agrees with the index about a piece, and checksum-verified
// reads of piece bytes. Shared by the loader and the verifier.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/safetensors.h"
#include "common/env.h"
#include "muonshard/v1/checkpoint.pb.h"

namespace muonshard::checkpoint::internal {

struct RankFileHeader {
  SafetensorsHeader header;
  absl::flat_hash_map<std::string, int> by_key;  // position in header.entries
  int64_t bytes_read = 0;
};

// Opens a rank file for reading; a missing one is DATA_LOSS (the index
// names it, so the checkpoint is damaged).
absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenRankFile(Env* env, const std::string& path);

// Reads and parses the header of `file` (of `size` bytes). DATA_LOSS naming
// the file when it does not parse.
absl::StatusOr<RankFileHeader> ReadRankFileHeader(const RandomAccessFile& file, int64_t size);

// DATA_LOSS naming the file and key unless the header holds `piece.key()` as
// F32 [end - begin] at the piece's data_offset.
absl::Status CheckPieceInHeader(const RankFileHeader& header, const v1::StatePiece& piece,
                                const RandomAccessFile& file);

// Copies bytes [offset, offset + bytes) of `piece`'s data into `dest`,
// checking the crc32 of every checksum chunk those bytes lie in. Whole chunks
// are read straight into `dest`; a chunk covered in part is read whole into
// `scratch` and the needed bytes copied. Returns the bytes read from the
// file. DATA_LOSS naming the file, key and chunk on a mismatch.
absl::StatusOr<int64_t> ReadVerified(const RandomAccessFile& file, const v1::StatePiece& piece, int64_t chunk_bytes,
                                     int64_t offset, int64_t bytes, char* dest, std::vector<char>* scratch);

}  // namespace muonshard::checkpoint::internal

#endif  // MUONSHARD_CHECKPOINT_INTERNAL_RANK_FILE_H_
