#include "tools/fault_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace ckpt::tools {
namespace {

bool SendAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t sent = ::send(fd, data, n, MSG_NOSIGNAL);
    if (sent <= 0) return false;
    data += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}

// The value of the Content-Length header in `head` (0 if none).
uint64_t ContentLength(const std::string& head) {
  std::string lower(head.size(), '\0');
  std::transform(head.begin(), head.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  const size_t at = lower.find("\ncontent-length:");
  if (at == std::string::npos) return 0;
  return std::strtoull(head.c_str() + at + 16, nullptr, 10);
}

// Copies from `from` to `to` until `from` ends (or `limit` bytes).
void Pump(int from, int to, uint64_t limit = ~uint64_t{0}) {
  char buffer[1 << 16];
  while (limit > 0) {
    const ssize_t n =
        ::recv(from, buffer, std::min<uint64_t>(sizeof(buffer), limit), 0);
    if (n <= 0 || !SendAll(to, buffer, static_cast<size_t>(n))) return;
    limit -= static_cast<uint64_t>(n);
  }
}

}  // namespace

FaultProxy::FaultProxy(int upstream_port) : upstream_port_(upstream_port) {}

FaultProxy::~FaultProxy() {
  stopping_ = true;
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns.swap(conns_);
  }
  for (std::thread& t : conns) t.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

bool FaultProxy::Start() {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listen_fd_ < 0 ||
      ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
          0 ||
      ::listen(listen_fd_, 64) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) !=
          0) {
    return false;
  }
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { Accept(); });
  return true;
}

std::string FaultProxy::endpoint() const {
  return "http://127.0.0.1:" + std::to_string(port_);
}

void FaultProxy::Arm(Fault fault, int count) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < count; ++i) armed_.push_back(fault);
}

FaultProxy::Fault FaultProxy::Next() {
  std::lock_guard<std::mutex> lock(mu_);
  if (armed_.empty()) return Fault::kNone;
  const Fault f = armed_.front();
  armed_.pop_front();
  return f;
}

void FaultProxy::Accept() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    conns_.emplace_back([this, client] { Serve(client); });
  }
}

void FaultProxy::Serve(int client) {
  // The request's head, and whatever of its body came with it.
  std::string head;
  char buffer[1 << 16];
  size_t end = std::string::npos;
  while (end == std::string::npos && head.size() < (1 << 20)) {
    const ssize_t n = ::recv(client, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      ::close(client);
      return;
    }
    head.append(buffer, static_cast<size_t>(n));
    end = head.find("\r\n\r\n");
  }
  std::string body = head.substr(end + 4);
  head.resize(end + 2);  // through the last header's CRLF
  const uint64_t length = ContentLength(head);
  const Fault fault = Next();
  if (fault == Fault::kReset) {
    ++injected_;
    linger hard{1, 0};  // close with RST, no answer
    ::setsockopt(client, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
    ::close(client);
    return;
  }
  if (fault == Fault::kStatus500 || fault == Fault::kStatus503) {
    ++injected_;
    // The body is read first, so that the client sees the answer.
    for (uint64_t left = length - std::min<uint64_t>(length, body.size());
         left > 0;) {
      const ssize_t n =
          ::recv(client, buffer, std::min<uint64_t>(sizeof(buffer), left), 0);
      if (n <= 0) break;
      left -= static_cast<uint64_t>(n);
    }
    const std::string xml =
        fault == Fault::kStatus503
            ? "<Error><Code>SlowDown</Code><Message>injected by the fault "
              "proxy</Message></Error>"
            : "<Error><Code>InternalError</Code><Message>injected by the "
              "fault proxy</Message></Error>";
    const std::string answer =
        std::string(fault == Fault::kStatus503
                        ? "HTTP/1.1 503 Service Unavailable\r\n"
                        : "HTTP/1.1 500 Internal Server Error\r\n") +
        "Content-Type: application/xml\r\nConnection: close\r\n"
        "Content-Length: " +
        std::to_string(xml.size()) + "\r\n\r\n" + xml;
    SendAll(client, answer.data(), answer.size());
    ::shutdown(client, SHUT_WR);
    ::close(client);
    return;
  }
  if (fault == Fault::kSlow) {
    ++injected_;
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  if (fault == Fault::kCorrupt) {
    while (body.empty() && length > 0) {
      const ssize_t n = ::recv(client, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      body.append(buffer, static_cast<size_t>(n));
    }
    if (!body.empty()) {
      ++injected_;
      body[body.size() / 2] ^= 0x01;
    }
  }
  const int upstream = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(upstream_port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (upstream < 0 || ::connect(upstream, reinterpret_cast<sockaddr*>(&addr),
                                sizeof(addr)) != 0) {
    if (upstream >= 0) ::close(upstream);
    ::close(client);
    return;
  }
  ++forwarded_;
  head += "Connection: close\r\n\r\n";
  if (SendAll(upstream, head.data(), head.size()) &&
      SendAll(upstream, body.data(), body.size())) {
    if (body.size() < length) Pump(client, upstream, length - body.size());
    Pump(upstream, client);
  }
  ::close(upstream);
  ::close(client);
}

}  // namespace ckpt::tools
