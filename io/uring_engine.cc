#include "io/uring_engine.h"

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "io/errno_status.h"
#include "io/status_macros.h"

namespace ckpt::io {

struct UringEngine::Request {
  bool is_write;
  int fd;
  const std::string* path;
  uint8_t* buf;
  size_t length;
  uint64_t offset;
  size_t done_bytes = 0;  // completed so far (short completions)
  size_t submitted = 0;   // length of the submission in flight
  bool injected_error = false;
  int injected_errno = 0;
  Callback done;
};

UringEngine::UringEngine(const UringEngineOptions& options)
    : options_(options) {}

absl::StatusOr<std::unique_ptr<UringEngine>> UringEngine::Create(
    const UringEngineOptions& options) {
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("io_uring queue depth must be in [1, 4096], got ",
                     options.queue_depth));
  }
  std::unique_ptr<UringEngine> engine(new UringEngine(options));
  int rc = io_uring_queue_init(options.queue_depth, &engine->ring_, 0);
  if (rc < 0) return ErrnoToStatus(-rc, "io_uring_queue_init");
  engine->ring_ready_ = true;
  return engine;
}

UringEngine::~UringEngine() {
  if (!ring_ready_) return;
  // Nothing may still point into buffers the owner is about to free.
  (void)Drain();
  io_uring_queue_exit(&ring_);
}

absl::Status UringEngine::SubmitWrite(int fd, const std::string* path,
                                      const uint8_t* buf, size_t length,
                                      uint64_t offset, Callback done) {
  auto r = std::make_unique<Request>();
  *r = Request{true, fd, path, const_cast<uint8_t*>(buf), length, offset};
  r->done = std::move(done);
  return Submit(std::move(r));
}

absl::Status UringEngine::SubmitRead(int fd, const std::string* path,
                                     uint8_t* buf, size_t length,
                                     uint64_t offset, Callback done) {
  auto r = std::make_unique<Request>();
  *r = Request{false, fd, path, buf, length, offset};
  r->done = std::move(done);
  return Submit(std::move(r));
}

absl::Status UringEngine::Submit(std::unique_ptr<Request> request) {
  while (in_flight_ >= options_.queue_depth || !retry_.empty()) {
    RETURN_IF_ERROR(ReapOne());
  }
  return Push(request.release());
}

// Prepares and submits the remaining part of `r`. The caller guarantees a free
// slot.
absl::Status UringEngine::Push(Request* r) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) {
    absl::Status status =
        absl::InternalError("io_uring: no free submission entry");
    Complete(r, status);
    return status;
  }
  size_t remaining = r->length - r->done_bytes;
  UringFault fault;
  if (options_.fault_hook) {
    fault = options_.fault_hook(
        UringRequestInfo{r->is_write, r->offset + r->done_bytes, remaining});
  }
  r->injected_error = false;
  if (fault.kind == UringFault::kErrno) {
    io_uring_prep_nop(sqe);
    r->injected_error = true;
    r->injected_errno = fault.err;
    r->submitted = 0;
  } else {
    size_t len = remaining;
    if (fault.kind == UringFault::kShort && fault.short_length > 0 &&
        fault.short_length < remaining) {
      len = fault.short_length;
    }
    r->submitted = len;
    if (r->is_write) {
      io_uring_prep_write(sqe, r->fd, r->buf + r->done_bytes, len,
                          r->offset + r->done_bytes);
    } else {
      io_uring_prep_read(sqe, r->fd, r->buf + r->done_bytes, len,
                         r->offset + r->done_bytes);
    }
  }
  io_uring_sqe_set_data(sqe, r);
  ++in_flight_;
  // A failed submit (EAGAIN/EBUSY under memory pressure) leaves the entry in
  // the submission queue; ReapOne() submits it again before waiting, so every
  // request completes exactly once.
  int rc;
  do {
    rc = io_uring_submit(&ring_);
  } while (rc == -EINTR);
  return absl::OkStatus();
}

absl::Status UringEngine::ReapOne() {
  if (!retry_.empty() && in_flight_ < options_.queue_depth) {
    Request* r = retry_.back();
    retry_.pop_back();
    return Push(r);
  }
  if (in_flight_ == 0) return absl::OkStatus();
  io_uring_cqe* cqe = nullptr;
  int rc;
  do {
    rc =
        io_uring_sq_ready(&ring_) > 0 ? io_uring_submit_and_wait(&ring_, 1) : 0;
    if (rc >= 0) rc = io_uring_wait_cqe(&ring_, &cqe);
  } while (rc == -EINTR || rc == -EAGAIN);
  if (rc < 0) return ErrnoToStatus(-rc, "io_uring_wait_cqe");
  auto* r = static_cast<Request*>(io_uring_cqe_get_data(cqe));
  const int res = cqe->res;
  io_uring_cqe_seen(&ring_, cqe);
  return Handle(r, res);
}

absl::Status UringEngine::Poll() {
  while (in_flight_ > 0) {
    io_uring_cqe* cqe = nullptr;
    if (io_uring_peek_cqe(&ring_, &cqe) != 0 || cqe == nullptr) break;
    auto* r = static_cast<Request*>(io_uring_cqe_get_data(cqe));
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    RETURN_IF_ERROR(Handle(r, res));
  }
  while (!retry_.empty() && in_flight_ < options_.queue_depth) {
    Request* r = retry_.back();
    retry_.pop_back();
    RETURN_IF_ERROR(Push(r));
  }
  return absl::OkStatus();
}

absl::Status UringEngine::Handle(Request* r, int res) {
  --in_flight_;
  if (r->injected_error) res = -r->injected_errno;

  if (res == -EAGAIN || res == -EINTR) {
    retry_.push_back(r);  // the whole remaining part again
    return absl::OkStatus();
  }
  if (res < 0) {
    Complete(r,
             ErrnoToStatus(
                 -res, absl::StrCat(r->is_write ? "write " : "read ", *r->path,
                                    " at offset ", r->offset + r->done_bytes)));
    return absl::OkStatus();
  }
  if (res == 0 && r->submitted > 0) {
    Complete(r, absl::OutOfRangeError(absl::StrCat(
                    r->is_write ? "write " : "read ", *r->path, " at offset ",
                    r->offset + r->done_bytes, ": ",
                    r->is_write ? "no progress" : "end of file", " with ",
                    r->length - r->done_bytes, " bytes left")));
    return absl::OkStatus();
  }
  r->done_bytes += static_cast<size_t>(res);
  if (r->done_bytes < r->length) {
    retry_.push_back(r);  // short completion: send the remainder
    return absl::OkStatus();
  }
  Complete(r, absl::OkStatus());
  return absl::OkStatus();
}

void UringEngine::Complete(Request* r, absl::Status status) {
  std::unique_ptr<Request> owned(r);
  ++completed_;
  if (owned->done) owned->done(std::move(status));
}

absl::Status UringEngine::WaitAny() {
  const uint64_t before = completed_;
  while (completed_ == before && (in_flight_ > 0 || !retry_.empty())) {
    RETURN_IF_ERROR(ReapOne());
  }
  return absl::OkStatus();
}

absl::Status UringEngine::Drain() {
  while (in_flight_ > 0 || !retry_.empty()) {
    RETURN_IF_ERROR(ReapOne());
  }
  return absl::OkStatus();
}

}  // namespace ckpt::io
