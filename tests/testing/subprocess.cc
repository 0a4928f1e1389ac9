#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/temp_dir.h"

extern char** environ;

namespace muonshard::testing {
namespace {

constexpr absl::Duration kPoll = absl::Milliseconds(10);
constexpr absl::Duration kStartTimeout = absl::Seconds(30);
constexpr absl::Duration kReapAfterKill = absl::Seconds(10);

// A unique file name in `dir` for this process.
std::string ScratchFile(const std::string& dir, absl::string_view what) {
  static std::atomic<int> counter{0};
  return absl::StrCat(dir, "/", what, "-", getpid(), "-", counter.fetch_add(1));
}

absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& out_path,
                            const std::string& err_path) {
  if (argv.empty()) return absl::InvalidArgumentError("spawn: empty argv");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("spawn ", argv[0], ": ", std::strerror(rc)));
  }
  return pid;
}

// Polls waitpid until `pid` exits or `timeout` passes; nullopt = still running.
std::optional<int> Reap(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0) return -1;
    if (absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(kPoll);
  }
}

}  // namespace

std::string BinaryPath(const std::string& name) {
  const char* dir = std::getenv("MUONSHARD_BIN_DIR");
  return absl::StrCat(dir != nullptr ? dir : "build/bin", "/", name);
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::Status PollUntil(const std::function<bool()>& ready, absl::Duration timeout, const std::string& what) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!ready()) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": not within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(kPoll);
  }
  return absl::OkStatus();
}

bool ReadJsonIntField(const std::string& text, const std::string& name, int* out) {
  size_t pos = text.find(absl::StrCat("\"", name, "\": "));
  if (pos == std::string::npos) return false;
  pos += name.size() + 4;
  size_t end = text.find_first_of(",}", pos);
  return end != std::string::npos && absl::SimpleAtoi(text.substr(pos, end - pos), out);
}

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv, const std::string& scratch_dir,
                                         absl::Duration timeout) {
  absl::StatusOr<ChildProcess> child =
      ChildProcess::Start(argv, ScratchFile(scratch_dir, "out"), ScratchFile(scratch_dir, "err"));
  if (!child.ok()) return child.status();
  absl::StatusOr<int> code = child->WaitForExit(timeout);
  child->Kill();  // no-op unless it timed out
  CommandResult result;
  result.exit_code = code.value_or(-1);
  result.out = child->Out();
  result.err = child->Err();
  return result;
}

CommandResult RunCtl(absl::string_view args, absl::Duration timeout) {
  const std::string command = absl::StrCat("'", BinaryPath("muonshardctl"), "' ", args);
  absl::StatusOr<CommandResult> result = RunCommand({"/bin/sh", "-c", command}, ProcessTempDir(), timeout);
  if (result.ok()) return *std::move(result);
  CommandResult failed;
  failed.err = std::string(result.status().message());
  return failed;
}

absl::StatusOr<ChildProcess> ChildProcess::Start(const std::vector<std::string>& argv, const std::string& out_path,
                                                 const std::string& err_path) {
  absl::StatusOr<pid_t> pid = Spawn(argv, out_path, err_path);
  if (!pid.ok()) return pid.status();
  return ChildProcess(*pid, out_path, err_path);
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_), out_path_(std::move(other.out_path_)), err_path_(std::move(other.err_path_)) {
  other.pid_ = -1;
}

ChildProcess::~ChildProcess() { Kill(); }

void ChildProcess::Signal(int sig) const {
  if (pid_ > 0) kill(pid_, sig);
}

std::optional<int> ChildProcess::TryWait() {
  if (pid_ <= 0) return std::nullopt;
  std::optional<int> code = Reap(pid_, absl::ZeroDuration());
  if (code.has_value()) pid_ = -1;
  return code;
}

absl::StatusOr<int> ChildProcess::WaitForExit(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("not running");
  std::optional<int> code = Reap(pid_, timeout);
  if (!code.has_value()) {
    return absl::DeadlineExceededError(
        absl::StrCat("process ", pid_, " still running after ", absl::FormatDuration(timeout)));
  }
  pid_ = -1;
  return *code;
}

void ChildProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  Reap(pid_, kReapAfterKill);
  pid_ = -1;
}

absl::StatusOr<CoordinatorProcess> CoordinatorProcess::Start(const std::string& data_dir,
                                                             const std::string& scratch_dir,
                                                             const std::vector<std::string>& extra_args) {
  const std::string port_file = ScratchFile(scratch_dir, "port");
  std::vector<std::string> argv = {BinaryPath("muonshard-coordinator"),
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--data-dir",
                                   data_dir,
                                   "--metrics-port",
                                   "0",
                                   "--port-file",
                                   port_file};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  const std::string log = ScratchFile(scratch_dir, "coordinator-log");
  absl::StatusOr<ChildProcess> child = ChildProcess::Start(argv, log + ".out", log);
  if (!child.ok()) return child.status();
  CoordinatorProcess process(*std::move(child));
  const absl::Time deadline = absl::Now() + kStartTimeout;
  while (true) {
    const std::string ports = ReadFileOrEmpty(port_file);
    if (ReadJsonIntField(ports, "grpc_port", &process.port_) &&
        ReadJsonIntField(ports, "metrics_port", &process.metrics_port_)) {
      return process;
    }
    if (std::optional<int> code = process.process_.TryWait()) {
      return absl::InternalError(absl::StrCat("coordinator exited with ", *code, " before serving: ", process.Log()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("coordinator not serving: ", process.Log()));
    }
    absl::SleepFor(kPoll);
  }
}

std::string CoordinatorProcess::address() const { return absl::StrCat("127.0.0.1:", port_); }

absl::StatusOr<int> CoordinatorProcess::WaitForExit(absl::Duration timeout) {
  absl::StatusOr<int> code = process_.WaitForExit(timeout);
  if (!code.ok() && code.status().code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::DeadlineExceededError("coordinator still running");
  }
  return code;
}

}  // namespace muonshard::testing
