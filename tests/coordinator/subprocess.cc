#include "tests/coordinator/subprocess.h"

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
#include <optional>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace muonshard::testing {
namespace {

constexpr absl::Duration kPoll = absl::Milliseconds(10);
constexpr absl::Duration kStartTimeout = absl::Seconds(30);

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A unique file name in `dir` for this process.
std::string ScratchFile(const std::string& dir, absl::string_view what) {
  static std::atomic<int> counter{0};
  return absl::StrCat(dir, "/", what, "-", getpid(), "-", counter.fetch_add(1));
}

absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& out_path,
                            const std::string& err_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
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

bool ParsePortFile(const std::string& text, int* grpc_port, int* metrics_port) {
  auto field = [&text](absl::string_view name, int* out) {
    size_t pos = text.find(absl::StrCat("\"", name, "\": "));
    if (pos == std::string::npos) return false;
    pos += name.size() + 4;
    size_t end = text.find_first_of(",}", pos);
    return end != std::string::npos && absl::SimpleAtoi(text.substr(pos, end - pos), out);
  };
  return field("grpc_port", grpc_port) && field("metrics_port", metrics_port);
}

}  // namespace

std::string BinaryPath(const std::string& name) {
  const char* dir = std::getenv("MUONSHARD_BIN_DIR");
  return absl::StrCat(dir != nullptr ? dir : "build/bin", "/", name);
}

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         const std::string& scratch_dir, absl::Duration timeout) {
  const std::string out_path = ScratchFile(scratch_dir, "out");
  const std::string err_path = ScratchFile(scratch_dir, "err");
  absl::StatusOr<pid_t> pid = Spawn(argv, out_path, err_path);
  if (!pid.ok()) return pid.status();
  std::optional<int> code = Reap(*pid, timeout);
  if (!code.has_value()) {
    kill(*pid, SIGKILL);
    Reap(*pid, absl::Seconds(10));
  }
  CommandResult result;
  result.exit_code = code.value_or(-1);
  result.out = ReadAll(out_path);
  result.err = ReadAll(err_path);
  return result;
}

absl::StatusOr<CoordinatorProcess> CoordinatorProcess::Start(
    const std::string& data_dir, const std::string& scratch_dir,
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
  absl::StatusOr<pid_t> pid = Spawn(argv, log + ".out", log);
  if (!pid.ok()) return pid.status();
  CoordinatorProcess process(*pid, log);
  const absl::Time deadline = absl::Now() + kStartTimeout;
  while (true) {
    if (ParsePortFile(ReadAll(port_file), &process.port_, &process.metrics_port_)) return process;
    if (std::optional<int> code = Reap(*pid, absl::ZeroDuration())) {
      process.pid_ = -1;
      return absl::InternalError(
          absl::StrCat("coordinator exited with ", *code, " before serving: ", ReadAll(log)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("coordinator not serving: ", ReadAll(log)));
    }
    absl::SleepFor(kPoll);
  }
}

CoordinatorProcess::CoordinatorProcess(CoordinatorProcess&& other) noexcept
    : pid_(other.pid_),
      log_path_(std::move(other.log_path_)),
      port_(other.port_),
      metrics_port_(other.metrics_port_) {
  other.pid_ = -1;
}

CoordinatorProcess::~CoordinatorProcess() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  Reap(pid_, absl::Seconds(10));
}

std::string CoordinatorProcess::address() const { return absl::StrCat("127.0.0.1:", port_); }

std::string CoordinatorProcess::Log() const { return ReadAll(log_path_); }

void CoordinatorProcess::Signal(int sig) const {
  if (pid_ > 0) kill(pid_, sig);
}

absl::StatusOr<int> CoordinatorProcess::WaitForExit(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("not running");
  std::optional<int> code = Reap(pid_, timeout);
  if (!code.has_value()) return absl::DeadlineExceededError("coordinator still running");
  pid_ = -1;
  return *code;
}

}  // namespace muonshard::testing
