// HttpTransport: one HTTP exchange over libcurl, on connections kept alive
// between calls (a pool of curl handles). The request body comes from
// memory; the response body goes to a string, or straight into a caller's
// buffer (a ranged GET landing in place). libcurl's own errors become
// absl::Status here and nowhere else: those a retry may cure (connection
// refused or reset, timeouts, nothing received) are Unavailable.
//
// Thread-safety: thread-safe; each exchange uses a handle of its own.
#ifndef CKPT_IO_S3_HTTP_TRANSPORT_H_
#define CKPT_IO_S3_HTTP_TRANSPORT_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ckpt::io::s3 {

struct HttpExchange {
  std::string method;
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;  // Host included
  absl::Span<const uint8_t> body;
  // Where a 2xx response's body goes when not empty: at most this many bytes
  // (more is an error; `landed` says how many came); other responses' bodies
  // go to `body`.
  absl::Span<uint8_t> into;
};

struct HttpResponse {
  long status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // names in lowercase
  uint64_t landed = 0;                         // bytes placed in `into`
};

struct HttpTimeouts {
  absl::Duration connect = absl::Seconds(10);
  // A transfer slower than this many bytes a second for `stall` is cut.
  long low_speed_bytes = 1024;
  absl::Duration stall = absl::Seconds(30);
};

class HttpTransport {
 public:
  explicit HttpTransport(HttpTimeouts timeouts);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // One attempt. Any HTTP status is a response; only a failure to exchange
  // one is an error (`what` names the call in it).
  absl::StatusOr<HttpResponse> Send(const HttpExchange& exchange,
                                    const std::string& what);

 private:
  void* TakeHandle();
  void GiveBack(void* handle);

  const HttpTimeouts timeouts_;
  absl::Mutex mu_;
  std::vector<void*> idle_ ABSL_GUARDED_BY(mu_);  // CURL*
};

}  // namespace ckpt::io::s3

#endif  // CKPT_IO_S3_HTTP_TRANSPORT_H_
