#include "coordinator/planner/tensor_parallel.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <type_traits>
#include <vector>

#include "coordinator/planner/plan_stats.h"

namespace muonshard::planner {
namespace {

bool IsSplit(v1::TpSplit s) { return s == v1::TP_COLUMN || s == v1::TP_ROW; }

int64_t Product(const google::protobuf::RepeatedField<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

// Whole shapes and the TP fields of every tensor; parts once per tp rank.
void ExpandTensors(const v1::Plan& replica, const v1::ModelManifest& manifest, int tp, v1::Plan* out) {
  for (int i = 0; i < replica.tensors_size(); ++i) {
    const v1::TensorSpec& spec = manifest.tensors(i);
    v1::PlannedTensor* t = out->add_tensors();
    *t = replica.tensors(i);
    t->clear_parts();
    *t->mutable_shape() = spec.shape();
    t->set_numel(Product(spec.shape()));
    if (IsSplit(spec.tp_split())) {
      t->set_tp_split(spec.tp_split());
      *t->mutable_local_shape() = replica.tensors(i).shape();
      t->set_local_numel(replica.tensors(i).numel());
    }
    for (const v1::TensorPart& part : replica.tensors(i).parts()) {
      for (int r = 0; r < tp; ++r) {
        v1::TensorPart* p = t->add_parts();
        *p = part;
        p->set_group(part.group() * tp + r);
      }
    }
  }
}

template <typename Bucket>
void ExpandBuckets(const google::protobuf::RepeatedPtrField<Bucket>& in, int tp,
                   google::protobuf::RepeatedPtrField<Bucket>* out) {
  for (const Bucket& b : in) {
    for (int r = 0; r < tp; ++r) {
      Bucket* e = out->Add();
      *e = b;
      e->set_id(b.id() * tp + r);
      e->set_group(b.group() * tp + r);
      if constexpr (std::is_same_v<Bucket, v1::MuonBucket>) e->set_owner(b.owner() * tp + r);
    }
  }
}

// The tp rank that orthogonalises each of `owned` (-1 for replicated
// matrices): longest first onto the least-loaded tp rank, over the FLOPs
// every tp rank already spends on replicated matrices.
std::vector<int> AssignNsRanks(const v1::RankPlan& owner, const v1::Plan& out, int tp) {
  std::vector<int> ns_rank(owner.owned_size(), -1);
  std::vector<int> split;
  for (int k = 0; k < owner.owned_size(); ++k) {
    if (IsSplit(out.tensors(owner.owned(k).tensor()).tp_split())) split.push_back(k);
  }
  std::stable_sort(split.begin(), split.end(),
                   [&](int a, int b) { return owner.owned(a).ns_flops() > owner.owned(b).ns_flops(); });
  std::vector<double> load(tp, 0);
  for (int k : split) {
    const int t = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    ns_rank[k] = t;
    load[t] += owner.owned(k).ns_flops();
  }
  return ns_rank;
}

// Rank `q * tp + t`'s copy of replica rank q's owned matrix.
void SetTpOp(v1::TpMuonMode mode, int tp, int t, int ns_rank, int tp_group, v1::OwnedTensor& o) {
  const int64_t shard = o.numel() * kTpOpBytesPerElem;
  if (ns_rank < 0) {
    o.set_tp_op(v1::TP_OP_NONE);
    o.set_tp_group(-1);
    o.set_ns_tp_rank(-1);
    return;
  }
  o.set_tp_group(tp_group);
  if (mode == v1::TP_MUON_DUPLICATED) {
    o.set_tp_op(v1::TP_OP_ALL_GATHER);
    o.set_ns_tp_rank(-1);
    o.set_tp_send_bytes((tp - 1) * shard);  // ring all-gather: tp - 1 shards through every rank
    o.set_tp_recv_bytes((tp - 1) * shard);
    return;
  }
  o.set_tp_op(v1::TP_OP_GATHER_SCATTER);
  o.set_ns_tp_rank(ns_rank);
  const bool runs_ns = t == ns_rank;
  o.set_tp_send_bytes(runs_ns ? (tp - 1) * shard : shard);  // scatter out, or its shard in
  o.set_tp_recv_bytes(runs_ns ? (tp - 1) * shard : shard);
  if (!runs_ns) o.set_ns_flops(0);
}

void ExpandRanks(const v1::Plan& replica, const RankLayout& layout, v1::Plan* out) {
  const int tp = layout.tp();
  const v1::TpMuonMode mode = out->policy().tp_muon();
  for (const v1::RankPlan& q : replica.ranks()) {
    const std::vector<int> ns_rank = AssignNsRanks(q, *out, tp);
    for (int t = 0; t < tp; ++t) {
      v1::RankPlan* r = out->add_ranks();
      *r = q;
      r->set_rank(q.rank() * tp + t);
      r->set_tp_rank(t);
      r->set_ep_rank(layout.EpRankOf(r->rank()));
      int64_t send = 0, recv = 0;
      for (int k = 0; k < r->owned_size(); ++k) {
        v1::OwnedTensor& o = *r->mutable_owned(k);
        o.set_bucket(o.bucket() * tp + t);
        SetTpOp(mode, tp, t, ns_rank[k], layout.TpGroupOf(r->rank()), o);
        send += o.tp_send_bytes();
        recv += o.tp_recv_bytes();
      }
      for (v1::TensorSlice& s : *r->mutable_slices()) s.set_bucket(s.bucket() * tp + t);
      r->set_tp_send_bytes(send);
      r->set_tp_recv_bytes(recv);
    }
  }
}

// The largest Muon matrix: its shard for memory, its whole for FLOPs.
void LargestMatrix(const v1::Plan& plan, int64_t* numel, double* flops) {
  *numel = 0;
  *flops = 0;
  for (const v1::PlannedTensor& t : plan.tensors()) {
    if (t.optimizer() != v1::MUON) continue;
    const auto& local = HeldShape(t);
    const int n = t.shape_size();
    *numel = std::max(*numel, local[n - 2] * local[n - 1]);
    *flops = std::max(*flops, NsFlops(t.shape(n - 2), t.shape(n - 1), plan.policy().ns_steps()));
  }
}

}  // namespace

TpReplica ReplicaOf(const v1::ModelManifest& manifest, const RankLayout& layout) {
  TpReplica replica;
  replica.manifest = manifest;
  for (v1::TensorSpec& t : *replica.manifest.mutable_tensors()) {
    if (IsSplit(t.tp_split())) {
      const int dim = TpSplitDim(t.shape_size(), t.layout(), t.tp_split());
      t.set_shape(dim, t.shape(dim) / layout.tp());
    }
    t.clear_tp_split();
  }
  replica.topology = layout.Resolved();
  replica.topology.set_world_size(layout.world_size() / layout.tp());
  replica.topology.set_tp(1);
  return replica;
}

void UseWholeMatricesForNs(const ResolvedModel& whole, ResolvedModel& replica) {
  for (size_t i = 0; i < replica.tensors.size(); ++i) {
    replica.tensors[i].ns_rows = whole.tensors[i].rows;
    replica.tensors[i].ns_cols = whole.tensors[i].cols;
  }
}

v1::PlanRequest WholeModelRequest(const v1::PlanRequest& request) {
  const int tp = request.topology().tp();
  if (tp <= 1) return request;
  v1::PlanRequest whole = request;
  for (v1::TensorSpec& t : *whole.mutable_manifest()->mutable_tensors()) t.clear_tp_split();
  whole.mutable_topology()->set_world_size(request.topology().world_size() / tp);
  whole.mutable_topology()->set_tp(1);
  whole.mutable_policy()->clear_tp_muon();
  return whole;
}

void ExpandTensorParallel(const v1::Plan& replica, const v1::ModelManifest& manifest, const RankLayout& layout,
                          v1::Plan* out) {
  const int tp = layout.tp();
  out->set_format_version(replica.format_version());
  out->set_content_hash(replica.content_hash());
  out->set_model(replica.model());
  *out->mutable_topology() = layout.Resolved();
  *out->mutable_policy() = replica.policy();
  for (int g = 0; g < layout.num_groups(); ++g) *out->add_groups() = layout.GroupProto(g);
  ExpandTensors(replica, manifest, tp, out);
  ExpandBuckets(replica.muon_buckets(), tp, out->mutable_muon_buckets());
  ExpandBuckets(replica.adamw_buckets(), tp, out->mutable_adamw_buckets());
  ExpandRanks(replica, layout, out);
  int64_t max_numel = 0;
  double max_flops = 0;
  LargestMatrix(*out, &max_numel, &max_flops);
  *out->mutable_stats() = ComputePlanStats(*out, max_numel, max_flops);
}

}  // namespace muonshard::planner
