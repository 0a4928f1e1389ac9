#include "client/grpc_rendezvous_store.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace muonshard::client {
namespace {

absl::Status CheckKey(const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("rendezvous key is empty");
  return absl::OkStatus();
}

// Milliseconds of `timeout`, rounded up so a sub-millisecond wait still
// waits (0 would ask for the server's default).
int64_t CeilMillis(absl::Duration timeout) {
  return absl::ToInt64Milliseconds(absl::Ceil(timeout, absl::Milliseconds(1)));
}

}  // namespace

GrpcRendezvousStore::GrpcRendezvousStore(CoordinatorClient* client, GrpcRendezvousStoreOptions options)
    : client_(client), options_(std::move(options)) {}

absl::Status GrpcRendezvousStore::Annotated(const absl::Status& s, const std::string& key) const {
  return Annotate(s, absl::StrCat("rendezvous key \"", key, "\" (job \"", options_.job, "\", generation ",
                                  options_.generation, ")"));
}

absl::Status GrpcRendezvousStore::Annotated(const absl::Status& s, const std::vector<std::string>& keys) const {
  if (keys.size() == 1) return Annotated(s, keys[0]);
  return Annotate(s, absl::StrCat(keys.size(), " rendezvous keys \"", keys.front(), "\" .. \"", keys.back(),
                                  "\" (job \"", options_.job, "\", generation ", options_.generation, ")"));
}

absl::Status GrpcRendezvousStore::Set(const std::string& key, const std::string& value) {
  MUONSHARD_RETURN_IF_ERROR(CheckKey(key));
  v1::SetKeyRequest request;
  request.set_job(options_.job);
  request.set_generation(options_.generation);
  request.set_key(key);
  request.set_value(value);
  v1::SetKeyResponse response;
  std::unique_ptr<grpc::ClientContext> ctx = client_->NewContext();
  return Annotated(FromGrpcStatus(client_->stub().SetKey(ctx.get(), request, &response)), key);
}

absl::StatusOr<std::string> GrpcRendezvousStore::Get(const std::string& key) {
  MUONSHARD_RETURN_IF_ERROR(CheckKey(key));
  v1::GetKeyRequest request;
  request.set_job(options_.job);
  request.set_generation(options_.generation);
  request.set_key(key);
  v1::GetKeyResponse response;
  std::unique_ptr<grpc::ClientContext> ctx = client_->NewContext();
  absl::Status s = FromGrpcStatus(client_->stub().GetKey(ctx.get(), request, &response));
  if (!s.ok()) return Annotated(s, key);
  return std::move(*response.mutable_value());
}

absl::StatusOr<std::string> GrpcRendezvousStore::Wait(const std::string& key, absl::Duration timeout) {
  MUONSHARD_RETURN_IF_ERROR(CheckKey(key));
  if (timeout <= absl::ZeroDuration()) {
    absl::StatusOr<std::string> value = Get(key);
    if (value.status().code() == absl::StatusCode::kNotFound) {
      return absl::DeadlineExceededError(value.status().message());
    }
    return value;
  }
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<std::string> values, WaitKeys({key}, timeout));
  return std::move(values[0]);
}

absl::StatusOr<std::vector<std::string>> GrpcRendezvousStore::WaitAll(const std::vector<std::string>& keys,
                                                                      absl::Duration timeout) {
  if (keys.empty()) return std::vector<std::string>();
  for (const std::string& key : keys) MUONSHARD_RETURN_IF_ERROR(CheckKey(key));
  if (timeout <= absl::ZeroDuration()) return RendezvousStore::WaitAll(keys, timeout);  // Gets
  return WaitKeys(keys, timeout);
}

absl::StatusOr<std::vector<std::string>> GrpcRendezvousStore::WaitKeys(const std::vector<std::string>& keys,
                                                                       absl::Duration timeout) {
  v1::WaitKeysRequest request;
  request.set_job(options_.job);
  request.set_generation(options_.generation);
  for (const std::string& key : keys) request.add_keys(key);
  request.set_timeout_ms(CeilMillis(timeout));
  v1::WaitKeysResponse response;
  std::unique_ptr<grpc::ClientContext> ctx = client_->NewContext();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout + options_.rpc_slack));
  absl::Status s = FromGrpcStatus(client_->stub().WaitKeys(ctx.get(), request, &response));
  if (!s.ok()) return Annotated(s, keys);
  if (response.values_size() != static_cast<int>(keys.size())) {
    return Annotated(absl::InternalError(absl::StrCat("WaitKeys returned ", response.values_size(), " values for ",
                                                      keys.size(), " key(s)")),
                     keys);
  }
  return std::vector<std::string>(std::make_move_iterator(response.mutable_values()->begin()),
                                  std::make_move_iterator(response.mutable_values()->end()));
}

}  // namespace muonshard::client
