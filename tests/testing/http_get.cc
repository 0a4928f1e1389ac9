#include "tests/testing/http_get.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace muonshard::testing {
namespace {

// Closes the descriptor on every path out.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

absl::Status Connect(const Socket& s, const std::string& host, int port, absl::Duration timeout) {
  timeval tv = absl::ToTimeval(timeout);
  setsockopt(s.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(s.fd(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", host));
  }
  if (connect(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat("connect ", host, ":", port, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadToEnd(const Socket& s) {
  std::string response;
  std::vector<char> buf(1 << 16);
  while (true) {
    ssize_t n = recv(s.fd(), buf.data(), buf.size(), 0);
    if (n == 0) return response;
    if (n > 0) {
      response.append(buf.data(), static_cast<size_t>(n));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::DeadlineExceededError("HTTP read timed out");
    } else if (errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    }
  }
}

// "a=\"1\",b=\"2\"" -> {a: 1, b: 2}. Label values here never hold commas
// or escaped quotes (job names and small integers).
std::map<std::string, std::string> ParseLabels(absl::string_view text) {
  std::map<std::string, std::string> labels;
  for (absl::string_view pair : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    absl::string_view value = kv.second;
    absl::ConsumePrefix(&value, "\"");
    absl::ConsumeSuffix(&value, "\"");
    labels[std::string(kv.first)] = std::string(value);
  }
  return labels;
}

}  // namespace

absl::StatusOr<std::string> HttpGet(const std::string& host, int port, const std::string& path,
                                    absl::Duration timeout) {
  Socket s(socket(AF_INET, SOCK_STREAM, 0));
  if (s.fd() < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  if (absl::Status c = Connect(s, host, port, timeout); !c.ok()) return c;
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host, "\r\n\r\n");
  if (send(s.fd(), request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
  }
  absl::StatusOr<std::string> response = ReadToEnd(s);
  if (!response.ok()) return response.status();
  const size_t header_end = response->find("\r\n\r\n");
  if (header_end == std::string::npos) return absl::InternalError("malformed HTTP response");
  const std::string status_line = response->substr(0, response->find("\r\n"));
  if (status_line.find(" 200 ") == std::string::npos) {
    return absl::InternalError(absl::StrCat("HTTP ", status_line));
  }
  return response->substr(header_end + 4);
}

std::optional<double> PrometheusSample(const std::string& text, const std::string& name,
                                       const std::map<std::string, std::string>& labels) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, name)) continue;
    std::map<std::string, std::string> have;
    if (absl::ConsumePrefix(&line, "{")) {
      const size_t close = line.find('}');
      if (close == absl::string_view::npos) continue;
      have = ParseLabels(line.substr(0, close));
      line.remove_prefix(close + 1);
    }
    if (!absl::ConsumePrefix(&line, " ")) continue;  // a longer name with this prefix
    bool match = true;
    for (const auto& [k, v] : labels) match = match && have.count(k) > 0 && have[k] == v;
    double value = 0;
    if (match && absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(0, line.find(' '))), &value)) {
      return value;
    }
  }
  return std::nullopt;
}

bool PrometheusHasFamily(const std::string& text, const std::string& name) {
  return text.find(absl::StrCat("# TYPE ", name, " ")) != std::string::npos;
}

}  // namespace muonshard::testing
