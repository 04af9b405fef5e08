// The `data:` events of a Server-Sent-Events body, parsed as JSON (without the final [DONE]); `done` says
// whether [DONE] came. For the server tests that read a whole streamed response at once.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kvpack::test {

inline std::vector<nlohmann::json> sse_events(std::string buf, bool* done) {
  std::vector<nlohmann::json> events;
  *done = false;
  for (size_t end; (end = buf.find("\n\n")) != std::string::npos;) {
    const std::string ev = buf.substr(0, end);
    buf.erase(0, end + 2);
    if (ev.rfind("data: ", 0) != 0) continue;
    if (ev == "data: [DONE]") *done = true;
    else events.push_back(nlohmann::json::parse(ev.substr(6)));
  }
  return events;
}

}  // namespace kvpack::test
