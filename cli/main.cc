// muonshardctl: plans, manifests and (with --coordinator) the running service.
#include <iostream>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "cli/commands.h"

namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

const Command kCommands[] = {
    {"plan", "compute a partition plan locally and print it", muonshard::cli::RunPlan},
    {"import-hf", "build a manifest from a HuggingFace config.json", muonshard::cli::RunImportHf},
    {"import-safetensors", "build a manifest from a safetensors checkpoint's headers",
     muonshard::cli::RunImportSafetensors},
    {"compare", "seed vs balanced plans of a manifest, side by side", muonshard::cli::RunCompare},
    {"submit", "submit a plan request to the coordinator", muonshard::cli::RunSubmit},
    {"get", "print a stored plan, or one rank's view", muonshard::cli::RunGet},
    {"list", "list the coordinator's plan versions", muonshard::cli::RunList},
    {"watch", "stream new plan versions and job events", muonshard::cli::RunWatch},
    {"diff", "tensors that change owner or slice between two versions", muonshard::cli::RunDiff},
    {"workers", "list jobs and their workers", muonshard::cli::RunWorkers},
    {"health", "check the coordinator's grpc.health.v1 status", muonshard::cli::RunHealth},
    {"ckpt", "inspect a sharded checkpoint: summary and integrity check", muonshard::cli::RunCkpt},
    {"reshard", "reshard a checkpoint to another topology (or --dry-run)", muonshard::cli::RunReshard},
};

void PrintUsage(std::ostream& out) {
  out << "usage: muonshardctl COMMAND [flags]   (muonshardctl COMMAND --help for its flags)\n\n"
         "commands:\n";
  for (const Command& c : kCommands) out << "  " << c.name << "\t" << c.summary << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    PrintUsage(std::cerr);
    return muonshard::cli::kExitUsage;
  }
  if (args[0] == "--help" || args[0] == "help" || args[0] == "-h") {
    PrintUsage(std::cout);
    return muonshard::cli::kExitOk;
  }
  for (const Command& c : kCommands) {
    if (args[0] == c.name) return c.run(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  std::cerr << "error: unknown command \"" << args[0] << "\"\n\n";
  PrintUsage(std::cerr);
  return muonshard::cli::kExitUsage;
}
