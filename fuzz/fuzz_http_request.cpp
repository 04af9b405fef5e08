// Raw bytes from a client into the server's request parsing (server/http_request_parser.h): Beast's
// read algorithms (http::read_header, then http::read for the body, as the server's async versions)
// drive RequestParser over a stream that hands out the input a few bytes at a time, into a read buffer
// of the server's size; pipelined requests follow one another until one fails or closes.
// Byte 0: how many bytes each read returns (1..255; 0 = all at once). Byte 1: the limits — the server's
// defaults, or tight ones (4 headers, 256 header bytes, 64 body bytes) so the limit paths are reached.
// The rest is the connection's bytes. Allowed outcomes: a request within the limits, a 4xx answer
// (400 / 413 / 431), or a quiet close. Anything else aborts.
#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/system/system_error.hpp>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/http_request_parser.h"

using namespace kvpack::server;
namespace http = boost::beast::http;
using error_code = boost::system::error_code;

namespace {

// A SyncReadStream over the input: at most `chunk` bytes per read_some, then end-of-file.
class ByteStream {
 public:
  ByteStream(const uint8_t* p, size_t n, size_t chunk) : p_(p), n_(n), chunk_(chunk) {}
  template <class Buffers>
  size_t read_some(const Buffers& b, error_code& ec) {
    if (n_ == 0) {
      ec = boost::asio::error::eof;
      return 0;
    }
    const size_t k = boost::asio::buffer_copy(b, boost::asio::buffer(p_, std::min(n_, chunk_)));
    p_ += k;
    n_ -= k;
    ec = {};
    return k;
  }
  template <class Buffers>
  size_t read_some(const Buffers& b) {
    error_code ec;
    const size_t k = read_some(b, ec);
    if (ec) throw boost::system::system_error(ec);
    return k;
  }

 private:
  const uint8_t* p_;
  size_t n_, chunk_;
};

void check_answer(const std::optional<HttpError>& e) {
  if (!e) return;  // a quiet close
  if (e->status != 400 && e->status != 413 && e->status != 431) std::abort();
  if (e->message.empty() || e->code.empty()) std::abort();
}

// What the server goes on to use from a header: within the limits, and a version it can answer.
void check_head(const RequestParser& p, const HttpLimits& lim) {
  const HttpRequest& r = p.req;
  if (r.method.empty() || (r.version != 10 && r.version != 11)) std::abort();
  if (static_cast<int32_t>(r.headers.size()) > lim.max_headers) std::abort();
  size_t bytes = r.method.size() + r.target.size() + 11;  // as RequestParser charges them
  for (const auto& [k, v] : r.headers) bytes += k.size() + v.size() + 4;
  if (bytes > lim.max_header_bytes) std::abort();
  if (r.path.size() > r.target.size() || r.target.compare(0, r.path.size(), r.path) != 0) std::abort();
  (void)r.header("content-length");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  HttpLimits lim;
  if (data[1] & 1) {
    lim.max_headers = 4;
    lim.max_header_bytes = 256;
    lim.max_body_bytes = 64;
  }
  ByteStream in(data + 2, size - 2, data[0] == 0 ? size : data[0]);
  boost::beast::flat_buffer buf(read_buffer_bytes(lim));
  for (int i = 0; i < 64; ++i) {  // pipelined requests on one connection
    RequestParser p(lim);
    error_code ec;
    http::read_header(in, buf, p, ec);
    if (ec) return check_answer(read_error_answer(ec, true, p.too_many_headers, lim)), 0;
    check_head(p, lim);
    if (const auto e = head_error(p.req)) return check_answer(e), 0;
    if (!p.is_done()) http::read(in, buf, p, ec);
    if (ec) return check_answer(read_error_answer(ec, false, p.too_many_headers, lim)), 0;
    if (!p.is_done()) std::abort();
    const HttpRequest& r = p.req;
    if (r.body.size() > lim.max_body_bytes) std::abort();
    if (const auto len = p.content_length(); len && !p.chunked() && r.body.size() != *len) std::abort();
    if (!p.keep_alive()) return 0;
  }
  return 0;
}
