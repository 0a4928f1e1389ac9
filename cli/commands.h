#ifndef MUONSHARD_CLI_COMMANDS_H_
#define MUONSHARD_CLI_COMMANDS_H_

#include <string>
#include <vector>

namespace muonshard::cli {

// Each subcommand takes its arguments (after the subcommand name) and returns
// the process exit code.
int RunPlan(const std::vector<std::string>& args);
int RunImportHf(const std::vector<std::string>& args);
int RunImportSafetensors(const std::vector<std::string>& args);
int RunCompare(const std::vector<std::string>& args);
// Against a running coordinator (cli/coordinator_commands.cc).
int RunSubmit(const std::vector<std::string>& args);
int RunGet(const std::vector<std::string>& args);
int RunList(const std::vector<std::string>& args);
int RunWatch(const std::vector<std::string>& args);
int RunDiff(const std::vector<std::string>& args);
int RunWorkers(const std::vector<std::string>& args);
int RunHealth(const std::vector<std::string>& args);
// Sharded checkpoints (cli/ckpt_commands.cc).
int RunCkpt(const std::vector<std::string>& args);
int RunReshard(const std::vector<std::string>& args);

}  // namespace muonshard::cli

#endif  // MUONSHARD_CLI_COMMANDS_H_
