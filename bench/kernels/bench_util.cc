#include "bench/kernels/bench_util.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/version.h"

namespace muonshard::kernels::bench {
namespace {

int UsageError(const FlagSet& flags, const std::string& error) {
  std::cerr << "error: " << error << "\n\n" << flags.Usage();
  return 2;
}

double SecondsOf(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

std::optional<int> ParseBenchFlags(FlagSet& flags, int argc, char** argv, std::initializer_list<AtLeast> limits) {
  absl::StatusOr<std::vector<std::string>> positional = flags.Parse(ArgsOf(argc, argv));
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (flags.version_requested()) {
    std::cout << VersionLine(flags.CommandName()) << "\n";
    return 0;
  }
  if (!positional.ok()) return UsageError(flags, std::string(positional.status().message()));
  if (!positional->empty()) return UsageError(flags, absl::StrCat("unexpected argument \"", positional->front(), "\""));
  for (const AtLeast& limit : limits) {
    if (*limit.value < limit.minimum) {
      return UsageError(flags, absl::StrCat("--", limit.name, " must be >= ", limit.minimum, ", got ", *limit.value));
    }
  }
  return std::nullopt;
}

std::vector<double> BestSeconds(int reps, const std::vector<std::function<void()>>& fns) {
  for (const auto& fn : fns) fn();
  std::vector<double> best(fns.size(), 1e30);
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < fns.size(); ++i) best[i] = std::min(best[i], SecondsOf(fns[i]));
  }
  return best;
}

double MedianSeconds(int reps, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) seconds.push_back(SecondsOf(fn));
  return Median(std::move(seconds));
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace muonshard::kernels::bench
