#include "cli/format.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace muonshard::cli {
namespace {

// "1234567" -> "1,234,567": `digits` holds decimal digits only.
std::string GroupDigits(const std::string& digits) {
  std::string out;
  out.reserve(digits.size() + digits.size() / 3);
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

const Column* FindKey(const std::vector<Column>& columns, const std::string& key) {
  for (const Column& c : columns) {
    if (!c.key.empty() && c.key == key) return &c;
  }
  return nullptr;
}

// The key --sort names, its default being the first key.
const Column* SortColumn(const std::vector<Column>& columns, const RowOrder& order) {
  if (!order.sort.empty()) return FindKey(columns, order.sort);
  for (const Column& c : columns) {
    if (!c.key.empty()) return &c;
  }
  return nullptr;
}

std::string Pad(const std::string& text, int width) {
  return width < 0 ? absl::StrFormat("%-*s", -width, text) : absl::StrFormat("%*s", width, text);
}

void PrintRow(const std::vector<Column>& columns, const std::function<std::string(const Column&)>& text,
              std::ostream& out) {
  std::string line;
  for (size_t i = 0; i < columns.size(); ++i) {
    if (i > 0) line += ' ';
    line += Pad(text(columns[i]), columns[i].width);
  }
  // A left-aligned last column pads nothing worth keeping.
  line.erase(line.find_last_not_of(' ') + 1);
  out << line << "\n";
}

}  // namespace

std::string WithThousands(int64_t n) {
  const std::string digits = absl::StrCat(n);  // no overflow for INT64_MIN, unlike -n
  if (digits[0] == '-') return absl::StrCat("-", GroupDigits(digits.substr(1)));
  return GroupDigits(digits);
}

std::string FixedWithThousands(double value, int decimals) {
  if (!std::isfinite(value)) return absl::StrFormat("%f", value);  // "nan", "inf", "-inf"
  // Formatting first and grouping the printed digits keeps the rounding's
  // carry ("999.96" -> "1,000.0").
  const std::string text = absl::StrFormat("%.*f", decimals, value);
  const size_t sign = text[0] == '-' ? 1 : 0;
  const size_t point = text.find('.');
  const size_t integer_end = point == std::string::npos ? text.size() : point;
  return absl::StrCat(text.substr(0, sign), GroupDigits(text.substr(sign, integer_end - sign)),
                      text.substr(integer_end));
}

std::string Mib(double bytes, int decimals) { return FixedWithThousands(bytes / (1024.0 * 1024.0), decimals); }

std::string Gib(double bytes, int decimals) { return FixedWithThousands(bytes / (1024.0 * 1024.0 * 1024.0), decimals); }

std::string Gflop(double flops, int decimals) { return FixedWithThousands(flops / 1e9, decimals); }

std::string Count(int64_t n, const char* singular, const char* plural) {
  return absl::StrCat(WithThousands(n), " ", n == 1 ? singular : plural);
}

void RowOrder::Register(FlagSet& flags, const std::vector<Column>& columns) {
  const Column* by_default = SortColumn(columns, RowOrder());
  flags.String("sort", &sort,
               absl::StrCat("order the rows by one of: ", SortKeys(columns), " (sizes largest first; default ",
                            by_default != nullptr ? by_default->key : "none", ")"));
  flags.Int("top", &top, "print only the first N rows in --sort order (0 = all)");
}

absl::Status RowOrder::Check(const std::vector<Column>& columns, const std::string& output) const {
  if (!sort.empty() && FindKey(columns, sort) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("flag --sort: \"", sort, "\" is not one of ", SortKeys(columns)));
  }
  if (top < 0) return absl::InvalidArgumentError(absl::StrCat("flag --top: must be >= 0, got ", top));
  if (output == "json" && given()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--output json prints every row; ", !sort.empty() ? "--sort" : "--top", " is for the table"));
  }
  return absl::OkStatus();
}

std::string SortKeys(const std::vector<Column>& columns) {
  std::vector<std::string> keys;
  for (const Column& c : columns) {
    if (!c.key.empty()) keys.push_back(c.key);
  }
  return absl::StrJoin(keys, ", ");
}

void PrintTable(const std::vector<Column>& columns, int rows, const RowOrder& order, const char* noun,
                std::ostream& out) {
  std::vector<int> index(std::max(rows, 0));
  std::iota(index.begin(), index.end(), 0);
  const Column* by = SortColumn(columns, order);
  if (by != nullptr && by->sort_value) {
    std::stable_sort(index.begin(), index.end(), [by](int a, int b) {
      const double x = by->sort_value(a);
      const double y = by->sort_value(b);
      return by->order == SortOrder::kLargestFirst ? x > y : x < y;
    });
  }
  const bool cut = order.top > 0 && order.top < rows;
  if (cut) index.resize(order.top);
  if (by != nullptr && (cut || !order.sort.empty())) {
    out << absl::StrFormat("%s of %s %s, by %s%s\n", WithThousands(static_cast<int64_t>(index.size())),
                           WithThousands(rows), noun, by->key,
                           by->order == SortOrder::kLargestFirst ? " (largest first)" : "");
  }
  PrintRow(
      columns, [](const Column& c) { return c.header; }, out);
  for (int row : index) {
    PrintRow(
        columns, [row](const Column& c) { return c.cell(row); }, out);
  }
}

}  // namespace muonshard::cli
