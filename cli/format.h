#ifndef MUONSHARD_CLI_FORMAT_H_
#define MUONSHARD_CLI_FORMAT_H_

// muonshardctl's tables: number formatting and rows ordered by --sort/--top.
//
// Quantities (counts, elements, bytes, FLOPs, MiB) are grouped in thousands;
// identifiers (versions, ranks, generations, incarnations) are not, so
// scripts that read them from a table (`awk '/^version/ {print $2}'`) keep
// working. Every table prints its summary first, then its rows, and says so
// in words when it has no rows.

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/flags.h"

namespace muonshard::cli {

// 1234567 -> "1,234,567"; -1234 -> "-1,234"; 999 -> "999".
std::string WithThousands(int64_t n);

// `value` with `decimals` digits after the point, the integer part grouped:
// (1234567.89, 1) -> "1,234,567.9"; (-0.04, 1) -> "-0.0"; NaN -> "nan".
std::string FixedWithThousands(double value, int decimals);

// Bytes as MiB / GiB and FLOPs as GFLOP, grouped, one decimal unless told:
// Mib(1572864) -> "1.5"; Gflop(1.5e12) -> "1,500.0".
std::string Mib(double bytes, int decimals = 1);
std::string Gib(double bytes, int decimals = 1);
std::string Gflop(double flops, int decimals = 1);

// "1 rank" / "3 ranks" (the count grouped).
std::string Count(int64_t n, const char* singular, const char* plural);

// ---------------------------------------------------------------- tables

enum class SortOrder { kAscending, kLargestFirst };

// A column of a table whose rows are numbered 0..n-1 (the caller's columns
// capture what the numbers index). With a `key` the column is also a --sort
// key: rows are ordered by `sort_value`, ascending for identifiers (rank,
// stage), largest first for sizes (bytes, FLOPs); ties keep row order.
struct Column {
  std::string header;
  int width = 0;  // right-aligned in `width` characters; negative: left-aligned
  std::function<std::string(int row)> cell;
  std::string key = "";  // "" = not a sort key
  SortOrder order = SortOrder::kAscending;
  std::function<double(int row)> sort_value = nullptr;
};

// --sort KEY and --top N of a table with sort keys.
struct RowOrder {
  std::string sort;  // "" = the table's first key
  int top = 0;       // 0 = every row

  void Register(FlagSet& flags, const std::vector<Column>& columns);
  // INVALID_ARGUMENT naming the flag and, for --sort, the valid keys; and
  // for either flag with --output json, which prints every row as stored.
  absl::Status Check(const std::vector<Column>& columns, const std::string& output) const;
  bool given() const { return !sort.empty() || top != 0; }
};

// The sort keys of `columns` in column order: "rank, state, flops".
std::string SortKeys(const std::vector<Column>& columns);

// The header and `rows` rows, ordered by `order` (which Check accepted).
// When ordered by a non-default key or cut by --top, a line first says so:
// "10 of 1,024 ranks, by flops (largest first)". `noun` names the rows.
void PrintTable(const std::vector<Column>& columns, int rows, const RowOrder& order, const char* noun,
                std::ostream& out);

}  // namespace muonshard::cli

#endif  // MUONSHARD_CLI_FORMAT_H_
