#include "kv/cold_tier_io.h"

#include <unistd.h>

#include <cerrno>

namespace kvpack::kv::cold {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {

// Drops `n` transferred bytes from the front of iov[first..]; returns the new first entry.
size_t advance(std::span<iovec> iov, size_t first, size_t n) {
  while (n > 0 && first < iov.size()) {
    if (n >= iov[first].iov_len) {
      n -= iov[first].iov_len;
      iov[first].iov_len = 0;
      ++first;
    } else {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + n;
      iov[first].iov_len -= n;
      n = 0;
    }
  }
  while (first < iov.size() && iov[first].iov_len == 0) ++first;
  return first;
}

template <bool kWrite>
TransferResult transfer_fully(int fd, std::span<iovec> iov, int64_t offset) {
  TransferResult r;
  size_t first = advance(iov, 0, 0);
  while (first < iov.size()) {
    const int count = static_cast<int>(iov.size() - first);
    const ssize_t n = kWrite ? ::pwritev(fd, iov.data() + first, count, offset)
                             : ::preadv(fd, iov.data() + first, count, offset);
    ++r.calls;
    if (n < 0) {
      if (errno == EINTR) continue;
      r.error = errno;
      break;
    }
    if (n == 0) {
      if (kWrite) r.error = EIO;  // a write that makes no progress: treat as an I/O error, not a loop
      break;                      // a read at EOF: the file is shorter than asked (truncated)
    }
    r.bytes += static_cast<size_t>(n);
    offset += n;
    first = advance(iov, first, static_cast<size_t>(n));
  }
  return r;
}

}  // namespace

TransferResult read_fully(int fd, std::span<iovec> iov, int64_t offset) { return transfer_fully<false>(fd, iov, offset); }
TransferResult write_fully(int fd, std::span<iovec> iov, int64_t offset) { return transfer_fully<true>(fd, iov, offset); }

}  // namespace kvpack::kv::cold
