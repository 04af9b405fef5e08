// Small POSIX helpers for the file cold tier (kv/cold_tier_file.h): an owning file descriptor and
// vectored positional I/O that finishes what it starts (EINTR and short transfers retried).
// Thread-safety: UniqueFd is a value type (one owner); transfer_fully is as thread-safe as pread/pwrite.
#pragma once
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace kvpack::kv::cold {

// Linux accepts at most UIO_MAXIOV (1024) iovecs per preadv/pwritev.
inline constexpr size_t kMaxIovecs = 1024;

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset(int fd = -1);  // closes the one held (close errors are ignored: nothing to retry)

 private:
  int fd_ = -1;
};

struct TransferResult {
  size_t bytes = 0;    // transferred before the end, EOF (reads) or an error
  int error = 0;       // errno of the failing call, 0 if none (EOF on a read is not an error)
  uint64_t calls = 0;  // system calls issued (retries included): what coalescing saves
};

// preadv / pwritev of all of `iov` (at most kMaxIovecs entries) at `offset`, retrying EINTR and short
// transfers. `iov` is consumed (entries are advanced in place).
TransferResult read_fully(int fd, std::span<iovec> iov, int64_t offset);
TransferResult write_fully(int fd, std::span<iovec> iov, int64_t offset);

}  // namespace kvpack::kv::cold
