#include "tests/testing/fake_dns_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace muonshard::testing {
namespace {

constexpr size_t kHeaderBytes = 12;
constexpr uint16_t kTypeA = 1;
constexpr uint16_t kClassIn = 1;
constexpr int kRcodeNxDomain = 3;
constexpr int kPollMs = 50;  // how soon the server notices stop_

uint16_t ReadU16(const std::string& s, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(s[at]) << 8) | static_cast<uint8_t>(s[at + 1]));
}

void AppendU16(std::string* s, uint16_t v) {
  s->push_back(static_cast<char>(v >> 8));
  s->push_back(static_cast<char>(v & 0xff));
}

// The question's name (lower case, labels joined by dots) and the offset just
// past it; false when the name runs past the message or is compressed.
bool ReadName(const std::string& msg, size_t* at, std::string* name) {
  while (*at < msg.size()) {
    const uint8_t len = static_cast<uint8_t>(msg[*at]);
    ++*at;
    if (len == 0) return true;
    if (len > 63 || *at + len > msg.size()) return false;
    if (!name->empty()) name->push_back('.');
    name->append(absl::AsciiStrToLower(msg.substr(*at, len)));
    *at += len;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FakeDnsServer>> FakeDnsServer::Start() {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("bind 127.0.0.1:0/udp: ", std::strerror(err)));
  }
  std::unique_ptr<FakeDnsServer> server(new FakeDnsServer(fd, ntohs(addr.sin_port)));
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

FakeDnsServer::~FakeDnsServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

void FakeDnsServer::Set(const std::string& name, const std::string& ipv4) {
  in_addr a{};
  inet_pton(AF_INET, ipv4.c_str(), &a);
  absl::MutexLock lock(&mu_);
  names_[absl::AsciiStrToLower(name)] = a.s_addr;
  missing_.erase(absl::AsciiStrToLower(name));
}

void FakeDnsServer::Remove(const std::string& name, Missing how) {
  absl::MutexLock lock(&mu_);
  names_.erase(absl::AsciiStrToLower(name));
  missing_[absl::AsciiStrToLower(name)] = how;
}

void FakeDnsServer::Serve() {
  char buf[1500];
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, kPollMs) <= 0) continue;
    sockaddr_in from{};
    socklen_t from_len = sizeof(from);
    const ssize_t n = recvfrom(fd_, buf, sizeof(buf), 0, reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n <= 0) continue;
    ++queries_;
    const std::string answer = Answer(std::string(buf, static_cast<size_t>(n)));
    if (answer.empty()) continue;
    sendto(fd_, answer.data(), answer.size(), 0, reinterpret_cast<sockaddr*>(&from), from_len);
  }
}

// One question per query (what resolvers send): the header with QR, AA and
// RA set (RD copied), the question echoed, and an A record with TTL 0 when
// the name is held and the type is A; nothing for a name removed with
// kNoAnswer or a malformed query.
std::string FakeDnsServer::Answer(const std::string& query) {
  if (query.size() < kHeaderBytes || ReadU16(query, 4) != 1) return "";
  size_t at = kHeaderBytes;
  std::string name;
  if (!ReadName(query, &at, &name) || at + 4 > query.size()) return "";
  const uint16_t type = ReadU16(query, at);
  const size_t question_end = at + 4;
  std::optional<uint32_t> address;
  {
    absl::MutexLock lock(&mu_);
    auto it = names_.find(name);
    if (it != names_.end()) address = it->second;
    auto gone = missing_.find(name);
    if (gone != missing_.end() && gone->second == Missing::kNoAnswer) return "";
  }
  const bool answers = address.has_value() && type == kTypeA;
  std::string out = query.substr(0, 2);  // the query's id
  const uint16_t rd = ReadU16(query, 2) & 0x0100;
  AppendU16(&out, static_cast<uint16_t>(0x8000 | 0x0400 | rd | 0x0080 | (address.has_value() ? 0 : kRcodeNxDomain)));
  AppendU16(&out, 1);                // QDCOUNT
  AppendU16(&out, answers ? 1 : 0);  // ANCOUNT
  AppendU16(&out, 0);                // NSCOUNT
  AppendU16(&out, 0);                // ARCOUNT
  out.append(query, kHeaderBytes, question_end - kHeaderBytes);
  if (answers) {
    AppendU16(&out, 0xc000 | kHeaderBytes);  // the name: a pointer to the question's
    AppendU16(&out, kTypeA);
    AppendU16(&out, kClassIn);
    AppendU16(&out, 0);  // TTL 0: nobody may cache it
    AppendU16(&out, 0);
    AppendU16(&out, 4);
    out.append(reinterpret_cast<const char*>(&*address), 4);  // already network order
  }
  return out;
}

}  // namespace muonshard::testing
