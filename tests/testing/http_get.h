#ifndef MUONSHARD_TESTS_TESTING_HTTP_GET_H_
#define MUONSHARD_TESTS_TESTING_HTTP_GET_H_

// A minimal HTTP/1.0 GET for scraping /metrics endpoints in tests (no client
// library in Debian's C++ packages that the tests already link), and a
// reader of Prometheus text-format samples.

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muonshard::testing {

// GET http://host:port/path; the body of a 200 answer. Every socket
// operation is bounded by `timeout`. UNAVAILABLE when the connection fails,
// INTERNAL for a non-200 status, DEADLINE_EXCEEDED on a timeout.
absl::StatusOr<std::string> HttpGet(const std::string& host, int port, const std::string& path,
                                    absl::Duration timeout = absl::Seconds(10));

// The value of the sample `name{...}` in a Prometheus text exposition whose
// labels include every pair of `labels`; nullopt when there is none.
std::optional<double> PrometheusSample(const std::string& text, const std::string& name,
                                       const std::map<std::string, std::string>& labels = {});

// Whether the exposition declares the metric family `name` (# TYPE line).
bool PrometheusHasFamily(const std::string& text, const std::string& name);

}  // namespace muonshard::testing

#endif  // MUONSHARD_TESTS_TESTING_HTTP_GET_H_
