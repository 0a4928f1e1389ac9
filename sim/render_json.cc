// The JSON report of sim/render.h.
#include <string>
#include <vector>

#include "common/ordered_json.h"
#include "sim/cluster_json.h"
#include "sim/render.h"

namespace muonshard::sim {
namespace {

std::string PhaseSeconds(const std::array<double, kPhaseCount>& seconds) {
  JsonObjectWriter w;
  for (int ph = 0; ph < kPhaseCount; ++ph) w.Number(PhaseName(static_cast<Phase>(ph)), seconds[ph]);
  return w.Finish();
}

std::string CollectiveBytes(const RankResult& r) {
  JsonObjectWriter w;
  for (int k = 0; k < kOpKindCount; ++k) {
    if (IsCollective(static_cast<OpKind>(k))) w.Int64(OpKindName(static_cast<OpKind>(k)), r.collective_bytes[k]);
  }
  return w.Finish();
}

std::string RankJson(const RankResult& r) {
  JsonObjectWriter wire;
  for (int c = 0; c < kLinkClassCount; ++c) wire.Number(LinkClassName(static_cast<LinkClass>(c)), r.wire_bytes[c]);
  return JsonObjectWriter()
      .Number("rank", r.rank)
      .Number("node", r.node)
      .Number("finish_seconds", r.finish_seconds)
      .Raw("busy_seconds", PhaseSeconds(r.busy_seconds))
      .Raw("collective_bytes", CollectiveBytes(r))
      .Int64("p2p_sent_bytes", r.p2p_sent_bytes)
      .Int64("p2p_recv_bytes", r.p2p_recv_bytes)
      .Raw("wire_bytes", wire.Finish())
      .Finish();
}

std::string PathOpJson(const StepResult& result, int index) {
  const StepOp& op = result.program.ops[index];
  const OpTiming& t = result.timing[index];
  JsonObjectWriter w;
  w.Raw("op", JsonString(op.label))
      .Raw("kind", JsonString(OpKindName(op.kind)))
      .Raw("phase", JsonString(PhaseName(op.phase)));
  if (IsCollective(op.kind)) {
    w.Number("group", op.group).Raw("algorithm", JsonString(t.algorithm));
  } else {
    w.Number("rank", op.rank);
  }
  return w.Number("start_seconds", t.start).Number("end_seconds", t.end).Finish();
}

std::string ResultJson(const StepResult& r) {
  std::vector<std::string> path, ranks;
  for (int op : r.critical_path) path.push_back(PathOpJson(r, op));
  for (const RankResult& rank : r.ranks) ranks.push_back(RankJson(rank));
  return JsonObjectWriter()
      .Raw("schedule", JsonString(r.program.name))
      .Number("step_seconds", r.step_seconds)
      .Number("critical_rank", r.critical_rank)
      .Raw("critical_phase", JsonString(PhaseName(r.critical_phase)))
      .Raw("critical_seconds", PhaseSeconds(r.critical_seconds))
      .Raw("critical_path", JsonArrayText(path))
      .Raw("ranks", JsonArrayText(ranks))
      .Finish();
}

}  // namespace

std::string RenderJson(const ClusterSpec& cluster, absl::Span<const StepResult> results, const ReportOptions& options) {
  std::vector<std::string> schedules;
  for (const StepResult& r : results) schedules.push_back(ResultJson(r));
  const int world = results.empty() ? 0 : results.front().program.world_size;
  return JsonObjectWriter()
             .Raw("title", JsonString(options.title))
             .Raw("cluster", ClusterToJson(cluster))
             .Number("world_size", world)
             .Number("nodes_used", world > 0 ? NodesUsed(cluster, world) : 0)
             .Raw("schedules", JsonArrayText(schedules))
             .Finish() +
         "\n";
}

}  // namespace muonshard::sim
