#ifndef MUONSHARD_WORKER_OPTIMIZER_INTERNAL_BUCKET_SPLIT_H_
#define MUONSHARD_WORKER_OPTIMIZER_INTERNAL_BUCKET_SPLIT_H_

// NOTE [Step pieces]
// The plan's fusion buckets are what a step reduces and broadcasts, and so
// the unit of the pipelined step's overlap (NOTE [Pipelined step] in
// sharded_optimizer.h). With large buckets (Paddle's 256 MiB default) a
// rank's Muon matrices are often one bucket per owner: its Newton-Schulz
// then starts only when the whole bucket is reduced, and its broadcast only
// when all of it is orthogonalised, so nothing overlaps the last owner's
// work. SplitMuonBuckets cuts every Muon bucket into pieces of whole
// entries, in place of the bucket and in its order, each piece one
// collective of its own, so the reduce, Newton-Schulz and broadcast of one
// piece overlap those of the others.
//
// A piece is a valid bucket: the same group, owner and dtype, a contiguous
// range [start, next piece's start) of the bucket's buffer holding its
// entries and the padding after them (so the pieces tile the buffer and a
// step moves the same bytes), entries rebased to it (still aligned: each
// piece starts at an entry's aligned offset). Owned tensors name their
// piece. Pieces get ids above every Muon bucket id of the view.
//
// The cut depends only on the bucket's entries, the gradient dtype and
// `max_bytes`, so every rank of a group cuts its buckets alike, as the
// collectives require: all ranks of a job must use the same `max_bytes`.
// Pieces change the reductions' segments, so a Gloo step with pieces sums
// in another order (last ulps) than one without: a step with and one
// without pieces are compared with a tolerance, like two backends.

#include <cstdint>

#include "absl/status/statusor.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::worker::internal {

// The rule: walking a bucket's entries in order, a piece takes the next entry
// while its gradient bytes from the piece's start to that entry's end stay
// within `max_bytes`; an entry alone above it is a piece of its own. A
// bucket that fits stays as it is (its id too). max_bytes <= 0: `view`
// unchanged.
// Possible errors: INVALID_ARGUMENT (entries out of order or outside the
// buffer, an owned tensor matching no entry of its bucket), naming the
// bucket or tensor.
absl::StatusOr<v1::RankView> SplitMuonBuckets(const v1::RankView& view, int64_t max_bytes);

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_OPTIMIZER_INTERNAL_BUCKET_SPLIT_H_
