// FaultProxy: an HTTP proxy on a loopback port in front of a local server
// (the tests' and the chaos harness's S3 server), which answers requests
// itself with the faults an object store shows: an HTTP 500 or 503 with
// S3's error body, a connection reset before any answer, an answer held
// back for a while, or a request's body damaged on the way. Each connection
// carries one request (the proxy asks the server to close after it), so faults
// land request by request. Faults are armed for the next N requests; what was
// injected is counted.
//
// Thread-safety: thread-safe.
#ifndef CKPT_TOOLS_FAULT_PROXY_H_
#define CKPT_TOOLS_FAULT_PROXY_H_

#include <atomic>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ckpt::tools {

class FaultProxy {
 public:
  // kCorrupt passes the request on with a byte of its body flipped.
  enum class Fault { kNone, kStatus500, kStatus503, kReset, kSlow, kCorrupt };

  explicit FaultProxy(int upstream_port);
  ~FaultProxy();  // stops listening, waits for the connections
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  // Listens on a free loopback port; false if it cannot.
  bool Start();
  // http://127.0.0.1:<port>
  std::string endpoint() const;

  // The next `count` requests get `fault` (after those armed before).
  void Arm(Fault fault, int count);
  // Requests answered with a fault so far.
  int injected() const { return injected_.load(); }
  // Requests passed to the server so far.
  int forwarded() const { return forwarded_.load(); }

 private:
  void Accept();
  void Serve(int client);
  Fault Next();

  const int upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> injected_{0}, forwarded_{0};
  std::mutex mu_;
  std::deque<Fault> armed_;         // guarded by mu_
  std::vector<std::thread> conns_;  // guarded by mu_
  std::thread acceptor_;
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_FAULT_PROXY_H_
