#include "server/http_request_parser.h"

#include <algorithm>
#include <boost/beast/http/error.hpp>

namespace kvpack::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;

std::string_view sv(beast::string_view s) { return {s.data(), s.size()}; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return "";
}

RequestParser::RequestParser(const HttpLimits& l)
    : max_headers_(l.max_headers), max_header_bytes_(l.max_header_bytes), max_body_(l.max_body_bytes) {
  header_limit(static_cast<std::uint32_t>(std::min<size_t>(l.max_header_bytes, UINT32_MAX)));
  body_limit(static_cast<std::uint64_t>(l.max_body_bytes));
}

void RequestParser::on_request_impl(http::verb, beast::string_view method, beast::string_view target, int version,
                                    error_code&) {
  req.method = std::string(sv(method));
  req.target = std::string(sv(target));
  req.path = req.target.substr(0, req.target.find('?'));
  req.version = version;
  // Beast 1.74 bounds the request line and the field block by header_limit each (it never charges the
  // line against the fields), so a header could reach twice the limit. Charging what is kept here —
  // "METHOD TARGET HTTP/1.1\r\n", then "name: value\r\n" per field — holds it to the limit.
  header_bytes_ = req.method.size() + req.target.size() + 11;
}

// basic_parser<true> parses requests only; a status line is not a request.
void RequestParser::on_response_impl(int, beast::string_view, int, error_code& ec) { ec = http::error::bad_version; }

void RequestParser::on_field_impl(http::field, beast::string_view name, beast::string_view value, error_code& ec) {
  if (static_cast<int32_t>(req.headers.size()) >= max_headers_) {
    too_many_headers = true;
    ec = http::error::header_limit;
    return;
  }
  header_bytes_ += name.size() + value.size() + 4;
  if (header_bytes_ > max_header_bytes_) {
    ec = http::error::header_limit;
    return;
  }
  req.headers.emplace_back(std::string(sv(name)), std::string(sv(value)));
}

void RequestParser::on_body_init_impl(const boost::optional<std::uint64_t>& length, error_code& ec) {
  if (length && *length > max_body_) ec = http::error::body_limit;
}

size_t RequestParser::append(beast::string_view s, error_code& ec) {
  if (req.body.size() + s.size() > max_body_) {
    ec = http::error::body_limit;
    return 0;
  }
  req.body.append(s.data(), s.size());
  return s.size();
}

size_t read_buffer_bytes(const HttpLimits& l) { return l.max_header_bytes + 65536; }

std::optional<HttpError> read_error_answer(const boost::system::error_code& ec, bool in_header, bool too_many_headers,
                                           const HttpLimits& l) {
  if (ec == http::error::header_limit || (ec == http::error::buffer_overflow && in_header))
    return HttpError{431,
                     too_many_headers ? "too many request header fields (limit " + std::to_string(l.max_headers) + ")"
                                      : "request header too large (limit " + std::to_string(l.max_header_bytes) + " bytes)",
                     "request_header_fields_too_large"};
  if (ec == http::error::body_limit)
    return HttpError{413, "request body exceeds " + std::to_string(l.max_body_bytes) + " bytes", "request_too_large"};
  // The client closed (or reset) the connection: there is nobody to answer. Errors that are not the
  // parser's (socket errors) end the connection the same way.
  if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == http::error::short_read ||
      ec.category() != http::make_error_code(http::error::bad_method).category())
    return std::nullopt;
  return HttpError{400, "malformed HTTP request (" + ec.message() + ")", "invalid_request"};
}

std::optional<HttpError> head_error(const HttpRequest& head) {
  if (head.target.empty() || head.target[0] != '/')
    return HttpError{400, "the request target must be an absolute path (origin-form)", "invalid_request"};
  return std::nullopt;
}

}  // namespace kvpack::server
