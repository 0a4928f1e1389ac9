#include "worker/optimizer/internal/ns_block_spec.h"

#include "absl/strings/str_cat.h"

namespace muonshard::worker::internal {

absl::StatusOr<kernels::NsBlockSpec> NsBlockSpecOf(const v1::NsBlocks& blocks, int64_t rows, int64_t cols) {
  kernels::NsBlockSpec spec;
  if (blocks.axis() != v1::NsBlocks::ROWS && blocks.axis() != v1::NsBlocks::COLS) {
    return absl::InvalidArgumentError("ns_blocks: the axis is not set");
  }
  spec.axis = blocks.axis() == v1::NsBlocks::ROWS ? kernels::NsBlockAxis::kRows : kernels::NsBlockAxis::kCols;
  const int64_t length = blocks.axis() == v1::NsBlocks::ROWS ? rows : cols;
  if (blocks.stride() > 0) {
    if (length % blocks.stride() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ns_blocks: stride ", blocks.stride(), " does not divide ", length));
    }
    for (int64_t j = 0; j < blocks.stride(); ++j) spec.blocks.push_back({j, length / blocks.stride(), blocks.stride()});
    return spec;
  }
  int64_t group = 0;
  for (int64_t s : blocks.sizes()) {
    if (s <= 0) return absl::InvalidArgumentError("ns_blocks: a size <= 0");
    group += s;
  }
  if (group <= 0 || length % group != 0 || (blocks.groups() > 0 && blocks.groups() * group != length)) {
    return absl::InvalidArgumentError(absl::StrCat("ns_blocks: the sizes do not tile ", length));
  }
  for (int64_t at = 0; at < length;) {
    for (int64_t s : blocks.sizes()) {
      spec.blocks.push_back({at, s, 1});
      at += s;
    }
  }
  return spec;
}

absl::StatusOr<kernels::NsBlockSpec> ShardNsBlockSpec(const kernels::NsBlockSpec& whole, int64_t begin, int64_t end) {
  kernels::NsBlockSpec shard;
  shard.axis = whole.axis;
  for (const kernels::NsBlock& b : whole.blocks) {
    const int64_t last = b.begin + (b.length - 1) * b.step;
    if (last < begin || b.begin >= end) continue;
    if (b.begin < begin || last >= end) {
      return absl::InvalidArgumentError(absl::StrCat("ns_blocks: a block of [", b.begin, ", ", last + 1,
                                                     ") straddles the shard [", begin, ", ", end, ")"));
    }
    shard.blocks.push_back({b.begin - begin, b.length, b.step});
  }
  return shard;
}

}  // namespace muonshard::worker::internal
