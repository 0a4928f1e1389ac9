#ifndef MUONSHARD_TESTS_COORDINATOR_SUBPROCESS_H_
#define MUONSHARD_TESTS_COORDINATOR_SUBPROCESS_H_

// Child processes for the integration tests: muonshard-coordinator started
// on 127.0.0.1 with an ephemeral port (read back from --port-file), and
// one-shot commands (muonshardctl, openssl, curl) with captured output.
// Every wait is bounded; nothing sleeps for synchronization except bounded
// polling of a file or a pid.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muonshard::testing {

// Path of a project binary: $MUONSHARD_BIN_DIR/name (set by ctest).
std::string BinaryPath(const std::string& name);

struct CommandResult {
  int exit_code = -1;  // -1: killed by a signal or timed out
  std::string out;
  std::string err;
};

// Runs argv[0] (a path) with `argv`, stdout/stderr captured in files under
// `scratch_dir`. Killed after `timeout`.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         const std::string& scratch_dir,
                                         absl::Duration timeout = absl::Seconds(60));

class CoordinatorProcess {
 public:
  // Starts muonshard-coordinator --listen 127.0.0.1:0 --data-dir data_dir
  // --metrics-port 0 plus `extra_args`, and waits (bounded) until it serves.
  // `scratch_dir` holds its port file and log.
  static absl::StatusOr<CoordinatorProcess> Start(const std::string& data_dir,
                                                  const std::string& scratch_dir,
                                                  const std::vector<std::string>& extra_args = {});
  CoordinatorProcess(CoordinatorProcess&& other) noexcept;
  CoordinatorProcess& operator=(CoordinatorProcess&&) = delete;
  ~CoordinatorProcess();  // SIGKILL and reap if still running

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  std::string address() const;  // "127.0.0.1:<port>"
  std::string Log() const;      // its stderr so far

  void Signal(int sig) const;
  // Waits for the process to exit; its exit code (-1: killed by a signal).
  absl::StatusOr<int> WaitForExit(absl::Duration timeout);

 private:
  CoordinatorProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_ = -1;
  std::string log_path_;
  int port_ = 0;
  int metrics_port_ = -1;
};

}  // namespace muonshard::testing

#endif  // MUONSHARD_TESTS_COORDINATOR_SUBPROCESS_H_
