// Tool definitions in a different order (or with keys in a different order): the tool block sits at the
// end of the system message, so a reordering ends the shared prefix there and the history after it is
// recomputed. Clients that build the list from a hash map or a set do this without knowing.
#include <algorithm>
#include <unordered_map>

#include "analyze/causes_impl.h"

namespace kvpack::analyze {
namespace {

ordered_json sorted_keys(const ordered_json& v) {
  if (v.is_object()) {
    std::vector<std::string> keys;
    for (auto it = v.begin(); it != v.end(); ++it) keys.push_back(it.key());
    std::sort(keys.begin(), keys.end());
    ordered_json out = ordered_json::object();
    for (const auto& k : keys) out[k] = sorted_keys(v.at(k));
    return out;
  }
  if (v.is_array()) {
    ordered_json out = ordered_json::array();
    for (const auto& x : v) out.push_back(sorted_keys(x));
    return out;
  }
  return v;
}

std::string tool_name(const ordered_json& t) {
  if (auto f = t.find("function"); f != t.end() && f->is_object())
    if (auto n = f->find("name"); n != f->end() && n->is_string()) return n->get<std::string>();
  if (auto n = t.find("name"); n != t.end() && n->is_string()) return n->get<std::string>();
  return {};
}

std::string dump(const ordered_json& v) { return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

std::string dump_all(const std::vector<ordered_json>& tools) {
  std::string s;
  for (const auto& t : tools) s += dump(t) + '\n';
  return s;
}

}  // namespace

std::vector<ordered_json> canonical_tools(const std::vector<ordered_json>& tools) {
  std::vector<std::pair<std::pair<std::string, std::string>, ordered_json>> keyed;
  for (const auto& t : tools) {
    ordered_json c = sorted_keys(t);
    keyed.push_back({{tool_name(t), dump(c)}, std::move(c)});
  }
  std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ordered_json> out;
  for (auto& k : keyed) out.push_back(std::move(k.second));
  return out;
}

Detection detect_tool_order(const Log& log) {
  Detection d;
  struct Seen {
    std::string raw;
    size_t index;
  };
  std::unordered_map<std::string, Seen> by_set;  // canonical tool list -> the latest raw list with it
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i].tools.empty()) continue;
    std::string raw = dump_all(log[i].tools);
    auto [it, fresh] = by_set.try_emplace(dump_all(canonical_tools(log[i].tools)), Seen{raw, i});
    if (!fresh) {
      if (it->second.raw != raw) {
        d.affected.push_back(i);
        if (!d.example) d.example = Example{it->second.index, i, "tools (one JSON object per line)", it->second.raw, raw, "the same tools, in another order"};
      }
      it->second = {std::move(raw), i};
    }
  }
  return d;
}

Log normalise_tool_order(Log log) {
  for (auto& r : log)
    if (!r.tools.empty()) r.tools = canonical_tools(r.tools);
  return log;
}

}  // namespace kvpack::analyze
