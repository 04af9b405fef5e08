#include "server/http_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace kvpack::server {
namespace {

// Waits up to timeout_ms for `events` on the socket; >0 ready, 0 timeout, <0 error.
int poll_fd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r > 0 && (p.revents & POLLNVAL)) return -1;
    return r;
  }
}

int to_ms(time_t sec, time_t usec) { return static_cast<int>(sec * 1000 + usec / 1000); }

// The peer closed (FIN), reset, or the socket failed. Pending request bytes (pipelining) are not a
// hang-up; only end-of-stream or an error is.
bool peer_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  int r;
  do r = ::poll(&p, 1, 0);
  while (r < 0 && errno == EINTR);
  if (r <= 0) return r < 0;
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

void address_of(const sockaddr_storage& a, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    const auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &s->sin_addr, buf, sizeof buf);
    port = ntohs(s->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &s->sin6_addr, buf, sizeof buf);
    port = ntohs(s->sin6_port);
  }
  ip = buf;
}

// httplib's SocketStream equivalent: buffered reads (httplib parses headers a byte at a time),
// timeouts on both directions, no SIGPIPE, not writable once the peer is gone.
class ConnStream final : public httplib::Stream {
 public:
  ConnStream(int fd, int read_ms, int write_ms) : fd_(fd), read_ms_(read_ms), write_ms_(write_ms) {}

  bool is_readable() const override { return off_ < len_ || poll_fd(fd_, POLLIN, read_ms_) > 0; }
  bool is_writable() const override { return poll_fd(fd_, POLLOUT, write_ms_) > 0 && !peer_closed(fd_); }

  ssize_t read(char* ptr, size_t size) override {
    if (off_ < len_) {
      const size_t n = std::min(size, len_ - off_);
      std::memcpy(ptr, buf_.data() + off_, n);
      off_ += n;
      return static_cast<ssize_t>(n);
    }
    if (poll_fd(fd_, POLLIN, read_ms_) <= 0) return -1;
    if (size >= buf_.size()) return recv_some(ptr, size);
    const ssize_t n = recv_some(buf_.data(), buf_.size());
    if (n <= 0) return n;
    off_ = 0;
    len_ = static_cast<size_t>(n);
    return read(ptr, size);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t l = sizeof a;
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &l) == 0) address_of(a, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t l = sizeof a;
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &l) == 0) address_of(a, ip, port);
  }
  socket_t socket() const override { return fd_; }
  bool buffered() const { return off_ < len_; }

 private:
  ssize_t recv_some(char* p, size_t n) {
    ssize_t r;
    do r = ::recv(fd_, p, n, 0);
    while (r < 0 && errno == EINTR);
    return r;
  }

  int fd_, read_ms_, write_ms_;
  std::array<char, 4096> buf_{};
  size_t off_ = 0, len_ = 0;
};

// The connection served by this thread (handlers run on the thread of their connection).
struct Connection {
  int fd = -1;
  bool close_after = false;
};
thread_local Connection t_conn;

}  // namespace

bool HttpServer::client_gone() { return t_conn.fd >= 0 && peer_closed(t_conn.fd); }

void HttpServer::close_after_response() { t_conn.close_after = true; }

void HttpServer::set_backlog(int n) {
  const socket_t s = svr_sock_;
  if (s != INVALID_SOCKET) ::listen(s, n);
}

bool HttpServer::wait_for_request(socket_t sock, bool buffered) const {
  if (buffered) return true;  // a pipelined request is already in our buffer
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
  // Short polls so that an idle keep-alive connection notices the server stopping.
  while (svr_sock_ != INVALID_SOCKET) {
    const int r = poll_fd(sock, POLLIN, 50);
    if (r != 0) return r > 0;
    if (std::chrono::steady_clock::now() > deadline) return false;
  }
  return false;
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  t_conn = Connection{sock, false};
  // SSE sends many small writes: without TCP_NODELAY, Nagle + delayed ACKs add ~40 ms stalls.
  const int one = 1;
  ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ConnStream strm(sock, to_ms(read_timeout_sec_, read_timeout_usec_), to_ms(write_timeout_sec_, write_timeout_usec_));
  bool ret = false;
  for (size_t left = keep_alive_max_count_; left > 0 && wait_for_request(sock, strm.buffered()); --left) {
    bool connection_closed = false;
    ret = process_request(strm, left == 1, connection_closed, nullptr);
    if (!ret || connection_closed || t_conn.close_after) break;
  }
  t_conn = Connection{};
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

}  // namespace kvpack::server
