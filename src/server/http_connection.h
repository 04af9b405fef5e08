// cpp-httplib 0.11 serves each connection in a private virtual (process_and_close_socket) and gives a
// handler no way to ask whether its client is still connected. HttpServer re-implements that
// connection loop with the same semantics (keep-alive count and timeout, read/write timeouts) over its
// own socket stream, so that:
//   * the handler thread knows its connection's socket: client_gone() polls it for a hang-up, which
//     lets a waiting non-streaming request be cancelled (and its KV pages freed) when its client
//     disconnects; a stream's is_writable() turns false the same way;
//   * writes use MSG_NOSIGNAL: a vanished client must not kill the server with SIGPIPE;
//   * a handler that leaves a request body unread (401, 413) can have the connection closed after its
//     response instead of parsing the leftover body as the next request.
// A client that half-closes its socket (shutdown(SHUT_WR)) right after sending a request counts as
// gone; HTTP/1.1 clients do not do that.
#pragma once
#include <httplib.h>

namespace kvpack::server {

class HttpServer : public httplib::Server {
 public:
  // On a handler thread: true once the client of the current connection has hung up or reset it.
  static bool client_gone();
  // On a handler thread: close the current connection after this response.
  static void close_after_response();
  // Raises the listen backlog after bind (httplib hard-codes 5, which makes a burst of clients wait
  // for SYN retransmits). Linux applies a second listen() to a listening socket.
  void set_backlog(int n);

 private:
  bool process_and_close_socket(socket_t sock) override;
  bool wait_for_request(socket_t sock, bool buffered) const;
};

}  // namespace kvpack::server
