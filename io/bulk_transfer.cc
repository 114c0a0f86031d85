#include "io/bulk_transfer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "io/errno_status.h"
#include "io/file_system.h"
#include "io/host.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/secure_random.h"
#include "io/status_macros.h"

namespace ckpt::io {
namespace {

constexpr uint64_t kNoSuchTicket = ~uint64_t{0};
constexpr absl::Duration kTicketLife = absl::Seconds(30);
// A peer that stops reading is dropped after this.
constexpr int kIoTimeoutS = 30;
// A connection must present its ticket this soon: the fetching node sends it
// right after connecting, so a connection that stays silent only holds a slot.
constexpr int kTicketTimeoutS = 5;

void SetTimeouts(int fd, int seconds) {
  timeval tv{.tv_sec = seconds, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// Connects `fd` within `timeout`; returns 0, or the errno it failed with. A
// connect interrupted by a signal (EINTR), or cut short by the socket's send
// timeout (EINPROGRESS), goes on in the kernel: its outcome is waited for
// and read from SO_ERROR.
int Connect(int fd, const sockaddr_storage& addr, socklen_t len,
            absl::Duration timeout) {
  // One deadline for the connect and the wait after it.
  const absl::Time deadline = absl::Now() + timeout;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) == 0) {
    return 0;
  }
  if (errno != EINTR && errno != EINPROGRESS) return errno;
  for (;;) {
    pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
    const int64_t left_ms = std::clamp<int64_t>(
        absl::ToInt64Milliseconds(deadline - absl::Now()), 0, 1 << 30);
    const int ready = ::poll(&p, 1, static_cast<int>(left_ms));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return errno;
    if (ready == 0) return ETIMEDOUT;
    int error = 0;
    socklen_t size = sizeof error;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) {
      return errno;
    }
    return error;
  }
}

// Sends or receives exactly `n` bytes; false (errno set) when the peer went
// away or timed out.
bool SendAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    p += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}
bool RecvAll(int fd, void* data, size_t n) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, MSG_WAITALL);
    if (got < 0 && errno == EINTR) continue;
    if (got == 0) errno = ECONNRESET;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

void PutLe64(uint64_t v, uint8_t out[8]) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetLe64(const uint8_t in[8]) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | in[i];
  return v;
}

// The first IPv4 or IPv6 address of `host` (numeric or a name).
absl::StatusOr<sockaddr_storage> Resolve(const std::string& host, int port,
                                         socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc =
      ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bulk transfers: cannot resolve \"", host, "\": ", gai_strerror(rc)));
  }
  sockaddr_storage addr{};
  std::memcpy(&addr, found->ai_addr, found->ai_addrlen);
  *len = found->ai_addrlen;
  ::freeaddrinfo(found);
  return addr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BulkServer>> BulkServer::Start(
    const std::string& host, const BulkLimits& limits) {
  const std::string bare = BareHost(host);
  socklen_t len = 0;
  absl::StatusOr<sockaddr_storage> addr = Resolve(bare, 0, &len);
  if (!addr.ok()) return addr.status();
  const int fd = ::socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return io::ErrnoToStatus(errno, "bulk transfers: socket");
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&*addr), len) != 0 ||
      ::listen(fd, 64) != 0) {
    const int err = errno;
    ::close(fd);
    return io::ErrnoToStatus(
        err, absl::StrCat("bulk transfers: listening on ", host));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  const int port =
      ntohs(bound.ss_family == AF_INET6
                ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  std::unique_ptr<BulkServer> server(new BulkServer(fd, port, limits));
  BulkServer* self = server.get();
  server->acceptor_ = std::thread([self] { self->AcceptLoop(); });
  return server;
}

BulkServer::~BulkServer() {
  stopping_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  ::close(listener_);
  absl::MutexLock lock(&mu_);
  for (int c : connections_) ::shutdown(c, SHUT_RDWR);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return serving_ == 0; };
  mu_.Await(absl::Condition(&idle));
  for (auto& [token, offered] : tickets_) {
    if (offered.fd >= 0) ::close(offered.fd);
  }
  tickets_.clear();
}

absl::StatusOr<int> BulkServer::OpenForOffer(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io::ErrnoToStatus(errno, "opening " + path);
  // Held while the ticket lives: the file is not recycled under the sender.
  if (absl::Status locked = io::LockForReading(fd, path); !locked.ok()) {
    ::close(fd);
    return locked;
  }
  return fd;
}

absl::StatusOr<BulkServer::Ticket> BulkServer::Offer(const std::string& path,
                                                     uint64_t offset) {
  RETURN_IF_ERROR(RoomForTicket());
  ASSIGN_OR_RETURN(const int fd, OpenForOffer(path));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return io::ErrnoToStatus(err, "fstat " + path);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (offset > size) {
    ::close(fd);
    return absl::OutOfRangeError(absl::StrCat("offset ", offset,
                                              " is past the end of ", path,
                                              " (", size, " bytes)"));
  }
  return Issue(
      Offered{fd, size - offset, absl::Now() + kTicketLife, nullptr, offset});
}

absl::StatusOr<BulkServer::Ticket> BulkServer::Offer(const std::string& path,
                                                     uint64_t offset,
                                                     uint64_t size,
                                                     Arriving arriving) {
  if (offset > size) {
    return absl::OutOfRangeError(absl::StrCat(
        "offset ", offset, " is past the end of ", path, " (", size, ")"));
  }
  RETURN_IF_ERROR(RoomForTicket());
  ASSIGN_OR_RETURN(const int fd, OpenForOffer(path));
  return Issue(Offered{fd, size - offset, absl::Now() + kTicketLife, nullptr,
                       offset, std::move(arriving)});
}

absl::StatusOr<BulkServer::Ticket> BulkServer::Offer(
    std::unique_ptr<ReadableFile> file, uint64_t bytes) {
  if (file == nullptr) return absl::InvalidArgumentError("no file to offer");
  RETURN_IF_ERROR(RoomForTicket());
  return Issue(Offered{-1, bytes, absl::Now() + kTicketLife, std::move(file)});
}

absl::Status BulkServer::RoomForTicket() {
  absl::MutexLock lock(&mu_);
  Expire();
  if (tickets_.size() >= limits_.max_tickets) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "bulk transfers: ", tickets_.size(),
        " tickets are outstanding (the most this node issues); fetch over "
        "the peer service's stream instead, or retry"));
  }
  return absl::OkStatus();
}

BulkServer::Ticket BulkServer::Issue(Offered offered) {
  Ticket t;
  t.bytes = offered.bytes;
  t.token = SecureRandomBytes(kTicketBytes);
  absl::MutexLock lock(&mu_);
  Expire();
  tickets_[t.token] = std::move(offered);
  return t;
}

size_t BulkServer::outstanding() const {
  absl::MutexLock lock(&mu_);
  return tickets_.size();
}

uint64_t BulkServer::refused_connections() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

void BulkServer::Expire() {
  const absl::Time now = absl::Now();
  for (auto it = tickets_.begin(); it != tickets_.end();) {
    if (it->second.expires < now) {
      if (it->second.fd >= 0) ::close(it->second.fd);
      it = tickets_.erase(it);
    } else {
      ++it;
    }
  }
}

void BulkServer::AcceptLoop() {
  while (!stopping_) {
    pollfd p{.fd = listener_, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int c = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      ::close(c);
      break;
    }
    if (connections_.size() >= limits_.max_connections) {
      // Refused at once, before a thread: a flood of connections costs this
      // node an accept and a close each. The fetcher falls back to the
      // peer service's stream.
      ++refused_;
      ::close(c);
      continue;
    }
    connections_.insert(c);
    ++serving_;
    std::thread([this, c] { Serve(c); }).detach();
  }
}

void BulkServer::Serve(int connection) {
  // sendfile to a peer that hung up raises SIGPIPE (it has no MSG_NOSIGNAL):
  // blocked on this thread, which exits with it pending and discarded.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  SetTimeouts(connection, kTicketTimeoutS);
  std::string token(kTicketBytes, '\0');
  Offered offered{-1, kNoSuchTicket, absl::InfinitePast(), nullptr};
  bool found = false;
  const bool got_ticket = RecvAll(connection, token.data(), token.size());
  SetTimeouts(connection, kIoTimeoutS);
  if (got_ticket) {
    absl::MutexLock lock(&mu_);
    Expire();
    auto it = tickets_.find(token);
    if (it != tickets_.end()) {  // one use
      offered = std::move(it->second);
      found = true;
      tickets_.erase(it);
    }
  }
  uint8_t header[8];
  PutLe64(offered.bytes, header);
  if (SendAll(connection, header, sizeof header) && found)
    Send(connection, offered);
  if (offered.fd >= 0) ::close(offered.fd);
  absl::MutexLock lock(&mu_);
  connections_.erase(connection);
  ::close(connection);
  --serving_;
}

void BulkServer::Send(int connection, const Offered& offered) const {
  const uint64_t bytes = offered.bytes;
  if (offered.fd < 0) {
    std::vector<uint8_t> buffer(std::min<uint64_t>(bytes, 1u << 20));
    for (uint64_t at = 0; at < bytes;) {
      CKPT_KILL_POINT("bulk.sending");
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(buffer.size(), bytes - at));
      AcquireSend(limits_.send_rate, n);
      absl::Status read =
          offered.file->Read(at, absl::MakeSpan(buffer.data(), n));
      if (!read.ok() || !SendAll(connection, buffer.data(), n)) {
        CKPT_LOG_WARN("bulk transfer: sent {} of {} bytes: {}", at, bytes,
                      read.ok() ? "the receiver hung up" : read.ToString());
        return;
      }
      at += n;
    }
    return;
  }
  off_t at = static_cast<off_t>(offered.start);
  const uint64_t end = offered.start + bytes;
  while (static_cast<uint64_t>(at) < end) {
    CKPT_KILL_POINT("bulk.sending");
    // In pieces of 1 MiB when the sends are capped or the file arrives.
    const bool paced = limits_.send_rate != nullptr || offered.arriving;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(
        end - static_cast<uint64_t>(at), paced ? 1u << 20 : 1u << 30));
    if (offered.arriving) {
      if (absl::Status there = offered.arriving(static_cast<uint64_t>(at) + n);
          !there.ok()) {
        CKPT_LOG_WARN("bulk transfer: sent {} of {} bytes: {}", at, bytes,
                      there.ToString());
        return;
      }
    }
    AcquireSend(limits_.send_rate, n);
    const ssize_t sent = ::sendfile(connection, offered.fd, &at, n);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) {
      CKPT_LOG_WARN("bulk transfer: sent {} of {} bytes: {}", at, bytes,
                    sent < 0 ? std::strerror(errno) : "the file shrank");
      return;
    }
  }
}

absl::StatusOr<std::unique_ptr<BulkStream>> BulkStream::Open(
    const std::string& host, int port, absl::string_view ticket,
    absl::Duration timeout) {
  const std::string where =
      absl::StrCat("bulk transfer from ", host, ":", port);
  const std::string bare = BareHost(host);
  socklen_t len = 0;
  absl::StatusOr<sockaddr_storage> addr = Resolve(bare, port, &len);
  if (!addr.ok()) return addr.status();
  const int fd = ::socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return io::ErrnoToStatus(errno, where + ": socket");
  std::unique_ptr<BulkStream> stream(new BulkStream(fd, where));
  SetTimeouts(fd, static_cast<int>(
                      std::max<int64_t>(1, absl::ToInt64Seconds(timeout))));
  uint8_t header[8];
  if (const int error = Connect(fd, *addr, len, timeout); error != 0) {
    return io::ErrnoToStatus(error, where + ": connect");
  }
  if (!SendAll(fd, ticket.data(), ticket.size()) ||
      !RecvAll(fd, header, sizeof header)) {
    return io::ErrnoToStatus(errno, where + ": presenting the ticket");
  }
  stream->size_ = GetLe64(header);
  if (stream->size_ == kNoSuchTicket) {
    return absl::NotFoundError(
        where + ": the ticket is unknown (used, or expired after " +
        absl::FormatDuration(kTicketLife) + ")");
  }
  return stream;
}

BulkStream::~BulkStream() { ::close(fd_); }

absl::Status BulkStream::Read(absl::Span<uint8_t> dst) {
  if (dst.size() > size_ - received_) {
    return absl::OutOfRangeError(
        absl::StrCat(where_, ": ", dst.size(), " bytes wanted, ",
                     size_ - received_, " left of ", size_));
  }
  if (!RecvAll(fd_, dst.data(), dst.size())) {
    return io::ErrnoToStatus(
        errno, absl::StrCat(where_, ": receiving the file (", received_, " of ",
                            size_, " bytes arrived)"));
  }
  received_ += dst.size();
  return absl::OkStatus();
}

absl::Status BulkFetch(const std::string& host, int port,
                       absl::string_view ticket, absl::Span<uint8_t> dst,
                       absl::Duration timeout,
                       const std::function<void(uint64_t)>& progress) {
  ASSIGN_OR_RETURN(std::unique_ptr<BulkStream> stream,
                   BulkStream::Open(host, port, ticket, timeout));
  if (stream->size() != dst.size()) {
    return absl::DataLossError(
        absl::StrCat("bulk transfer from ", host, ":", port, ": the file is ",
                     stream->size(), " bytes, ", dst.size(), " expected"));
  }
  constexpr size_t kPiece = 4 << 20;
  for (size_t at = 0; at < dst.size();) {
    const size_t n =
        progress ? std::min(kPiece, dst.size() - at) : dst.size() - at;
    RETURN_IF_ERROR(stream->Read(dst.subspan(at, n)));
    at += n;
    if (progress) progress(at);
  }
  return absl::OkStatus();
}

}  // namespace ckpt::io
