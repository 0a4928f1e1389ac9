#ifndef MUONSHARD_CHECKPOINT_READS_H_
#define MUONSHARD_CHECKPOINT_READS_H_

// Reshard on load, the pure part: which bytes of which checkpoint files fill
// the shards a rank of any plan wants. Nothing here assumes the checkpoint
// was written under the same world size, pp, ep, policy or bucket size: a
// wanted (tensor, kind, [begin, end)) is matched by name against the pieces
// the index lists and cut into one read per overlapping piece.
//
// No I/O (LoadRankState in reader.h does it); thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "checkpoint/state.h"
#include "muonshard/v1/checkpoint.pb.h"

namespace muonshard::checkpoint {

// One contiguous copy from a piece of the checkpoint into a shard.
struct Read {
  int file = 0;              // index into CheckpointIndex.files
  int tensor = 0;            // index into CheckpointIndex.tensors
  int state = 0;             // index into tensors[tensor].states
  int piece = 0;             // index into states[state].pieces
  int64_t piece_offset = 0;  // bytes from the start of the piece's data
  int64_t bytes = 0;
  int64_t dest_element = 0;  // element offset in the wanted shard
};

// Name lookups over an index. REQUIRES: ValidateIndex(index).ok(); `index`
// outlives the lookup.
class IndexLookup {
 public:
  explicit IndexLookup(const v1::CheckpointIndex& index);

  const v1::CheckpointIndex& index() const { return index_; }
  // Position in index.tensors, -1 when absent.
  int FindTensor(absl::string_view name) const;
  // Position in tensors[tensor].states, -1 when that tensor keeps no `kind`.
  int FindState(int tensor, StateKind kind) const;

 private:
  const v1::CheckpointIndex& index_;
  absl::flat_hash_map<absl::string_view, int> tensors_;
};

// The reads that fill `wanted` exactly, in destination order.
// INVALID_ARGUMENT naming the tensor when the checkpoint does not hold it, or
// holds it with another optimizer (no such state) or fewer elements: a
// different model.
absl::StatusOr<std::vector<Read>> ComputeReads(const IndexLookup& lookup, const ShardSpec& wanted);

// The same for several shards: element i holds the reads of wanted[i].
absl::StatusOr<std::vector<std::vector<Read>>> ComputeReads(const v1::CheckpointIndex& index,
                                                            absl::Span<const ShardSpec> wanted);

// Absolute byte offset of a read in its file.
int64_t FileOffset(const v1::CheckpointIndex& index, const Read& read);

// Bytes the loader actually reads for `read`: the read widened to the
// piece's checksum-chunk boundaries, since every byte it copies is checked
// against its chunk's crc32.
int64_t VerifiedReadBytes(const v1::CheckpointIndex& index, const Read& read);

}  // namespace muonshard::checkpoint

#endif  // MUONSHARD_CHECKPOINT_READS_H_
