// `muonshardctl ckpt inspect` and `muonshardctl reshard`: sharded optimizer
// checkpoints (checkpoint/README.md) — summary and full integrity check, and
// resharding to another topology (dry run: the transfer matrix and the bytes
// a load would read).
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/index.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "checkpoint/reshard_plan.h"
#include "checkpoint/verify.h"
#include "cli/cli_common.h"
#include "cli/commands.h"
#include "common/quote.h"
#include "plan/planner.h"

namespace muonshard::cli {
namespace {

// Transfer matrices up to this many ranks a side print as a grid; larger
// ones as the list of non-zero pairs.
constexpr int kMaxGridRanks = 16;

std::string Grouped(int64_t n) {
  std::string digits = absl::StrCat(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string TopologyText(const v1::Topology& t) {
  return absl::StrFormat("world %d (pp %d, ep %d)", t.world_size(), t.pp(), t.ep());
}

// Bad input (a directory without a checkpoint, an unknown step) exits 2;
// damage (DATA_LOSS) and I/O failures exit 1.
absl::Status AsInputError(const absl::Status& s) {
  if (absl::IsNotFound(s)) return absl::InvalidArgumentError(s.message());
  return s;
}

absl::StatusOr<checkpoint::Checkpoint> Open(const std::string& dir, int64_t step) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint directory \"", dir, "\" does not exist"));
  }
  auto opened = checkpoint::OpenCheckpoint(dir, step >= 0 ? std::optional<int64_t>(step) : std::nullopt);
  if (!opened.ok()) return AsInputError(opened.status());
  return opened;
}

// ---- ckpt inspect ----

void PrintInspectTable(const v1::CheckpointSummary& s, std::ostream& out) {
  out << absl::StrFormat("%-12s %s (step %d)\n", "checkpoint", s.step_dir(), s.step());
  out << absl::StrFormat("%-12s %s, %d tensors\n", "model", s.model(), s.tensors());
  out << absl::StrFormat("%-12s %s (version %d), policy %s\n", "plan", s.plan_hash(), s.plan_version(),
                         v1::Policy_Name(s.policy().policy()));
  out << absl::StrFormat("%-12s %s\n", "topology", TopologyText(s.topology()));
  out << absl::StrFormat("%-12s beta1^t %.9g, beta2^t %.9g\n", "scalars", s.scalars().beta1_pow(),
                         s.scalars().beta2_pow());
  out << absl::StrFormat("%-12s %d files, %s bytes (optimizer state %s bytes)\n", "size", s.ranks_size(),
                         Grouped(s.file_bytes()), Grouped(s.state_bytes()));
  out << absl::StrFormat("%-12s %s\n", "integrity",
                         s.verified()
                             ? "OK: metadata sha256; size, crc32, header and every piece's chunk crc32 of every file"
                             : "not checked");
  out << absl::StrFormat("\n%6s  %-34s %16s %16s %7s\n", "rank", "file", "file_bytes", "state_bytes", "pieces");
  for (const v1::CheckpointSummary::RankBytes& r : s.ranks()) {
    out << absl::StrFormat("%6d  %-34s %16s %16s %7d\n", r.rank(), r.file(), Grouped(r.file_bytes()),
                           Grouped(r.state_bytes()), r.pieces());
  }
}

int RunInspect(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl ckpt inspect DIR [--step N] [--output table|json]\n"
      "Summary, per-rank bytes and a full integrity check of the sharded checkpoint in DIR.");
  int64_t step = -1;
  std::string output = "table";
  flags.Int("step", &step, "step to inspect (default: the one DIR/latest names)");
  flags.String("output", &output, "table | json");
  std::vector<std::string> positional;
  if (int rc = ParseFlagsOrExit(flags, args, &positional); rc >= 0) return rc;
  if (positional.size() != 1) return UsageError(flags, "ckpt inspect takes one checkpoint DIR");
  if (absl::Status s = CheckOutputFormat(output); !s.ok()) return ReportError(s);
  auto opened = Open(positional[0], step);
  if (!opened.ok()) return ReportError(opened.status());
  std::cerr << "ckpt inspect: verifying " << opened->index.files_size() << " files of " << opened->step_dir << "\n";
  auto summary = checkpoint::VerifyCheckpoint(*opened);
  if (!summary.ok()) return ReportError(summary.status());
  if (output == "json") return PrintJson(*summary);
  PrintInspectTable(*summary, std::cout);
  return kExitOk;
}

// ---- reshard ----

struct ReshardFlags {
  std::string checkpoint;  // DIR, the first argument (--checkpoint: deprecated)
  int64_t step = -1;
  int world_size = 0;
  int pp = 0;
  int ep = 0;
  int tp = 0;
  std::string policy;
  std::string out;
  std::string key_style;
  bool dry_run = false;
  std::string output = "table";

  void Register(FlagSet& flags) {
    flags.String("checkpoint", &checkpoint, "checkpoint directory to read");
    flags.Deprecate("checkpoint", "pass the checkpoint directory as the first argument");
    flags.Int("step", &step, "step to read (default: the one DIR/latest names)");
    flags.Int("world-size", &world_size, "world size of the new layout");
    flags.Required("world-size");
    flags.Alias("to-world-size", "world-size");
    flags.Int("pp", &pp, "pipeline stages of the new layout (default: the checkpoint's)");
    flags.Int("ep", &ep, "expert parallel degree of the new layout (default: the checkpoint's)");
    flags.Int("tp", &tp, "tensor parallel degree of the new layout (default: the checkpoint's)");
    flags.String("policy", &policy, "seed | seed-all | balanced (default: the checkpoint's)");
    flags.String("out", &out, "checkpoint directory to write (required without --dry-run)");
    flags.String("key-style", &key_style, "structured | paddle (default: the checkpoint's)");
    flags.Bool("dry-run", &dry_run, "print the transfer matrix and bytes read; write nothing");
    flags.String("output", &output, "table | json");
  }

  // DIR from the arguments, or from the deprecated --checkpoint.
  absl::Status TakeDir(const std::vector<std::string>& positional) {
    if (positional.size() > 1 || (positional.size() == 1 && !checkpoint.empty())) {
      return absl::InvalidArgumentError("reshard takes one checkpoint DIR");
    }
    if (positional.size() == 1) checkpoint = positional[0];
    if (checkpoint.empty()) return absl::InvalidArgumentError("reshard needs the checkpoint DIR to read");
    return absl::OkStatus();
  }

  absl::Status Check() const {
    if (world_size <= 0) return absl::InvalidArgumentError("flag --world-size must be >= 1");
    if (!dry_run && out.empty()) return absl::InvalidArgumentError("flag --out is required without --dry-run");
    if (!key_style.empty()) {
      if (absl::Status s = checkpoint::ParseKeyStyle(key_style).status(); !s.ok()) return s;
    }
    return CheckOutputFormat(output);
  }
};

// A resharded checkpoint of the same step next to its source would replace
// it (or need a second naming scheme); a separate root keeps `latest` simple.
absl::Status CheckOutDir(const std::string& source, const std::string& out) {
  std::error_code ec;
  if (std::filesystem::exists(out, ec) && std::filesystem::equivalent(source, out, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out \"", out, "\" is the source checkpoint directory; write the reshard elsewhere"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::PlanRequest> NewRequest(const checkpoint::Checkpoint& c, const FlagSet& flags,
                                           const ReshardFlags& f) {
  v1::Topology topology = c.request.topology();
  topology.set_world_size(f.world_size);
  if (flags.WasSet("pp")) topology.set_pp(f.pp);
  if (flags.WasSet("ep")) topology.set_ep(f.ep);
  if (flags.WasSet("tp")) topology.set_tp(f.tp);
  std::optional<v1::Policy> policy;
  if (!f.policy.empty()) {
    auto p = ParsePolicy(f.policy);
    if (!p.ok()) return p.status();
    policy = *p;
  }
  return checkpoint::RequestForTopology(c.request, topology, policy);
}

void PrintGrid(const v1::ReshardSummary& s, std::ostream& out) {
  std::map<std::pair<int, int>, int64_t> cells;
  for (const v1::RankTransferBytes& t : s.transfers()) cells[{t.from(), t.to()}] = t.bytes();
  const int rows = s.from_topology().world_size();
  const int cols = s.to_topology().world_size();
  int width = 3;
  for (const auto& [key, bytes] : cells) width = std::max<int>(width, Grouped(bytes).size());
  out << absl::StrFormat("%-10s", "old\\new");
  for (int c = 0; c < cols; ++c) out << absl::StrFormat(" %*d", width, c);
  out << "\n";
  for (int r = 0; r < rows; ++r) {
    out << absl::StrFormat("%-10d", r);
    for (int c = 0; c < cols; ++c) {
      auto it = cells.find({r, c});
      out << absl::StrFormat(" %*s", width, it == cells.end() ? "." : Grouped(it->second));
    }
    out << "\n";
  }
}

void PrintReshardTable(const v1::ReshardSummary& s, std::ostream& out) {
  out << absl::StrFormat("%-12s %s (step %d): %s, plan %s\n", "checkpoint", s.source_step_dir(), s.step(),
                         TopologyText(s.from_topology()), s.from_plan_hash());
  out << absl::StrFormat("%-12s %s, policy %s, plan %s\n", "new layout", TopologyText(s.to_topology()),
                         v1::Policy_Name(s.to_policy().policy()), s.to_plan_hash());
  const double moved = s.state_bytes() > 0 ? 100.0 * s.moved_bytes() / s.state_bytes() : 0.0;
  out << absl::StrFormat("%-12s %s bytes; %s bytes (%.1f%%) change rank\n", "state", Grouped(s.state_bytes()),
                         Grouped(s.moved_bytes()), moved);
  out << absl::StrFormat("%-12s %s bytes%s\n", "total read", Grouped(s.bytes_read()),
                         s.out_step_dir().empty() ? " (state widened to checksum chunks)"
                                                  : " (headers and checksum-chunk widening included)");
  if (!s.out_step_dir().empty()) out << absl::StrFormat("%-12s %s\n", "written", s.out_step_dir());
  out << "\ntransfer matrix: bytes of optimizer state, old rank -> new rank\n";
  if (s.from_topology().world_size() <= kMaxGridRanks && s.to_topology().world_size() <= kMaxGridRanks) {
    PrintGrid(s, out);
    return;
  }
  out << absl::StrFormat("%8s %8s %16s\n", "old", "new", "bytes");
  for (const v1::RankTransferBytes& t : s.transfers()) {
    out << absl::StrFormat("%8d %8d %16s\n", t.from(), t.to(), Grouped(t.bytes()));
  }
}

int Reshard(const checkpoint::Checkpoint& source, const v1::Plan& to, const v1::PlanRequest& request,
            const ReshardFlags& f) {
  if (absl::Status s = CheckOutDir(source.root, f.out); !s.ok()) return ReportError(s);
  checkpoint::ReshardOptions options;
  if (!f.key_style.empty()) options.key_style = *checkpoint::ParseKeyStyle(f.key_style);
  options.on_rank_written = [](int rank, int world, int64_t bytes_read) {
    std::cerr << "reshard: rank " << rank + 1 << "/" << world << " written, " << Grouped(bytes_read) << " bytes read\n";
  };
  auto summary = checkpoint::ReshardCheckpoint(source, to, request, f.out, options);
  if (!summary.ok()) return ReportError(summary.status());
  if (f.output == "json") return PrintJson(*summary);
  PrintReshardTable(*summary, std::cout);
  return kExitOk;
}

}  // namespace

int RunCkpt(const std::vector<std::string>& args) {
  static constexpr char kUsage[] =
      "usage: muonshardctl ckpt inspect DIR [--step N] [--output table|json]\n"
      "  summary, per-rank bytes and a full integrity check of a sharded checkpoint\n";
  if (!args.empty() && args[0] == "inspect") return RunInspect(std::vector<std::string>(args.begin() + 1, args.end()));
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h" || args[0] == "help")) {
    std::cout << kUsage;
    return kExitOk;
  }
  if (args.empty()) {
    std::cerr << "error: ckpt needs a subcommand\n" << kUsage;
    return kExitUsage;
  }
  std::string message = absl::StrCat("error: unknown ckpt subcommand ", QuoteBounded(args[0]));
  if (ClosestMatch(args[0], {"inspect"}) == "inspect") absl::StrAppend(&message, " (did you mean \"inspect\"?)");
  std::cerr << message << "\nrun 'muonshardctl ckpt --help' for usage\n";
  return kExitUsage;
}

int RunReshard(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl reshard DIR --world-size M [--pp P] [--ep E] [--tp T]\n"
      "         [--policy seed|seed-all|balanced] [--step N] (--dry-run | --out DIR2) [--output table|json]\n"
      "Reshards the checkpoint in DIR (as `ckpt inspect DIR`) to the new layout. The spellings of 0.1\n"
      "(--checkpoint DIR, --to-world-size M) still work in this release, with a warning.");
  ReshardFlags f;
  f.Register(flags);
  std::vector<std::string> positional;
  if (int rc = ParseFlagsOrExit(flags, args, &positional); rc >= 0) return rc;
  if (absl::Status s = f.TakeDir(positional); !s.ok()) return UsageError(flags, s.message());
  if (absl::Status s = f.Check(); !s.ok()) return ReportError(s);
  auto source = Open(f.checkpoint, f.step);
  if (!source.ok()) return ReportError(source.status());
  auto request = NewRequest(*source, flags, f);
  if (!request.ok()) return ReportError(request.status());
  auto plan = planner::ComputePlan(*request);
  if (!plan.ok()) return ReportError(plan.status());
  if (absl::Status s = checkpoint::CheckCompatible(source->index, *plan); !s.ok()) return ReportError(s);
  if (!f.dry_run) return Reshard(*source, *plan, *request, f);
  auto summary = checkpoint::SummarizeReshard(source->index, source->plan, *plan);
  if (!summary.ok()) return ReportError(summary.status());
  summary->set_source_step_dir(source->step_dir);
  if (f.output == "json") return PrintJson(*summary);
  PrintReshardTable(*summary, std::cout);
  return kExitOk;
}

}  // namespace muonshard::cli
