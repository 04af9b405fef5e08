// What breaks prefix reuse, one cause at a time. Each cause has
//   - a detector: which requests show it, and one example pair (an earlier request and an affected one);
//   - a normaliser: the log as it would be with the cause fixed at the client (the analyzer re-runs the
//     cache simulation on it to price the cause).
// Detectors flag only real variation (two requests that differ by the cause alone), so a stable
// prompt is never flagged; normalisers may rewrite stable text too (masking a fixed number changes no
// hit rate), which keeps them simple.
#pragma once
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "analyze/request_log.h"

namespace kvpack::analyze {

enum class Cause { Volatile, Tools, Whitespace, Truncation, Documents };

// The order in which the analyzer fixes causes to attribute the lost hit rate: by where in the prompt a
// cause usually strikes (system prompt, tool block, anywhere, history, last message). A break early in
// the prompt hides the ones after it, so each cause is priced with the ones before it already fixed.
inline constexpr std::array<Cause, 5> kAttributionOrder = {Cause::Volatile, Cause::Tools, Cause::Whitespace,
                                                           Cause::Truncation, Cause::Documents};

const char* cause_name(Cause c);   // "volatile", "tools", "whitespace", "truncation", "documents"
const char* cause_title(Cause c);  // what it is, in a few words
const char* cause_fix(Cause c);    // the fix, in one line
std::optional<Cause> parse_cause(std::string_view name);
// "all", "none" or a comma-separated list of names; throws std::invalid_argument naming a bad entry.
std::vector<Cause> parse_cause_list(std::string_view list);

using Log = std::vector<LoggedRequest>;

struct Example {
  size_t first = 0, second = 0;            // log indices: the earlier request and the affected one
  std::string where;                       // "system prompt", "tools", "messages[3] (user)", ...
  std::string first_text, second_text;     // that part of each request, as sent (the report shows where they differ)
  std::string note;                        // what else to know ("" if nothing)
};

struct Detection {
  std::vector<size_t> affected;  // log indices, ascending
  std::optional<Example> example;
};

Detection detect(Cause c, const Log& log);
Log normalise(Cause c, Log log);

// --- the pieces, exposed for tests ---------------------------------------------------------------

// Volatile spans: UUIDs, dates, clock times, opaque ids (8+ letters and digits with 2+ digits), numbers,
// weekday and month names. mask_volatile replaces each with a fixed placeholder ("<uuid>", "<date>", ...).
struct Span {
  size_t begin = 0, end = 0;
  const char* kind = "";
};
std::vector<Span> find_volatile_spans(std::string_view text);
std::string mask_volatile(std::string_view text);

// Tools in a canonical order (by function name, then text) with object keys sorted at every level.
std::vector<ordered_json> canonical_tools(const std::vector<ordered_json>& tools);

// Newlines as "\n", no trailing blanks on a line, no runs of spaces inside a line, at most one blank
// line in a row, no leading or trailing whitespace.
std::string normalise_whitespace(std::string_view text);

// Messages after the leading system / developer messages (the part a client truncates).
size_t first_history_message(const LoggedRequest& r);

}  // namespace kvpack::analyze
