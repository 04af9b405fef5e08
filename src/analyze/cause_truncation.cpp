// History truncated from the front: a client that drops the oldest turn on every request (a sliding
// window to fit the context) changes the message right after the system prompt each time, so nothing
// of the history is ever reused. Found by re-anchoring: a request whose history starts with the tail of
// an earlier request's history continues that conversation (an overlap of two messages or more, or of
// one within the same named session; never across two different sessions); its re-anchored form puts
// the dropped messages back in front.
#include <algorithm>
#include <optional>
#include <unordered_map>
#include <xxhash.h>

#include "analyze/causes_impl.h"

namespace kvpack::analyze {
namespace {

// Two messages at least: one shared message (a greeting, "ok") says nothing about a conversation,
// unless both requests name the same session (a client that keeps only the last exchange overlaps
// its previous request by one message).
constexpr size_t kMinOverlap = 2, kMinOverlapInSession = 1;
// Candidates checked per request (the most recent ones): bounds the work on very repetitive logs.
constexpr size_t kMaxCandidates = 64;

uint64_t message_hash(const Message& m) {
  const std::string s = m.role + '\0' + m.content;
  return XXH3_64bits(s.data(), s.size());
}

std::string history_text(const LoggedRequest& r) {
  std::string s;
  for (size_t m = first_history_message(r); m < r.messages.size(); ++m) s += r.messages[m].role + ": " + r.messages[m].content + "\n";
  return s;
}

struct Occurrence {
  size_t request;   // log index
  size_t position;  // in that request's re-anchored history
};

}  // namespace

uint64_t text_hash(std::string_view s) { return XXH3_64bits(s.data(), s.size()); }

Reanchored reanchor_history(const Log& in) {
  Reanchored out{in, {}};
  std::vector<std::vector<uint64_t>> history(in.size());  // re-anchored history (message hashes) per request
  std::vector<std::vector<const Message*>> full(in.size());  // the same, as the messages of `in`
  std::unordered_map<uint64_t, std::vector<Occurrence>> where;  // message hash -> where it occurs
  for (size_t i = 0; i < in.size(); ++i) {
    const LoggedRequest& r = in[i];
    if (!r.chat) continue;
    const size_t h0 = first_history_message(r);
    std::vector<uint64_t> cur;
    for (size_t m = h0; m < r.messages.size(); ++m) cur.push_back(message_hash(r.messages[m]));
    // The continued conversation: the most recent earlier request whose history, from some position
    // d >= 1, is a prefix of this one's.
    std::optional<Occurrence> best;
    if (!cur.empty()) {
      if (auto it = where.find(cur[0]); it != where.end()) {
        size_t checked = 0;
        for (auto o = it->second.rbegin(); o != it->second.rend() && checked < kMaxCandidates; ++o, ++checked) {
          if (o->position == 0) continue;
          const LoggedRequest& prev = in[o->request];
          if (!r.session.empty() && !prev.session.empty() && prev.session != r.session) continue;
          const bool same_session = !r.session.empty() && prev.session == r.session;
          const auto& h = history[o->request];
          const size_t overlap = h.size() - o->position;
          if (overlap < (same_session ? kMinOverlapInSession : kMinOverlap) || overlap > cur.size()) continue;
          if (!std::equal(h.begin() + static_cast<std::ptrdiff_t>(o->position), h.end(), cur.begin())) continue;
          best = *o;
          break;
        }
      }
    }
    for (size_t m = h0; m < r.messages.size(); ++m) full[i].push_back(&r.messages[m]);
    if (best) {
      const auto& dropped = full[best->request];
      full[i].insert(full[i].begin(), dropped.begin(), dropped.begin() + static_cast<std::ptrdiff_t>(best->position));
      cur.insert(cur.begin(), history[best->request].begin(),
                 history[best->request].begin() + static_cast<std::ptrdiff_t>(best->position));
      LoggedRequest& o = out.log[i];
      o.messages.resize(h0);
      for (const Message* m : full[i]) o.messages.push_back(*m);
      out.detection.affected.push_back(i);
      if (!out.detection.example) {
        Example e{best->request, i, "history (the messages after the system prompt)", history_text(in[best->request]),
                  history_text(r), ""};
        const size_t kept = history[best->request].size() - best->position;
        const size_t prev_sent = in[best->request].messages.size() - first_history_message(in[best->request]);
        e.note = "the later request continues the earlier one's conversation without its first " +
                 std::to_string(prev_sent - kept) + " history message(s)";
        out.detection.example = std::move(e);
      }
    }
    for (size_t p = 0; p < cur.size(); ++p) where[cur[p]].push_back({i, p});
    history[i] = std::move(cur);
  }
  return out;
}

}  // namespace kvpack::analyze
