#ifndef MUONSHARD_TESTS_TESTING_SUBPROCESS_H_
#define MUONSHARD_TESTS_TESTING_SUBPROCESS_H_

// Child processes for the integration tests: one-shot commands (muonshardctl,
// openssl, curl) with captured output, long-running children (workers) with
// their output in files, and muonshard-coordinator started on 127.0.0.1 with
// an ephemeral port (read back from --port-file). Every wait is bounded;
// nothing sleeps for synchronization except bounded polling of a file or a
// pid. A child still running when its object goes away is killed (SIGKILL)
// and reaped, so a failing test never leaves processes behind.
//
// Thread-compatible: one thread per object.

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace muonshard::testing {

// Path of a project binary: $MUONSHARD_BIN_DIR/name (set by ctest).
std::string BinaryPath(const std::string& name);

// The whole content of `path` ("" when it cannot be read).
std::string ReadFileOrEmpty(const std::string& path);

// Polls `ready` every few milliseconds until it returns true or `timeout`
// passes. DEADLINE_EXCEEDED names `what`.
absl::Status PollUntil(const std::function<bool()>& ready, absl::Duration timeout, const std::string& what);

struct CommandResult {
  int exit_code = -1;  // -1: killed by a signal or timed out
  std::string out;
  std::string err;
};

// Runs argv[0] (a path) with `argv`, stdout/stderr captured in files under
// `scratch_dir`. Killed after `timeout`.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv, const std::string& scratch_dir,
                                         absl::Duration timeout = absl::Seconds(60));

// `muonshardctl <args>` (BinaryPath) through /bin/sh, so `args` is shell
// text: the caller quotes what needs it, and redirections work. Output
// captured in the process's temp dir; killed after `timeout`. A shell that
// cannot be started is exit_code -1 with the reason in `err`.
CommandResult RunCtl(absl::string_view args, absl::Duration timeout = absl::Seconds(120));

// A running child process whose stdout and stderr go to files.
class ChildProcess {
 public:
  // Starts argv[0] (a path) with `argv`; stdin is /dev/null.
  static absl::StatusOr<ChildProcess> Start(const std::vector<std::string>& argv, const std::string& out_path,
                                            const std::string& err_path);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&&) = delete;
  ~ChildProcess();  // SIGKILL and reap if still running

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  std::string Out() const { return ReadFileOrEmpty(out_path_); }
  std::string Err() const { return ReadFileOrEmpty(err_path_); }

  void Signal(int sig) const;
  // The exit code if the child has exited (-1: killed by a signal); nothing
  // while it runs. Reaps it.
  std::optional<int> TryWait();
  // Waits for the child to exit; its exit code (-1: killed by a signal).
  // DEADLINE_EXCEEDED when it still runs after `timeout` (it keeps running).
  absl::StatusOr<int> WaitForExit(absl::Duration timeout);
  // SIGKILL and reap; no-op when it has exited.
  void Kill();

 private:
  ChildProcess(pid_t pid, std::string out_path, std::string err_path)
      : pid_(pid), out_path_(std::move(out_path)), err_path_(std::move(err_path)) {}
  pid_t pid_ = -1;
  std::string out_path_;
  std::string err_path_;
};

class CoordinatorProcess {
 public:
  // Starts muonshard-coordinator --listen 127.0.0.1:0 --data-dir data_dir
  // --metrics-port 0 plus `extra_args`, and waits (bounded) until it serves.
  // `scratch_dir` holds its port file and log.
  static absl::StatusOr<CoordinatorProcess> Start(const std::string& data_dir, const std::string& scratch_dir,
                                                  const std::vector<std::string>& extra_args = {});
  CoordinatorProcess(CoordinatorProcess&& other) noexcept = default;
  CoordinatorProcess& operator=(CoordinatorProcess&&) = delete;
  ~CoordinatorProcess() = default;  // the child is killed and reaped

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  std::string address() const;                        // "127.0.0.1:<port>"
  std::string Log() const { return process_.Err(); }  // its stderr so far

  void Signal(int sig) const { process_.Signal(sig); }
  // Waits for the process to exit; its exit code (-1: killed by a signal).
  absl::StatusOr<int> WaitForExit(absl::Duration timeout);

 private:
  explicit CoordinatorProcess(ChildProcess process) : process_(std::move(process)) {}
  ChildProcess process_;
  int port_ = 0;
  int metrics_port_ = -1;
};

// Reads an integer field `"name": N` of a small JSON object (the port files
// the binaries write); false when absent or not an integer.
bool ReadJsonIntField(const std::string& text, const std::string& name, int* out);

}  // namespace muonshard::testing

#endif  // MUONSHARD_TESTS_TESTING_SUBPROCESS_H_
