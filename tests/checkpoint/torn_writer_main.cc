// ckpt_torn_writer: saves synthetic state of the small dense model (the one
// the checkpoint tests use) and stops at a chosen point of the save — after
// the K-th piece of a rank's file, or at a commit stage — writes one byte to
// --ready-fd and waits there to be killed. torn_save_test kills it with
// SIGKILL once the byte arrives, so the kill lands mid-write at a known
// point, never by timing.
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "checkpoint/writer.h"
#include "common/flags.h"
#include "tests/checkpoint/ckpt_test_util.h"

namespace muonshard::checkpoint {
namespace {

struct Options {
  std::string dir;
  int64_t step = 0;
  int world = 4;
  std::string pause_after_piece;  // "RANK:K"
  std::string pause_at_stage;     // a CommitOptions::on_stage name
  int ready_fd = -1;
};

[[noreturn]] void SignalAndWait(int fd) {
  const char byte = 'p';
  if (::write(fd, &byte, 1) != 1) std::_Exit(3);
  for (;;) ::pause();  // until SIGKILL
}

int Run(const Options& o) {
  auto p = testing::MakePlan(testing::SmallDenseManifest(), o.world);
  if (!p.ok()) return 2;
  auto state = testing::SyntheticState(p->plan);
  if (!state.ok()) return 2;
  int pause_rank = -1, pause_piece = -1;
  if (!o.pause_after_piece.empty()) {
    std::vector<std::string> parts = absl::StrSplit(o.pause_after_piece, ':');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &pause_rank) || !absl::SimpleAtoi(parts[1], &pause_piece)) {
      return 2;
    }
  }
  WriteOptions write;
  write.on_piece_written = [&](const WriteProgress& progress) {
    if (progress.rank == pause_rank && progress.piece == pause_piece) SignalAndWait(o.ready_fd);
  };
  const Scalars scalars = testing::SyntheticScalars(o.step);
  for (int r = 0; r < o.world; ++r) {
    RankFileTarget target{o.dir, o.step, p->plan.content_hash(), r, o.world, ""};
    absl::Status s = WriteRankFile(target, (*state)[r]->shards, scalars, write).status();
    if (!s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
  }
  CommitOptions commit;
  commit.on_stage = [&](absl::string_view stage) {
    if (stage == o.pause_at_stage) SignalAndWait(o.ready_fd);
  };
  absl::Status s = CommitCheckpoint(o.dir, o.step, p->plan, p->request, commit);
  if (!s.ok()) std::cerr << s << "\n";
  return s.ok() ? 0 : 1;
}

}  // namespace
}  // namespace muonshard::checkpoint

int main(int argc, char** argv) {
  muonshard::checkpoint::Options o;
  muonshard::FlagSet flags(
      "usage: ckpt_torn_writer --dir D --step N [--world W] (--pause-after-piece R:K | --pause-at-stage S) "
      "--ready-fd FD");
  flags.String("dir", &o.dir, "checkpoint directory");
  flags.Int("step", &o.step, "step to save");
  flags.Int("world", &o.world, "world size");
  flags.String("pause-after-piece", &o.pause_after_piece, "stop after piece K of rank R's file");
  flags.String("pause-at-stage", &o.pause_at_stage, "stop at this commit stage");
  flags.Int("ready-fd", &o.ready_fd, "descriptor to write one byte to when stopped");
  auto parsed = flags.Parse(muonshard::ArgsOf(argc, argv));
  if (!parsed.ok() || o.dir.empty() || o.ready_fd < 0) {
    std::cerr << flags.Usage();
    return 2;
  }
  return muonshard::checkpoint::Run(o);
}
