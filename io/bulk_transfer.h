// BulkServer and BulkFetch move whole shard files between nodes over plain
// TCP, beside gRPC: the sending kernel sends the file from the page cache
// (sendfile) and the receiver's recv() writes straight into the mapped
// destination, so a transfer costs about what a TCP copy of the same bytes
// costs, without gRPC's framing and its copies of every 4 MiB message.
//
// A transfer is first offered over the peer service (OfferShard, a gRPC
// call): the offer names the port and a one-time 128-bit ticket, valid for
// 30 s, which the fetching node presents as the first bytes on the
// connection. The file is opened when it is offered, so garbage collection
// unlinking it meanwhile does not cut the transfer short. When the peer
// service runs with mutual TLS, no bulk server runs (the bytes would travel
// unencrypted): fetches then stream over gRPC.
//
// Limits (BulkLimits): at most `max_connections` connections are served at
// once (more are closed as they are accepted), a connection that does not
// present its ticket within 5 s is dropped, and at most `max_tickets` are
// outstanding (Offer is then ResourceExhausted): a flood of connections or
// offers costs this node bounded threads and file descriptors. Tickets come
// from the kernel's CSPRNG (getrandom).
//
// Wire: the client sends the 16-byte ticket; the server answers the file's
// size as 8 bytes little-endian (all ones: no such ticket) and then the file.
//
// Thread-safety: thread-safe; each connection is served on a thread of its
// own.
#ifndef CKPT_IO_BULK_TRANSFER_H_
#define CKPT_IO_BULK_TRANSFER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "io/file_system.h"
#include "io/rate_limiter.h"

namespace ckpt::io {

struct BulkLimits {
  size_t max_connections = 64;
  size_t max_tickets = 4096;
  // Every byte sent draws on it (null: as fast as the link goes); not owned.
  RateLimiter* send_rate = nullptr;
};

class BulkServer {
 public:
  static constexpr size_t kTicketBytes = 16;

  // Listens on `host` (an address of this host; the host of --peer-address)
  // at a port the kernel picks.
  static absl::StatusOr<std::unique_ptr<BulkServer>> Start(
      const std::string& host, const BulkLimits& limits = {});
  // Stops accepting, drops the tickets not used, and waits for the transfers
  // in flight (each bounded by its send timeout).
  ~BulkServer();

  int port() const { return port_; }

  struct Ticket {
    std::string token;  // kTicketBytes random bytes
    uint64_t bytes = 0;
  };
  // Opens `path` and returns a ticket that sends it once, from `offset` on.
  absl::StatusOr<Ticket> Offer(const std::string& path, uint64_t offset = 0);
  // Waits until the file's bytes before `end` are there; an error ends the
  // transfer.
  using Arriving = std::function<absl::Status(uint64_t end)>;
  // The same for a file still being written, `size` bytes when whole: each
  // piece is sent (sendfile) once `arriving` says it is there.
  absl::StatusOr<Ticket> Offer(const std::string& path, uint64_t offset,
                               uint64_t size, Arriving arriving);
  // A ticket that sends the first `bytes` bytes of `file` once (a file that is
  // not one on disk: a shard's self-contained view), read piece by piece.
  absl::StatusOr<Ticket> Offer(std::unique_ptr<ReadableFile> file,
                               uint64_t bytes);

  // Tickets issued and not yet used or expired (for tests).
  size_t outstanding() const;
  // Connections closed unserved because `max_connections` were being served.
  uint64_t refused_connections() const;

 private:
  BulkServer(int listener, int port, const BulkLimits& limits)
      : listener_(listener), port_(port), limits_(limits) {}
  absl::Status RoomForTicket();
  void AcceptLoop();
  void Serve(int connection);
  // Closes the files of tickets past their time.
  void Expire() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Offered {
    int fd;          // -1: `file`
    uint64_t bytes;  // to send
    absl::Time expires;
    std::shared_ptr<ReadableFile> file;
    uint64_t start = 0;  // of `fd`'s bytes
    Arriving arriving;   // `fd` is still being written
  };
  // Opens `path` for a ticket (locked for reading while it lives).
  static absl::StatusOr<int> OpenForOffer(const std::string& path);
  Ticket Issue(Offered offered);
  // Sends `offered`'s bytes (sendfile, or reads of its file).
  void Send(int connection, const Offered& offered) const;

  const int listener_;
  const int port_;
  const BulkLimits limits_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  mutable absl::Mutex mu_;
  std::map<std::string, Offered> tickets_ ABSL_GUARDED_BY(mu_);
  // Connections being served (shut down when the server stops).
  std::set<int> connections_ ABSL_GUARDED_BY(mu_);
  int serving_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

// The receiving end of one transfer, read in order, piece by piece (a shard
// file streamed into the memory its items go to: snapshot/shard_stream.h).
class BulkStream {
 public:
  // Connects to the bulk server at host:port, presents `ticket` and reads the
  // file's size; `timeout` bounds each wait for the server.
  static absl::StatusOr<std::unique_ptr<BulkStream>> Open(
      const std::string& host, int port, absl::string_view ticket,
      absl::Duration timeout);
  ~BulkStream();

  uint64_t size() const { return size_; }
  uint64_t received() const { return received_; }
  // Receives exactly dst.size() more bytes of the file. Errors name the
  // server.
  absl::Status Read(absl::Span<uint8_t> dst);

 private:
  BulkStream(int fd, std::string where) : fd_(fd), where_(std::move(where)) {}
  const int fd_;
  const std::string where_;
  uint64_t size_ = 0;
  uint64_t received_ = 0;
};

// Fetches the file `ticket` stands for from the bulk server at host:port into
// `dst`, which must be exactly the file's size; `timeout` bounds each wait for
// the server (a server silent that long fails the transfer); `progress`, when
// given, is called with the bytes received so far after every piece of at
// most 4 MiB. Errors name the server.
absl::Status BulkFetch(
    const std::string& host, int port, absl::string_view ticket,
    absl::Span<uint8_t> dst, absl::Duration timeout,
    const std::function<void(uint64_t received)>& progress = nullptr);

}  // namespace ckpt::io

#endif  // CKPT_IO_BULK_TRANSFER_H_
