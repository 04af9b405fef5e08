// The plain data of one HTTP request and the limits a request must stay within: what the HTTP layer
// (server/http_server.h) hands to its handlers and what its parser (server/http_request_parser.h)
// fills in. No Boost here, so the API layer can include it cheaply.
// Thread-safety: plain values; no shared state.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvpack::server {

struct HttpLimits {
  double header_timeout_s = 10;   // request line + headers, from accept / from the first byte
  double body_timeout_s = 30;     // the whole body, after the header
  double idle_timeout_s = 5;      // keep-alive: wait for the next request's first byte
  double write_timeout_s = 30;    // one response write (a stream: each write)
  double linger_s = 2;            // after an error response: read (and drop) what the client still sends
  size_t max_header_bytes = 16 * 1024;
  int32_t max_headers = 100;
  size_t max_body_bytes = 1 << 20;
  int32_t max_connections = 4096;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;   // as sent ("GET", "POST", ...)
  std::string target;   // as sent
  std::string path;     // target up to '?'
  int version = 11;     // 10 or 11
  HttpHeaders headers;  // in order, names as sent
  std::string body;
  bool has_body = false;  // Content-Length > 0 or chunked (known once the header is read)
  // First value of a header (case-insensitive name), "" when absent.
  std::string header(std::string_view name) const;
};

}  // namespace kvpack::server
