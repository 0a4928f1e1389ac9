#ifndef MUONSHARD_CLI_SIMULATE_COMMAND_H_
#define MUONSHARD_CLI_SIMULATE_COMMAND_H_

#include <string>
#include <vector>

namespace muonshard::cli {

// `muonshardctl simulate`: a plan's optimizer step predicted on a cluster
// (sim/, docs/simulator.md): per rank each phase, the sequential and the
// pipelined step, the critical path, bytes per link class; as a table or
// JSON, and an SVG timeline. Returns the exit code (2 on bad input).
int RunSimulate(const std::vector<std::string>& args);

}  // namespace muonshard::cli

#endif  // MUONSHARD_CLI_SIMULATE_COMMAND_H_
