// A checkpoint's index.json from outside (a damaged or hand-edited
// checkpoint; `muonshardctl ckpt`, every load): proto3 JSON ->
// ValidateIndex, which must turn any inconsistency into a status so that
// what follows it never reads out of bounds. On an index it accepts, the
// loader's pure part runs: ComputeReads of each tensor's every state, whole
// and a middle slice, and the reads must stay inside their pieces and files
// and cover exactly what was asked.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/index.h"
#include "checkpoint/reads.h"
#include "checkpoint/state.h"
#include "common/proto_json.h"
#include "fuzz/fuzz_util.h"
#include "muonshard/v1/checkpoint.pb.h"

namespace muonshard::fuzz {
namespace {

// Tensors whose reads are computed (each costs a pass over its pieces).
constexpr int kMaxTensorsToRead = 64;

void CheckReads(const v1::CheckpointIndex& index, const checkpoint::ShardSpec& wanted,
                const std::vector<checkpoint::Read>& reads) {
  int64_t bytes = 0;
  for (const checkpoint::Read& r : reads) {
    FUZZ_CHECK(r.file >= 0 && r.file < index.files_size(), "read of a file outside the index");
    const v1::StatePiece& piece = index.tensors(r.tensor).states(r.state).pieces(r.piece);
    FUZZ_CHECK(piece.file() == r.file, "read names another file than its piece");
    FUZZ_CHECK(r.piece_offset >= 0 && r.bytes > 0 && r.piece_offset + r.bytes <= checkpoint::PieceBytes(piece),
               "read outside its piece");
    const int64_t at = checkpoint::FileOffset(index, r);
    FUZZ_CHECK(at >= 0 && at + r.bytes <= index.files(r.file).size_bytes(), "read outside its file");
    FUZZ_CHECK(checkpoint::VerifiedReadBytes(index, r) >= r.bytes, "verified read smaller than the read");
    FUZZ_CHECK(r.dest_element * 4 == bytes, "reads not in destination order");
    bytes += r.bytes;
  }
  FUZZ_CHECK(bytes == wanted.numel() * 4, absl::StrCat("reads cover ", bytes, " bytes of ", wanted.numel() * 4));
}

}  // namespace
}  // namespace muonshard::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  muonshard::fuzz::SilenceProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muonshard;  // NOLINT: a fuzz entry point
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  v1::CheckpointIndex index;
  if (!FromJson(json, &index, "index.json").ok()) return 0;
  if (!checkpoint::ValidateIndex(index).ok()) return 0;

  std::vector<checkpoint::ShardSpec> wanted;
  for (int t = 0; t < index.tensors_size() && t < fuzz::kMaxTensorsToRead; ++t) {
    const v1::CheckpointTensor& tensor = index.tensors(t);
    for (const v1::TensorStatePieces& state : tensor.states()) {
      auto kind = checkpoint::FromProto(state.kind());
      FUZZ_CHECK(kind.ok(), "a valid index with an unknown state kind");
      checkpoint::ShardSpec whole;
      whole.tensor = t;
      whole.name = tensor.name();
      whole.dtype = tensor.dtype();
      whole.kind = *kind;
      whole.begin = 0;
      whole.end = tensor.numel();
      whole.tensor_numel = tensor.numel();
      wanted.push_back(whole);
      checkpoint::ShardSpec middle = whole;
      middle.begin = tensor.numel() / 3;
      middle.end = tensor.numel() - tensor.numel() / 3;
      if (middle.end > middle.begin) wanted.push_back(middle);
      if (tensor.tp() > 1) {
        // The last TP shard as saved (read directly); the whole ranges above
        // map through the shards (NOTE [TP reshard]).
        checkpoint::ShardSpec shard = whole;
        shard.tp = tensor.tp();
        shard.tp_rank = tensor.tp() - 1;
        shard.tp_dim = tensor.tp_dim();
        shard.shape.assign(tensor.shape().begin(), tensor.shape().end());
        shard.end = tensor.numel() / tensor.tp();
        wanted.push_back(shard);
      }
    }
  }
  auto reads = checkpoint::ComputeReads(index, wanted);
  FUZZ_CHECK(reads.ok(), absl::StrCat("a valid index cannot serve its own tensors: ", reads.status().ToString()));
  FUZZ_CHECK(reads->size() == wanted.size(), "one list of reads per wanted shard");
  for (size_t i = 0; i < wanted.size(); ++i) fuzz::CheckReads(index, wanted[i], (*reads)[i]);
  return 0;
}
