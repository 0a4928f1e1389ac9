// The SVG timeline of sim/render.h: one panel per schedule on one time
// scale; in a panel one band per rank (<g class="rank">), one row per lane
// the rank runs (its caller thread; or its compute thread and the comm lane
// of each of its groups), ops as bars coloured by phase, the critical path
// outlined in black.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "sim/render.h"

namespace muonshard::sim {
namespace {

constexpr double kWidth = 1200;
constexpr double kLeft = 200;
constexpr double kRight = 20;
constexpr double kRow = 12;
constexpr double kRowGap = 2;
constexpr double kBandGap = 8;
constexpr double kMs = 1e3;

const char* PhaseColour(Phase phase) {
  switch (phase) {
    case Phase::kReduce:
      return "#4e79a7";
    case Phase::kNewtonSchulz:
      return "#e15759";
    case Phase::kMuonElementwise:
      return "#f28e2b";
    case Phase::kAdamwElementwise:
      return "#59a14f";
    case Phase::kSync:
      return "#76b7b2";
    case Phase::kTpExchange:
      return "#b07aa1";
    case Phase::kOther:
      return "#9c755f";
  }
  return "#999999";
}

std::string Escape(absl::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Text(double x, double y, absl::string_view text, absl::string_view attrs = "") {
  return absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\"%s>%s</text>\n", x, y, attrs, Escape(text));
}

// A tick spacing of 1, 2 or 5 x 10^k ms giving about eight ticks.
double TickMs(double span_ms) {
  if (span_ms <= 0) return 1;
  const double raw = span_ms / 8;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

// The ranks a panel shows: all, or the slowest `max` (with the critical
// rank) in rank order.
std::vector<int> RanksShown(const StepResult& r, int max, std::string* note) {
  std::vector<int> ranks(r.ranks.size());
  std::iota(ranks.begin(), ranks.end(), 0);
  if (max <= 0 || static_cast<int>(ranks.size()) <= max) return ranks;
  std::stable_sort(ranks.begin(), ranks.end(),
                   [&](int a, int b) { return r.ranks[a].finish_seconds > r.ranks[b].finish_seconds; });
  ranks.resize(max);
  std::sort(ranks.begin(), ranks.end());
  *note = absl::StrFormat(" (the %d slowest of %d ranks)", max, r.ranks.size());
  return ranks;
}

struct Panel {
  const StepResult& result;
  double scale;                            // px per second
  std::vector<std::vector<int>> lanes_of;  // per rank: the lanes it runs
  std::vector<char> critical;              // per op
};

Panel MakePanel(const StepResult& r, double scale) {
  Panel p{r, scale, std::vector<std::vector<int>>(r.program.world_size), std::vector<char>(r.program.ops.size(), 0)};
  for (size_t l = 0; l < r.program.lanes.size(); ++l) {
    for (int rank : r.program.lanes[l].ranks) p.lanes_of[rank].push_back(static_cast<int>(l));
  }
  for (int op : r.critical_path) p.critical[op] = 1;
  return p;
}

// Ops of one lane drawn as one bar: a run of thin ops (under kThinPx) of one
// phase less than half a pixel apart (thousands of small collectives would
// otherwise make a file of megabytes per rank). The JSON has every op.
constexpr double kThinPx = 2;
struct Bar {
  int first = -1;
  int last = -1;
  int ops = 0;
  double start = 0;
  double end = 0;
  double last_width = 0;  // px
  bool critical = false;
};

void DrawBar(const Panel& p, const Bar& bar, double y, std::string& out) {
  const StepOp& o = p.result.program.ops[bar.first];
  const double x = kLeft + bar.start * p.scale;
  const double w = std::max(0.5, (bar.end - bar.start) * p.scale);
  const std::string stroke = bar.critical ? " stroke=\"#000\" stroke-width=\"1.2\"" : "";
  std::string what = o.label;
  if (bar.ops > 1) {
    what = absl::StrFormat("%d ops, %s ... %s", bar.ops, o.label, p.result.program.ops[bar.last].label);
  } else if (!p.result.timing[bar.first].algorithm.empty()) {
    what = absl::StrCat(o.label, " [", p.result.timing[bar.first].algorithm, "]");
  }
  absl::StrAppendFormat(&out,
                        "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"%s>"
                        "<title>%s: %.3f-%.3f ms (%s)</title></rect>\n",
                        x, y, w, kRow, PhaseColour(o.phase), stroke, Escape(what), bar.start * kMs, bar.end * kMs,
                        PhaseName(o.phase));
}

void DrawLane(const Panel& p, int lane, double y, std::string& out) {
  std::vector<int> ops;
  for (const std::vector<int>& block : p.result.program.lanes[lane].blocks)
    ops.insert(ops.end(), block.begin(), block.end());
  std::stable_sort(ops.begin(), ops.end(),
                   [&](int a, int b) { return p.result.timing[a].start < p.result.timing[b].start; });
  Bar bar;
  for (int op : ops) {
    const OpTiming& t = p.result.timing[op];
    const double width = (t.end - t.start) * p.scale;
    const bool joins = bar.ops > 0 && p.result.program.ops[op].phase == p.result.program.ops[bar.first].phase &&
                       (t.start - bar.end) * p.scale < 0.5 && width < kThinPx && bar.last_width < kThinPx;
    if (!joins) {
      if (bar.ops > 0) DrawBar(p, bar, y, out);
      bar = Bar{op, op, 0, t.start, t.end, 0, false};
    }
    bar.last = op;
    bar.last_width = width;
    ++bar.ops;
    bar.end = std::max(bar.end, t.end);
    bar.critical = bar.critical || p.critical[op];
  }
  if (bar.ops > 0) DrawBar(p, bar, y, out);
}

double DrawRank(const Panel& p, int rank, double y, std::string& out) {
  const RankResult& rr = p.result.ranks[rank];
  absl::StrAppendFormat(&out, "<g class=\"rank\" data-rank=\"%d\">\n", rank);
  out += Text(6, y + kRow - 2, absl::StrFormat("rank %d (node %d)", rank, rr.node), " font-weight=\"bold\"");
  for (int lane : p.lanes_of[rank]) {
    out += Text(kLeft - 4, y + kRow - 2, p.result.program.lanes[lane].name, " text-anchor=\"end\" fill=\"#555\"");
    DrawLane(p, lane, y, out);
    y += kRow + kRowGap;
  }
  out += "</g>\n";
  return y + kBandGap;
}

double DrawAxis(double y, double max_seconds, double scale, double bottom, std::string& out) {
  const double tick = TickMs(max_seconds * kMs);
  for (double ms = 0; ms <= max_seconds * kMs + 1e-9; ms += tick) {
    const double x = kLeft + ms / kMs * scale;
    absl::StrAppendFormat(&out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x, y, x,
                          bottom);
    out += Text(x, y - 2, absl::StrFormat("%g ms", ms), " text-anchor=\"middle\" fill=\"#555\"");
  }
  return y + 4;
}

double DrawPanel(const Panel& p, const ReportOptions& options, double max_seconds, double y, std::string& out) {
  std::string note;
  const std::vector<int> ranks = RanksShown(p.result, options.svg_max_ranks, &note);
  double rows = 0;
  for (int r : ranks) rows += p.lanes_of[r].size() * (kRow + kRowGap) + kBandGap;
  out += "<g class=\"panel\">\n";
  out += Text(
      6, y + 12,
      absl::StrFormat("%s: step %.3f ms, critical rank %d, critical phase %s%s", p.result.program.name,
                      p.result.step_seconds * kMs, p.result.critical_rank, PhaseName(p.result.critical_phase), note),
      " font-weight=\"bold\" font-size=\"13\"");
  y = DrawAxis(y + 34, max_seconds, p.scale, y + 34 + rows, out);
  for (int r : ranks) y = DrawRank(p, r, y, out);
  out += "</g>\n";
  return y + 16;
}

double DrawLegend(double y, std::string& out) {
  double x = 6;
  for (int ph = 0; ph < kPhaseCount; ++ph) {
    const Phase phase = static_cast<Phase>(ph);
    absl::StrAppendFormat(&out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", x, y,
                          PhaseColour(phase));
    out += Text(x + 16, y + 10, PhaseName(phase));
    x += 80;
  }
  out += Text(x, y + 10, "black outline: critical path", " fill=\"#555\"");
  return y + 24;
}

}  // namespace

std::string RenderSvg(const ClusterSpec& cluster, absl::Span<const StepResult> results, const ReportOptions& options) {
  double max_seconds = 0;
  for (const StepResult& r : results) max_seconds = std::max(max_seconds, r.step_seconds);
  const double scale = (kWidth - kLeft - kRight) / std::max(max_seconds, 1e-12);
  std::string body;
  double y = 6;
  if (!options.title.empty()) {
    body += Text(6, y + 14, options.title, " font-weight=\"bold\" font-size=\"15\"");
    y += 22;
  }
  const int world = results.empty() ? 0 : results.front().program.world_size;
  body += Text(6, y + 12, ClusterSummary(cluster, world), " fill=\"#333\"");
  y = DrawLegend(y + 22, body);
  for (const StepResult& r : results) y = DrawPanel(MakePanel(r, scale), options, max_seconds, y, body);
  return absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n%s</svg>\n",
      kWidth, y, kWidth, y, body);
}

}  // namespace muonshard::sim
