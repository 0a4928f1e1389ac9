// muonshardctl as an operator meets it (kubectl is the model): flags before
// the command, the environment, the default port, --version on every
// binary, one-line usage errors with suggestions, required flags, the
// aligned command list and bash completion. The real binaries, as processes.
#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace muonshard {
namespace {

using ::muonshard::testing::BinaryPath;
using ::muonshard::testing::CommandResult;
using ::muonshard::testing::CoordinatorProcess;
using ::muonshard::testing::IsOk;
using ::testing::HasSubstr;
using ::testing::Not;

// Nothing listens on port 1 of loopback: connecting fails at once.
constexpr char kNoServer[] = "127.0.0.1:1";

class CliUsageTest : public ::testing::Test {
 protected:
  // `program args...` with `env` ("NAME=value") added to the environment.
  CommandResult Run(const std::string& program, const std::vector<std::string>& args,
                    const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {"/usr/bin/env"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.push_back(BinaryPath(program));
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = testing::RunCommand(argv, dir_.path());
    EXPECT_THAT(r.status(), IsOk());
    return r.ok() ? *r : CommandResult();
  }

  CommandResult Ctl(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    return Run("muonshardctl", args, env);
  }

  // Runs `script` in bash with the completion script loaded.
  CommandResult Bash(const std::string& script) {
    const std::string completion = dir_.Join("completion.bash");
    auto r = testing::RunCommand({"/bin/bash", "-c",
                                  absl::StrCat("'", BinaryPath("muonshardctl"), "' completion bash > '", completion,
                                               "' && source '", completion, "' && ", script)},
                                 dir_.path());
    EXPECT_THAT(r.status(), IsOk());
    return r.ok() ? *r : CommandResult();
  }

  // Completions of the command line `words` (the last word is completed).
  std::string Complete(const std::string& words) {
    CommandResult r = Bash(absl::StrCat("COMP_WORDS=(", words, "); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); ",
                                        "_muonshardctl; echo \"${COMPREPLY[*]}\""));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return std::string(absl::StripSuffix(r.out, "\n"));
  }

  void StartCoordinator() {
    auto p = CoordinatorProcess::Start(dir_.Join("data"), dir_.path());
    ASSERT_THAT(p.status(), IsOk());
    server_ = std::make_unique<CoordinatorProcess>(*std::move(p));
  }

  testing::TempDir dir_;
  std::unique_ptr<CoordinatorProcess> server_;
};

// ---------------------------------------------------------------- 1. global flags

TEST_F(CliUsageTest, FlagsBeforeTheCommand_AreTheCommands) {
  StartCoordinator();
  CommandResult before = Ctl({"--coordinator", server_->address(), "--output", "json", "list"});
  EXPECT_EQ(before.exit_code, 0) << before.err;
  CommandResult after = Ctl({"list", "--coordinator", server_->address(), "--output", "json"});
  EXPECT_EQ(after.exit_code, 0) << after.err;
  EXPECT_EQ(before.out, after.out);
  CommandResult equals = Ctl({absl::StrCat("--coordinator=", server_->address()), "health"});
  EXPECT_EQ(equals.exit_code, 0) << equals.err;
  EXPECT_EQ(equals.out, "SERVING\n");
}

TEST_F(CliUsageTest, FlagBeforeTheCommandThatItDoesNotTake_IsItsUnknownFlag) {
  CommandResult r = Ctl({"--manifest", "m.json", "list"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "error: unknown flag --manifest\nrun 'muonshardctl list --help' for usage\n");
  CommandResult typo = Ctl({"--polcy", "seed", "plan"});
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_THAT(typo.err, HasSubstr("unknown flag --polcy (did you mean --policy?)\nrun 'muonshardctl plan --help'"));
  // After a subcommand: `ckpt inspect` gets --output.
  CommandResult sub = Ctl({"--output", "yaml", "ckpt", "inspect", dir_.path()});
  EXPECT_EQ(sub.exit_code, 2);
  EXPECT_THAT(sub.err, HasSubstr("flag --output: \"yaml\""));
  CommandResult none = Ctl({"--coordinator", kNoServer});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.err, HasSubstr("error: no command given"));
}

// ---------------------------------------------------------------- 2. environment

TEST_F(CliUsageTest, Environment_SuppliesConnectionFlags_FlagsWin) {
  StartCoordinator();
  const std::string env_coordinator = absl::StrCat("MUONSHARD_COORDINATOR=", server_->address());
  CommandResult from_env = Ctl({"health"}, {env_coordinator});
  EXPECT_EQ(from_env.exit_code, 0) << from_env.err;
  EXPECT_EQ(from_env.out, "SERVING\n");
  CommandResult flag_wins =
      Ctl({"health", "--coordinator", server_->address()}, {absl::StrCat("MUONSHARD_COORDINATOR=", kNoServer)});
  EXPECT_EQ(flag_wins.exit_code, 0) << flag_wins.err;
  CommandResult env_used = Ctl({"list", "--timeout", "10"}, {absl::StrCat("MUONSHARD_COORDINATOR=", kNoServer)});
  EXPECT_EQ(env_used.exit_code, 1);
  EXPECT_THAT(env_used.err, HasSubstr(absl::StrCat("coordinator ", kNoServer, ": ")));
  // The token and TLS files, named after their flags.
  const std::string missing = dir_.Join("missing.pem");
  for (const auto& [variable, flag] : std::vector<std::pair<std::string, std::string>>{
           {"MUONSHARD_TOKEN_FILE", "--token-file"}, {"MUONSHARD_TLS_CA", "--tls-ca"}}) {
    CommandResult r = Ctl({"list"}, {env_coordinator, absl::StrCat(variable, "=", missing)});
    EXPECT_EQ(r.exit_code, 2) << variable;
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("flag ", flag, ": "))) << variable;
    EXPECT_THAT(r.err, HasSubstr("missing.pem")) << variable;
  }
  CommandResult cert = Ctl({"list"}, {env_coordinator, "MUONSHARD_TLS_CERT=c.pem", "MUONSHARD_TLS_KEY=k.pem"});
  EXPECT_EQ(cert.exit_code, 2);
  EXPECT_THAT(cert.err, HasSubstr("flags --tls-cert/--tls-key need --tls-ca"));
  CommandResult help = Ctl({"list", "--help"});
  for (const char* variable : {"MUONSHARD_COORDINATOR", "MUONSHARD_TOKEN_FILE", "MUONSHARD_TLS_CA",
                               "MUONSHARD_TLS_CERT", "MUONSHARD_TLS_KEY"}) {
    EXPECT_THAT(help.out, HasSubstr(variable));
  }
}

// ---------------------------------------------------------------- 3. default port

TEST_F(CliUsageTest, HostWithoutPort_DialsTheCoordinatorsDefaultPort) {
  CommandResult r = Ctl({"health", "--coordinator", "localhost", "--timeout", "10"});
  if (r.exit_code == 0) GTEST_SKIP() << "a coordinator serves on localhost:50051 here";
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("coordinator localhost:50051: "));
  CommandResult v6 = Ctl({"health", "--coordinator", "[::1]", "--timeout", "10"});
  if (v6.exit_code != 0) {
    EXPECT_THAT(v6.err, HasSubstr("coordinator [::1]:50051: "));
  }
  CommandResult port = Ctl({"health", "--coordinator", kNoServer, "--timeout", "10"});
  EXPECT_EQ(port.exit_code, 1);
  EXPECT_THAT(port.err, HasSubstr(absl::StrCat("coordinator ", kNoServer, ": ")));
  // What the coordinator listens on by default.
  CommandResult coordinator = Run("muonshard-coordinator", {"--help"});
  EXPECT_THAT(coordinator.out, HasSubstr("(default: 127.0.0.1:50051)"));
}

// ---------------------------------------------------------------- 4. --version

TEST_F(CliUsageTest, Version_OnEveryBinary) {
  for (const char* program : {"muonshardctl", "muonshard-coordinator", "muonshard-worker", "muonshard-compare-params",
                              "muonshard-loadgen", "muonshard-scale-manifest"}) {
    CommandResult r = Run(program, {"--version"});
    EXPECT_EQ(r.exit_code, 0) << program << ": " << r.err;
    const std::regex line(absl::StrCat(program, R"( \d+\.\d+\.\d+ \(git ([0-9a-f]{7,}|unknown)\)\n)"));
    EXPECT_TRUE(std::regex_match(r.out, line)) << program << ": " << r.out;
  }
  const std::string version = Ctl({"--version"}).out;
  EXPECT_EQ(Ctl({"version"}).out, version);
  EXPECT_EQ(Ctl({"list", "--version"}).out, version);
  // `get --version V` stays the plan version.
  CommandResult get = Ctl({"get", "--version"});
  EXPECT_EQ(get.exit_code, 2);
  EXPECT_THAT(get.err, HasSubstr("flag --version needs a value"));
}

// ---------------------------------------------------------------- 5. usage errors

TEST_F(CliUsageTest, UnknownFlag_OneLineWithASuggestion) {
  CommandResult r = Ctl({"plan", "--polcy", "seed"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "error: unknown flag --polcy (did you mean --policy?)\n"
            "run 'muonshardctl plan --help' for usage\n");
  EXPECT_EQ(r.out, "");
  CommandResult dash = Ctl({"plan", "--manifest", "m.json", "--world-size", "2", "-w", "4"});
  EXPECT_EQ(dash.exit_code, 2);
  EXPECT_THAT(dash.err, HasSubstr("error: unknown flag -w\n"));
  CommandResult inspect = Ctl({"ckpt", "inspect", "--stpe", "3", "d"});
  EXPECT_EQ(inspect.exit_code, 2);
  EXPECT_EQ(inspect.err,
            "error: unknown flag --stpe (did you mean --step?)\n"
            "run 'muonshardctl ckpt inspect --help' for usage\n");
}

TEST_F(CliUsageTest, UnknownCommand_OneLineWithASuggestion) {
  CommandResult r = Ctl({"lsit"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "error: unknown command \"lsit\" (did you mean \"list\"?)\nrun 'muonshardctl --help' for usage\n");
  CommandResult far = Ctl({"frobnicate"});
  EXPECT_EQ(far.exit_code, 2);
  EXPECT_EQ(far.err, "error: unknown command \"frobnicate\"\nrun 'muonshardctl --help' for usage\n");
  CommandResult sub = Ctl({"ckpt", "inspcet"});
  EXPECT_EQ(sub.exit_code, 2);
  EXPECT_THAT(sub.err, HasSubstr("unknown ckpt subcommand \"inspcet\" (did you mean \"inspect\"?)"));
}

// ---------------------------------------------------------------- 6. required flags

TEST_F(CliUsageTest, RequiredFlags_NamedInHelpAndWhenMissing) {
  CommandResult none = Ctl({"plan"});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_EQ(none.err,
            "error: missing required flags --manifest, --world-size\n"
            "run 'muonshardctl plan --help' for usage\n");
  CommandResult one = Ctl({"compare", "--manifest", "m.json"});
  EXPECT_EQ(one.exit_code, 2);
  EXPECT_THAT(one.err, HasSubstr("error: missing required flag --world-size\n"));
  CommandResult submit = Ctl({"submit", "--world-size", "2", "--coordinator", kNoServer});
  EXPECT_EQ(submit.exit_code, 2);
  EXPECT_THAT(submit.err, HasSubstr("error: missing required flag --manifest\n"));
  CommandResult help = Ctl({"plan", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("  --world-size VALUE\n      number of ranks (required)\n"));
  EXPECT_THAT(help.out, HasSubstr("(required)\n  --world-size"));  // --manifest's line
  CommandResult coordinator = Run("muonshard-coordinator", {"--listen", "127.0.0.1:0"});
  EXPECT_EQ(coordinator.exit_code, 2);
  EXPECT_THAT(coordinator.err, HasSubstr("error: missing required flag --data-dir\n"));
  EXPECT_THAT(coordinator.err, HasSubstr("run 'muonshard-coordinator --help' for usage"));
}

// ---------------------------------------------------------------- 8. the command list

TEST_F(CliUsageTest, Help_CommandsInAlignedColumnsAndTheEnvironment) {
  CommandResult r = Ctl({"--help"});
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.find('\t'), std::string::npos);
  const std::string commands = r.out.substr(r.out.find("Commands:\n"));
  size_t column = 0;
  int rows = 0;
  for (absl::string_view line : absl::StrSplit(commands.substr(10, commands.find("\n\n") - 10), '\n')) {
    ASSERT_TRUE(absl::StartsWith(line, "  ")) << line;
    const size_t summary = line.find_first_not_of(' ', line.find(' ', 2));
    if (column == 0) column = summary;
    EXPECT_EQ(summary, column) << line;
    ++rows;
  }
  EXPECT_GE(rows, 15);
  EXPECT_THAT(r.out, HasSubstr("  reshard  "));
  EXPECT_THAT(r.out, HasSubstr("muonshardctl --coordinator H list"));
  EXPECT_THAT(r.out, HasSubstr("MUONSHARD_COORDINATOR"));
  EXPECT_THAT(r.out, HasSubstr("MUONSHARD_TLS_CA"));
}

// ---------------------------------------------------------------- 9. completion

TEST_F(CliUsageTest, BashCompletion_CommandsAndFlagsFromTheFlagSets) {
  EXPECT_EQ(Complete("muonshardctl pl"), "plan");
  EXPECT_EQ(Complete("muonshardctl import-"), "import-hf import-safetensors");
  EXPECT_EQ(Complete("muonshardctl plan --pol"), "--policy");
  EXPECT_EQ(Complete("muonshardctl plan --world"), "--world-size");
  // A flag's value is not the command; hidden spellings are not offered.
  EXPECT_EQ(Complete("muonshardctl --coordinator h:1 li"), "list");
  EXPECT_EQ(Complete("muonshardctl reshard d --to"), "");
  EXPECT_EQ(Complete("muonshardctl reshard d --wor"), "--world-size");
  EXPECT_EQ(Complete("muonshardctl ckpt i"), "inspect");
  EXPECT_EQ(Complete("muonshardctl ckpt inspect d --st"), "--step");
  EXPECT_THAT(Complete("muonshardctl list --"), HasSubstr("--tls-ca"));
  EXPECT_EQ(Complete("muonshardctl completion b"), "bash");
  CommandResult bad = Ctl({"completion", "zsh"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("completion takes one shell: bash"));
}

}  // namespace
}  // namespace muonshard
