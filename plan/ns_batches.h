#ifndef MUONSHARD_PLAN_NS_BATCHES_H_
#define MUONSHARD_PLAN_NS_BATCHES_H_

// NOTE [Muon batches]: a rank orthogonalises the Muon matrices it owns in
// batched calls, one per set of same-shape matrices (one MuonUpdateBatch:
// one loop over their matrices on the CPU, one strided-batched
// Newton-Schulz on CUDA, whose workspace grows with the batch). The
// sequential step batches across all of the rank's buckets that need no TP
// exchange, a batch closed before the item that would take it past a size
// limit; the pipelined steps, which update a bucket as soon as it is
// reduced, batch inside a bucket. A GPU reaches more of its GEMM rate on a
// larger batch (NOTE [Batched NS cost] in sim/cluster.h). NsBatches is the
// one definition of how items become batches, for the worker and the step
// simulator.

#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/types/span.h"

namespace muonshard::planner {

// The default size limit of a batch across buckets, MiB of its fp32
// update (4 bytes per element). The CUDA backend's workspace for a batch is
// about 2.3 times that with bf16 iterates (the update, two iterates and two
// Gram-sized products per matrix).
inline constexpr int64_t kDefaultMuonBatchMib = 1024;

// The elements a batch of `mib` MiB of fp32 update holds; 0 for 0 (no
// batches across buckets).
int64_t MuonBatchElements(int64_t mib);

// What may share a batch: one matrix shape (a 3-D stack's matrices count
// with their stack: only stacks of one size share a call), one layout and
// one variant (the worker's decay flag).
struct NsBatchKey {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t matrices = 1;
  int layout = 0;
  int variant = 0;

  friend bool operator<(const NsBatchKey& a, const NsBatchKey& b) {
    return std::tie(a.rows, a.cols, a.matrices, a.layout, a.variant) <
           std::tie(b.rows, b.cols, b.matrices, b.layout, b.variant);
  }
};

struct NsBatchItem {
  NsBatchKey key;
  int64_t elements = 0;  // of the whole item (all its matrices)
};

// The batches of `items`, as indices into it: items of one key, in their
// order, a batch closed when the next item of its key would take its
// elements above `max_elements` (an item alone may exceed it: items are
// never split); max_elements <= 0 puts every item of a key in one batch.
// Batches are ordered by their first item.
std::vector<std::vector<int>> NsBatches(absl::Span<const NsBatchItem> items, int64_t max_elements);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_NS_BATCHES_H_
