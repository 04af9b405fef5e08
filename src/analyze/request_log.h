// The input of `kvpack analyze-prefix`: a JSON-lines file with one OpenAI request per line, in arrival
// order. Two shapes are accepted per line:
//   - the request body itself: chat {"model", "messages": [{"role", "content"}...], "tools"?: [...]} or
//     completion {"prompt": "..." | [token ids]}, optionally with the fields a request log adds
//     ("id", "session" or "user", "timestamp", "prompt_tokens", "cached_tokens");
//   - a server request-log line (`kvpack serve --request-log FILE --request-log-prompts`): the log's
//     fields with the body under "request".
// The server writes a line when a request ends, so its file order is completion order; the prefix
// cache saw the requests in arrival order, which is "ts" (the end, ISO 8601 UTC) minus "e2e_s".
// Other logs may give "timestamp" (unix seconds, or ISO 8601) for the arrival.
// Every error names the 1-based line number; the reader never holds more than one line (bounded by
// max_line_bytes) in memory.
#pragma once
#include <cstdint>
#include <istream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvpack::analyze {

// Tool definitions keep their key order: a client that reorders keys breaks the prefix too.
using ordered_json = nlohmann::ordered_json;

struct Message {
  std::string role;  // system, developer, user, assistant, tool
  std::string content;
  bool operator==(const Message&) const = default;
};

struct LoggedRequest {
  int64_t line = 0;       // 1-based line of the log
  std::string id;         // the log's "id", else "line N"
  std::string session;    // "session", else "user", else "" (unknown)
  std::string cache_salt; // requests with different salts never share blocks
  bool chat = false;
  std::vector<Message> messages;        // chat
  std::vector<ordered_json> tools;      // chat, as sent (order and key order kept)
  std::string prompt;                   // completion prompt text
  std::vector<int32_t> prompt_ids;      // completion prompt sent as token ids (then `prompt` is empty)
  std::optional<int64_t> logged_prompt_tokens, logged_cached_tokens;  // what the server reported
  std::optional<double> arrival_s;  // unix seconds, when the line says (see above)
};

struct LogError : std::runtime_error {
  LogError(int64_t line, const std::string& what);
  int64_t line;
};

struct ReadOptions {
  size_t max_line_bytes = size_t{64} << 20;  // longer lines are an error, not an allocation
};

// Reads every non-blank line. Throws LogError (with the line number) on the first bad line.
std::vector<LoggedRequest> read_request_log(std::istream& in, const ReadOptions& opt = {});
std::vector<LoggedRequest> read_request_log_file(const std::string& path, const ReadOptions& opt = {});
// One line's JSON (already parsed) to a request; throws std::invalid_argument with a message that the
// callers prefix with the line number.
LoggedRequest parse_logged_request(const ordered_json& line_json);

// Puts the requests in arrival order when every one has an arrival time (a stable sort: ties keep file
// order) and returns true; otherwise leaves the file order and returns false.
bool order_by_arrival(std::vector<LoggedRequest>& log);
// "2026-12-02T04:49:34.411Z" (also without fraction, or with "+00:00") -> unix seconds; nullopt if not that form.
std::optional<double> parse_utc_time(std::string_view s);

// Serialises a request back to one JSON line in the request-log shape ({"id", "session", "request"}).
std::string to_log_line(const LoggedRequest& r);

}  // namespace kvpack::analyze
