#include "analyze/causes.h"

#include <stdexcept>

#include "analyze/causes_impl.h"

namespace kvpack::analyze {

const char* cause_name(Cause c) {
  switch (c) {
    case Cause::Volatile: return "volatile";
    case Cause::Tools: return "tools";
    case Cause::Whitespace: return "whitespace";
    case Cause::Truncation: return "truncation";
    case Cause::Documents: return "documents";
  }
  return "?";
}

const char* cause_title(Cause c) {
  switch (c) {
    case Cause::Volatile: return "volatile spans (dates, times, ids, counters) in the system prompt";
    case Cause::Tools: return "tool definitions sent in a different order";
    case Cause::Whitespace: return "whitespace / newline variants of the same text";
    case Cause::Truncation: return "history truncated from the front";
    case Cause::Documents: return "document placed after the question";
  }
  return "?";
}

const char* cause_fix(Cause c) {
  switch (c) {
    case Cause::Volatile: return "keep timestamps, request ids and counters out of the system prompt (send them in the last user message, or round them to the day)";
    case Cause::Tools: return "send tools in one fixed order (sort by name) with a fixed key order";
    case Cause::Whitespace: return "normalise text before sending: \\n newlines, no trailing spaces, history re-sent byte for byte as first sent";
    case Cause::Truncation: return "keep history append-only; when it must shrink, cut rarely and in large steps (or summarise once) instead of dropping the oldest turn every request";
    case Cause::Documents: return "put the shared document before the question (and the question last)";
  }
  return "?";
}

std::optional<Cause> parse_cause(std::string_view name) {
  for (Cause c : kAttributionOrder)
    if (name == cause_name(c)) return c;
  return std::nullopt;
}

std::vector<Cause> parse_cause_list(std::string_view list) {
  if (list == "all") return {kAttributionOrder.begin(), kAttributionOrder.end()};
  std::vector<Cause> out;
  if (list == "none" || list.empty()) return out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string_view name = list.substr(pos, comma - pos);
    const auto c = parse_cause(name);
    if (!c) {
      std::string names;
      for (Cause k : kAttributionOrder) names += std::string(names.empty() ? "" : ", ") + cause_name(k);
      throw std::invalid_argument("unknown cause '" + std::string(name) + "' (causes: " + names + ", or all / none)");
    }
    bool seen = false;
    for (Cause k : out) seen = seen || k == *c;
    if (!seen) out.push_back(*c);
    pos = comma + 1;
  }
  return out;
}

Detection detect(Cause c, const Log& log) {
  switch (c) {
    case Cause::Volatile: return detect_volatile(log);
    case Cause::Tools: return detect_tool_order(log);
    case Cause::Whitespace: return detect_whitespace(log);
    case Cause::Truncation: return reanchor_history(log).detection;
    case Cause::Documents: return detect_document_order(log);
  }
  return {};
}

Log normalise(Cause c, Log log) {
  switch (c) {
    case Cause::Volatile: return normalise_volatile(std::move(log));
    case Cause::Tools: return normalise_tool_order(std::move(log));
    case Cause::Whitespace: return normalise_whitespace_log(std::move(log));
    case Cause::Truncation: return std::move(reanchor_history(log).log);
    case Cause::Documents: return normalise_document_order(std::move(log));
  }
  return log;
}

size_t first_history_message(const LoggedRequest& r) {
  size_t i = 0;
  while (i < r.messages.size() && (r.messages[i].role == "system" || r.messages[i].role == "developer")) ++i;
  return i;
}

}  // namespace kvpack::analyze
