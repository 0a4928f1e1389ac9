// muonshardctl's command line: FlagSet (common/flags.h), which every
// subcommand and binary parses its arguments with, and the plan flags that
// `plan`, `submit` and `compare` share (cli::PlanFlags). The input is the
// argument list, arguments separated by NUL bytes (argv cannot hold one).
//
// The flag set registers every kind of flag the binaries use: string, int
// (32 and 64 bit), double, bool, repeatable list, with the CLI's names. On
// arguments that parse, what the commands do next runs: the usage text,
// --output and --policy checks and PlanFlags::ToRequest, whose --manifest is
// pointed at a small manifest this target writes at start-up (the flag's
// value is the input's; the file read is not what is fuzzed).
// Checked: no more positional arguments than arguments; a request built
// from the flags keeps their world size and exclude patterns.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/cli_common.h"
#include "common/flags.h"
#include "fuzz/fuzz_util.h"

namespace {

std::string* manifest_path = nullptr;

void WriteManifest() {
  char dir[] = "/tmp/muonshard-cli-flags-fuzz-XXXXXX";
  if (mkdtemp(dir) == nullptr) std::abort();
  manifest_path = new std::string(absl::StrCat(dir, "/m.json"));
  FILE* f = std::fopen(manifest_path->c_str(), "w");
  if (f == nullptr) std::abort();
  std::fputs(R"({"model": "fuzz", "tensors": [)"
             R"({"name": "model.layers.0.mlp.up_proj.weight", "shape": [64, 32], "dtype": "BF16"},)"
             R"({"name": "model.norm.weight", "shape": [32], "dtype": "FP32"}]})",
             f);
  std::fclose(f);
  static std::string dir_copy = dir;
  std::atexit([] {
    unlink(manifest_path->c_str());
    rmdir(dir_copy.c_str());
  });
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  muonshard::fuzz::SilenceProtobufLogs();
  WriteManifest();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muonshard;  // NOLINT: a fuzz entry point
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> args;
  if (!input.empty()) args = absl::StrSplit(input, absl::ByChar('\0'));
  if (args.size() > 256) return 0;

  FlagSet flags("usage: muonshardctl fuzz [flags]");
  cli::PlanFlags plan;
  plan.Register(flags);
  std::string output = "table";
  std::string coordinator;
  int64_t version = 0;
  int rank = -1;
  double timeout = 10;
  bool dry_run = false;
  std::vector<std::string> exclude;
  flags.String("output", &output, "json | table");
  flags.String("coordinator", &coordinator, "host:port");
  flags.Int("version", &version, "plan version");
  flags.Int("rank", &rank, "one rank's view");
  flags.Double("timeout", &timeout, "seconds");
  flags.Bool("dry_run", &dry_run, "plan only");
  flags.StringList("muon-exclude", &exclude, "regexes");

  auto positional = flags.Parse(args);
  if (!positional.ok()) return 0;
  FUZZ_CHECK(positional->size() <= args.size(), "more positional arguments than arguments");
  for (const char* name :
       {"manifest", "world-size", "pp", "ep", "policy", "comm-buffer-mb", "ns-steps", "per-dtype", "exclude", "output",
        "coordinator", "version", "rank", "timeout", "dry-run", "muon-exclude"}) {
    (void)flags.WasSet(name);
  }
  (void)flags.Usage();
  (void)cli::CheckOutputFormat(output);
  (void)cli::ParsePolicy(plan.policy);
  if (!plan.manifest.empty()) plan.manifest = *manifest_path;
  auto request = plan.ToRequest();
  if (request.ok()) {
    FUZZ_CHECK(request->topology().world_size() == plan.world_size, "world size lost");
    FUZZ_CHECK(request->policy().muon_exclude_patterns_size() == static_cast<int>(plan.exclude.size()),
               "exclude patterns lost");
  }
  return 0;
}
