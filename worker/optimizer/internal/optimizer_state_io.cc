#include "worker/optimizer/internal/optimizer_state_io.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::worker::internal {

absl::StatusOr<std::vector<checkpoint::StateShard>> OptimizerStateIo::StateShards() {
  const v1::RankView& view = layout_.view();
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::ShardSpec> specs, checkpoint::ExpectedShards(view));
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<checkpoint::SliceLocation> slices, checkpoint::LocateSlices(view));
  absl::flat_hash_map<int, int> adamw_position;  // AdamwBucket.id -> position in the view
  for (int b = 0; b < view.adamw_buckets_size(); ++b) adamw_position[view.adamw_buckets(b).id()] = b;
  std::vector<checkpoint::StateShard> shards;
  shards.reserve(specs.size());
  size_t k = 0;
  mirrors_.clear();
  auto add = [&](BackendBuffer& buffer, int64_t at, checkpoint::StateKind kind) -> absl::Status {
    if (k >= specs.size() || specs[k].kind != kind || at + specs[k].numel() > buffer.numel()) {
      return absl::InternalError(
          absl::StrCat("rank ", layout_.rank(), ": optimizer buffers do not match the view's shard ", k));
    }
    MUONSHARD_ASSIGN_OR_RETURN(absl::Span<float> host, HostState(buffer));
    shards.push_back({specs[k], host.subspan(at, specs[k].numel())});
    ++k;
    return absl::OkStatus();
  };
  using Kind = checkpoint::StateKind;
  for (size_t i = 0; i < layout_.index().owned.size(); ++i) {
    MuonShardState& s = params_.shard(static_cast<int>(i));
    MUONSHARD_RETURN_IF_ERROR(add(s.master, 0, Kind::kMaster));
    MUONSHARD_RETURN_IF_ERROR(add(s.momentum, 0, Kind::kMomentum));
  }
  for (const checkpoint::SliceLocation& slice : slices) {
    AdamwBucketState& b = params_.adamw(adamw_position[slice.bucket]);
    MUONSHARD_RETURN_IF_ERROR(add(b.master, slice.shard_offset, Kind::kMaster));
    MUONSHARD_RETURN_IF_ERROR(add(b.moment1, slice.shard_offset, Kind::kMoment1));
    MUONSHARD_RETURN_IF_ERROR(add(b.moment2, slice.shard_offset, Kind::kMoment2));
  }
  if (k != specs.size()) return absl::InternalError("optimizer buffers do not cover the view's shards");
  return shards;
}

absl::StatusOr<absl::Span<float>> OptimizerStateIo::HostState(BackendBuffer& buffer) {
  if (backend_.device_kind() == kernels::DeviceKind::kCpu) return absl::MakeSpan(buffer.floats(), buffer.numel());
  auto [it, inserted] = mirrors_.try_emplace(&buffer);
  if (inserted) {
    it->second.resize(buffer.numel());
    MUONSHARD_RETURN_IF_ERROR(buffer.Read(0, absl::MakeSpan(it->second)));
  }
  return absl::MakeSpan(it->second);
}

absl::Status OptimizerStateIo::UploadMirrors() {
  for (auto& [buffer, values] : mirrors_) {
    MUONSHARD_RETURN_IF_ERROR(buffer->Write(0, values));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<int, std::vector<float>>> OptimizerStateIo::GatherMasters() {
  const v1::RankView& view = layout_.view();
  const ViewLayout& index = layout_.index();
  // fp32 copies of every bucket: the owners' Muon masters, then each AdamW
  // shard's masters gathered into the whole buffer.
  std::vector<BackendBuffer> muon(view.muon_buckets_size());
  std::vector<BackendBuffer> adamw(view.adamw_buckets_size());
  for (int b = 0; b < view.muon_buckets_size(); ++b) {
    MUONSHARD_ASSIGN_OR_RETURN(muon[b], BackendBuffer::Create(backend_, v1::FP32, view.muon_buckets(b).numel()));
  }
  for (size_t i = 0; i < index.owned.size(); ++i) {
    const v1::BucketEntry& e = layout_.OwnedEntry(static_cast<int>(i));
    MUONSHARD_RETURN_IF_ERROR(
        muon[index.owned[i].bucket].ConvertFrom(e.offset(), params_.shard(static_cast<int>(i)).master, 0, e.numel()));
  }
  for (int b = 0; b < view.adamw_buckets_size(); ++b) {
    MUONSHARD_ASSIGN_OR_RETURN(adamw[b], BackendBuffer::Create(backend_, v1::FP32, view.adamw_buckets(b).numel()));
    if (comms_.comm(index.adamw_buckets[b].group) == nullptr) {
      const BackendBuffer& master = params_.adamw(b).master;
      MUONSHARD_RETURN_IF_ERROR(adamw[b].ConvertFrom(0, master, 0, master.numel()));
    }
  }
  MUONSHARD_RETURN_IF_ERROR(backend_.Synchronize());
  MUONSHARD_RETURN_IF_ERROR(comms_.ForEach([&](int g, Communicator& comm) -> absl::Status {
    for (int b : index.groups[g].muon_buckets) {
      MUONSHARD_RETURN_IF_ERROR(
          comm.Broadcast(muon[b].data(), muon[b].numel(), CommDType::kFloat32, index.muon_buckets[b].owner_group_rank));
    }
    for (int b : index.groups[g].adamw_buckets) {
      MUONSHARD_RETURN_IF_ERROR(comm.AllGather(params_.adamw(b).master.data(), adamw[b].data(),
                                               index.adamw_buckets[b].counts, CommDType::kFloat32));
    }
    return absl::OkStatus();
  }));
  std::map<int, std::vector<float>> out;
  for (const PartLayout& part : index.parts) {
    std::vector<float>& values = out[part.tensor];
    values.resize(part.element_end - part.element_begin);
    for (const EntryRef& ref : part.entries) {
      const v1::BucketEntry& e = layout_.Entry(ref);
      MUONSHARD_RETURN_IF_ERROR((ref.muon ? muon : adamw)[ref.bucket].Read(
          e.offset(), absl::MakeSpan(values).subspan(e.element_begin() - part.element_begin, e.numel())));
    }
  }
  return out;
}

}  // namespace muonshard::worker::internal
