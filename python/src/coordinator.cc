// _muonshard.CoordinatorClient: the RPCs muonshardctl uses (client/
// coordinator_calls.h), with messages crossing as proto3 JSON (the house
// format; muonshard.Coordinator parses it). The GIL is released while a call
// waits on the network.

#include <memory>
#include <optional>
#include <string>

#include "client/coordinator_calls.h"
#include "client/coordinator_client.h"
#include "common/proto_json.h"
#include "pybind11/stl.h"
#include "python/src/bindings.h"
#include "python/src/status.h"

namespace muonshard::python {
namespace {

namespace py = pybind11;

class PyCoordinatorClient {
 public:
  // Empty strings keep the environment's value or the default
  // (client::ApplyEnvironment).
  PyCoordinatorClient(const std::string& address, const std::string& token_file, const std::string& tls_ca,
                      const std::string& tls_cert, const std::string& tls_key, double timeout_s) {
    client::ConnectionOptions o;
    client::ApplyEnvironment(&o);
    if (!address.empty()) o.coordinator = address;
    if (!token_file.empty()) o.token_file = token_file;
    if (!tls_ca.empty()) o.tls_ca = tls_ca;
    o.tls_cert = tls_cert;
    o.tls_key = tls_key;
    o.timeout_s = timeout_s;
    address_ = client::WithDefaultPort(o.coordinator);
    client_ = ValueOrThrow(client::CoordinatorClient::Connect(o));
  }

  const std::string& address() const { return address_; }

  // SubmitPlanRequest.request as proto3 JSON -> SubmitPlanResponse JSON.
  std::string Submit(const std::string& request_json) {
    v1::PlanRequest request;
    ThrowIfError(FromJson(request_json, &request, "plan request"));
    absl::StatusOr<v1::SubmitPlanResponse> response;
    {
      py::gil_scoped_release release;
      response = client::SubmitPlan(*client_, request);
    }
    return Json(ValueOrThrow(std::move(response)));
  }

  // GetPlanResponse JSON: the whole plan, or `rank`'s view.
  std::string GetPlan(int64_t version, std::optional<int> rank, bool with_request) {
    v1::GetPlanRequest request;
    request.set_version(version);
    if (rank.has_value()) request.set_rank(*rank);
    request.set_with_request(with_request);
    absl::StatusOr<v1::GetPlanResponse> response;
    {
      py::gil_scoped_release release;
      response = client::GetPlan(*client_, request);
    }
    return Json(ValueOrThrow(std::move(response)));
  }

  std::string ListWorkers(const std::string& job) {
    absl::StatusOr<v1::ListWorkersResponse> response;
    {
      py::gil_scoped_release release;
      response = client::ListWorkers(*client_, job);
    }
    return Json(ValueOrThrow(std::move(response)));
  }

  std::string Health(const std::string& service) {
    absl::StatusOr<std::string> status;
    {
      py::gil_scoped_release release;
      status = client_->CheckHealth(service);
    }
    return ValueOrThrow(std::move(status));
  }

 private:
  static std::string Json(const google::protobuf::Message& message) {
    return ValueOrThrow(ToJson(message, /*pretty=*/false));
  }

  std::string address_;
  std::unique_ptr<client::CoordinatorClient> client_;
};

}  // namespace

void BindCoordinator(py::module_& m) {
  py::class_<PyCoordinatorClient>(m, "CoordinatorClient")
      .def(py::init<const std::string&, const std::string&, const std::string&, const std::string&, const std::string&,
                    double>(),
           py::arg("address") = "", py::arg("token_file") = "", py::arg("tls_ca") = "", py::arg("tls_cert") = "",
           py::arg("tls_key") = "", py::arg("timeout_s") = 30.0)
      .def_property_readonly("address", &PyCoordinatorClient::address)
      .def("submit", &PyCoordinatorClient::Submit, py::arg("request_json"))
      .def("get_plan", &PyCoordinatorClient::GetPlan, py::arg("version"), py::arg("rank") = py::none(),
           py::arg("with_request") = false)
      .def("list_workers", &PyCoordinatorClient::ListWorkers, py::arg("job") = "")
      .def("health", &PyCoordinatorClient::Health, py::arg("service") = "muonshard.v1.Coordinator");
}

}  // namespace muonshard::python
