#ifndef MUONSHARD_CLI_PLAN_TABLE_H_
#define MUONSHARD_CLI_PLAN_TABLE_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cli/format.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "muonshard/v1/coordinator.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::cli {

// The per-rank table's columns over `plan` (which they reference, so it must
// outlive them): rank, stage, ep, state_MiB, ns_GFLOP, owned, muon_elems,
// slice_elems, memory_MiB (the whole training memory), headroom_MiB ("-"
// without a capacity), buddy_MiB. Their --sort keys: rank (the default),
// stage, ep, state, flops, owned, muon, slice, memory, headroom (smallest
// first), buddy. A new column is one line here.
std::vector<Column> RankColumns(const v1::Plan& plan);

// --sort / --top of the per-rank table: registered with the table's keys in
// the help, checked before any work (RowOrder::Check: INVALID_ARGUMENT, so
// exit 2, naming the valid keys).
void RegisterRankOrder(FlagSet& flags, RowOrder* order);
absl::Status CheckRankOrder(const RowOrder& order, const std::string& output);

// The plan's summary (PrintPlanSummary), then one row per rank in `order`.
void PrintPlanTable(const v1::Plan& plan, const RowOrder& order, std::ostream& out);

// The summary lines alone (model, topology, policy, totals, imbalance,
// training memory per rank and, with a capacity, the headroom, and with
// fused weights their Newton-Schulz blocks: per kind of blocked tensor its
// blocks, shape, TP handling (local: per tp rank's shard, gather: whole),
// count and first name).
void PrintPlanSummary(const v1::Plan& plan, std::ostream& out);

// One rank's training memory term by term (MiB), with its capacity and
// headroom when the plan has capacities: "model 1,024.0  grad ...".
std::string MemoryTerms(const v1::RankMemory& memory);

// "0-3,5": the ranks holding `placements` ascending, consecutive ones as a
// range; "-" for none (an added tensor's "from", a removed one's "to").
std::string RankRanges(const google::protobuf::RepeatedPtrField<v1::Placement>& placements);

// `muonshardctl diff`'s table: the counts first, then per changed tensor its
// kind, moved elements and the ranks holding it before and after
// ("2 -> 0"), as the JSON's from/to placements say; "no tensor changes" when
// none. `limit` is the request's (for the note on a cut list).
void PrintPlanDiff(const v1::PlanDiff& diff, int limit, std::ostream& out);

}  // namespace muonshard::cli

#endif  // MUONSHARD_CLI_PLAN_TABLE_H_
