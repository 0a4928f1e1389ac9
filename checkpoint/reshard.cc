#include "checkpoint/reshard.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/reshard_plan.h"
#include "checkpoint/state.h"
#include "checkpoint/writer.h"
#include "common/status_macros.h"

namespace muonshard::checkpoint {
namespace {

// Loads rank `rank` of `to` from the source and writes it into out_dir.
absl::StatusOr<int64_t> ReshardRank(const Checkpoint& source, const v1::Plan& to, int rank, const std::string& out_dir,
                                    const WriteOptions& write_options) {
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<ShardSpec> specs, ExpectedShards(to, rank));
  std::vector<float> buffer(static_cast<size_t>(TotalNumel(specs)));
  std::vector<StateShard> shards;
  shards.reserve(specs.size());
  int64_t at = 0;
  for (ShardSpec& spec : specs) {
    const int64_t n = spec.numel();
    shards.push_back({std::move(spec), absl::Span<float>(buffer.data() + at, static_cast<size_t>(n))});
    at += n;
  }
  MUONSHARD_ASSIGN_OR_RETURN(LoadResult loaded, LoadRankState(source, shards));
  RankFileTarget target{out_dir, loaded.scalars.step, to.content_hash(), rank, to.ranks_size(), ""};
  MUONSHARD_RETURN_IF_ERROR(WriteRankFile(target, shards, loaded.scalars, write_options).status());
  return loaded.bytes_read;
}

}  // namespace

absl::StatusOr<v1::ReshardSummary> ReshardCheckpoint(const Checkpoint& source, const v1::Plan& to,
                                                     const v1::PlanRequest& to_request, const std::string& out_dir,
                                                     const ReshardOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(CheckCompatible(source.index, to));
  MUONSHARD_ASSIGN_OR_RETURN(v1::ReshardSummary summary, SummarizeReshard(source.index, source.plan, to));
  WriteOptions write_options;
  write_options.env = options.env;
  MUONSHARD_ASSIGN_OR_RETURN(write_options.key_style, ParseKeyStyle(source.index.key_style()));
  if (options.key_style) write_options.key_style = *options.key_style;
  write_options.checksum_chunk_bytes =
      options.checksum_chunk_bytes > 0 ? options.checksum_chunk_bytes : source.index.checksum_chunk_bytes();
  int64_t bytes_read = 0;
  for (int rank = 0; rank < to.ranks_size(); ++rank) {
    absl::StatusOr<int64_t> n = ReshardRank(source, to, rank, out_dir, write_options);
    if (!n.ok()) {
      // Every rank is written here: the save failed as a whole (NOTE [Failed
      // saves] in writer.cc).
      AbandonSave(out_dir, source.index.step(), options.env).IgnoreError();
      return n.status();
    }
    bytes_read += *n;
    if (options.on_rank_written) options.on_rank_written(rank, to.ranks_size(), bytes_read);
  }
  CommitOptions commit;
  commit.env = options.env;
  commit.optimizer = source.index.optimizer();
  MUONSHARD_RETURN_IF_ERROR(CommitCheckpoint(out_dir, source.index.step(), to, to_request, commit));
  summary.set_source_step_dir(source.step_dir);
  summary.set_bytes_read(bytes_read);
  summary.set_out_step_dir(absl::StrCat(out_dir, "/", StepDirName(source.index.step())));
  return summary;
}

}  // namespace muonshard::checkpoint
