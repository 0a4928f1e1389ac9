#ifndef MUONSHARD_BENCH_KERNELS_BENCH_UTIL_H_
#define MUONSHARD_BENCH_KERNELS_BENCH_UTIL_H_

// What the kernel benchmarks (bench/kernels/*_bench.cc) share: their command
// line, read by common/flags.h's FlagSet as every other binary's is, and the
// two ways they time a function.

#include <functional>
#include <initializer_list>
#include <optional>
#include <vector>

#include "common/flags.h"

namespace muonshard::kernels::bench {

// An int flag of the benchmark that must be at least `minimum`.
struct AtLeast {
  const char* name;  // without "--", as registered
  const int* value;
  int minimum = 1;
};

// Parses the command line into the flags registered on `flags`. Returns the
// exit status when there is nothing to run: 0 after --help or --version
// (printed on stdout), 2 after bad usage — an unknown or malformed flag, a
// positional argument, an int below its minimum — with the error naming it
// and the usage on stderr. std::nullopt: go on and run.
std::optional<int> ParseBenchFlags(FlagSet& flags, int argc, char** argv, std::initializer_list<AtLeast> limits = {});

// Best wall time in seconds of each function over `reps` rounds after one
// warm-up round. The functions run interleaved, round by round, so a burst
// of load from other processes hits all of them alike and their ratios stay
// meaningful on a shared machine.
std::vector<double> BestSeconds(int reps, const std::vector<std::function<void()>>& fns);

// Median wall time in seconds of `reps` calls of `fn` after one warm-up call.
double MedianSeconds(int reps, const std::function<void()>& fn);

// The median of `values` (the mean of the middle two for an even count);
// REQUIRES: !values.empty().
double Median(std::vector<double> values);

}  // namespace muonshard::kernels::bench

#endif  // MUONSHARD_BENCH_KERNELS_BENCH_UTIL_H_
