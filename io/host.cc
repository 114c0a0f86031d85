#include "io/host.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ckpt::io {
namespace {

// Canonical text of an address; an IPv4-mapped IPv6 address as IPv4.
std::string TextOf(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
  } else if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      ::inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], text, sizeof text);
    } else {
      ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    }
  }
  return text;
}

bool IsLoopbackAddress(const std::string& text) {
  in_addr v4{};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  return ::inet_pton(AF_INET6, text.c_str(), &v6) == 1 &&
         IN6_IS_ADDR_LOOPBACK(&v6);
}

}  // namespace

std::string BareHost(absl::string_view host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host.remove_prefix(1);
    host.remove_suffix(1);
  }
  return std::string(host);
}

absl::StatusOr<std::string> HostOfAddress(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon + 1 == address.size() ||
      (address.front() == '[' && address[colon - 1] != ']')) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", address, "\" is not HOST:PORT"));
  }
  return BareHost(address.substr(0, colon));
}

absl::StatusOr<std::vector<std::string>> ResolveHost(absl::string_view host) {
  const std::string bare = BareHost(host);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(bare.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve \"", bare, "\": ", ::gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    std::string text = TextOf(a->ai_addr);
    if (!text.empty()) out.push_back(std::move(text));
  }
  ::freeaddrinfo(found);
  return out;
}

bool IsLoopbackHost(absl::string_view host) {
  const std::string bare = BareHost(host);
  if (bare.empty()) return false;
  absl::StatusOr<std::vector<std::string>> addresses = ResolveHost(bare);
  if (!addresses.ok() || addresses->empty()) return false;
  for (const std::string& a : *addresses) {
    if (!IsLoopbackAddress(a)) return false;
  }
  return true;
}

std::string IpOfGrpcPeer(absl::string_view peer) {
  if (!absl::ConsumePrefix(&peer, "ipv4:") &&
      !absl::ConsumePrefix(&peer, "ipv6:")) {
    return "";
  }
  peer = absl::StripPrefix(peer, "//");  // some versions write ipv4://...
  const size_t colon = peer.rfind(':');
  if (colon == absl::string_view::npos) return "";
  std::string ip = BareHost(peer.substr(0, colon));
  // Percent-encoded scope ids ("fe80::1%25eth0") stay as they are; an
  // IPv4-mapped address becomes IPv4, as ResolveHost writes it.
  if (absl::StartsWith(ip, "::ffff:") && ip.find('.') != std::string::npos) {
    ip = ip.substr(7);
  }
  return ip;
}

std::string UnixSocketTarget(absl::string_view path) {
  return absl::StrCat("unix:", path);
}

}  // namespace ckpt::io
