// How `kvpack serve` turns bytes from a client into an HttpRequest (server/http_request.h), in its own
// header so the fuzzer (fuzz/fuzz_http_request.cpp) drives exactly the code the server runs.
//
// RequestParser is Boost.Beast's strict incremental HTTP/1.1 parser (basic_parser) with callbacks that
// keep only what the server needs and enforce the limits as bytes arrive: header bytes (Beast's
// header_limit on the raw bytes of the request line and of the field block, and the total of request
// line and fields as kept, charged in the callbacks), header count, body bytes (Content-Length checked before any
// body byte is read; chunked bodies as they arrive). Nothing is reserved from what the client announces:
// the body grows only with bytes actually received. The server reads the header with
// http::async_read_header, asks its handlers, then reads the body with http::async_read, into a
// flat_buffer of read_buffer_bytes(limits).
//
// read_error_answer says what a failed read becomes: a 4xx answer (then the connection closes) or a
// quiet close (the client went away). head_error is the check the server makes on a complete header
// before anything else. Neither ever gives a 5xx.
// Thread-safety: a parser belongs to one connection (its strand); the functions are pure.
#pragma once
#include <boost/beast/http/basic_parser.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "server/http_request.h"

namespace kvpack::server {

class RequestParser final : public boost::beast::http::basic_parser<true> {
 public:
  using error_code = boost::system::error_code;
  explicit RequestParser(const HttpLimits& l);
  HttpRequest req;
  bool too_many_headers = false;  // the header_limit error came from the field count, not the bytes

 private:
  void on_request_impl(boost::beast::http::verb, boost::beast::string_view method, boost::beast::string_view target,
                       int version, error_code&) override;
  void on_response_impl(int, boost::beast::string_view, int, error_code& ec) override;
  void on_field_impl(boost::beast::http::field, boost::beast::string_view name, boost::beast::string_view value,
                     error_code& ec) override;
  void on_header_impl(error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>& length, error_code& ec) override;
  size_t on_body_impl(boost::beast::string_view s, error_code& ec) override { return append(s, ec); }
  void on_chunk_header_impl(std::uint64_t, boost::beast::string_view, error_code&) override {}
  size_t on_chunk_body_impl(std::uint64_t, boost::beast::string_view s, error_code& ec) override { return append(s, ec); }
  void on_finish_impl(error_code&) override {}
  size_t append(boost::beast::string_view s, error_code& ec);

  int32_t max_headers_;
  size_t max_header_bytes_;
  size_t header_bytes_ = 0;  // request line + fields as kept (see on_request_impl)
  size_t max_body_;
};

// Size of a connection's read buffer: a whole header plus some room for the start of the body (or for
// the next pipelined request).
size_t read_buffer_bytes(const HttpLimits& l);

// An answer the HTTP layer gives on its own (then closes the connection).
struct HttpError {
  int status = 400;
  std::string message;
  std::string code;  // OpenAI-style error code
};

// A header or body read that failed with `ec` (`in_header`: during the header). nullopt: the client
// closed or reset the connection, there is nobody to answer. A timeout is not a read error here (the
// server answers 408 itself).
std::optional<HttpError> read_error_answer(const boost::system::error_code& ec, bool in_header, bool too_many_headers,
                                           const HttpLimits& l);
// A complete header the server refuses before routing (e.g. a target that is not an absolute path).
std::optional<HttpError> head_error(const HttpRequest& head);

}  // namespace kvpack::server
