// UniqueFd owns a file descriptor and closes it when it goes: for the few
// places that hand a raw descriptor to code outside io::FileSystem (a forked
// child writing a staging slot, a lock held for a process's life).
//
// Thread-safety: a value type; one owner at a time.
#ifndef CKPT_IO_UNIQUE_FD_H_
#define CKPT_IO_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace ckpt::io {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) Reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes the descriptor held, and holds `fd` instead.
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace ckpt::io

#endif  // CKPT_IO_UNIQUE_FD_H_
