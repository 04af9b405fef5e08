#include "analyze/traffic_gen.h"

#include "analyze/analyzer.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace kvpack::analyze {
namespace {

// splitmix64: portable and deterministic (std:: distributions differ between standard libraries).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
  int between(int lo, int hi) { return lo + below(hi - lo + 1); }
};

// A request's own random stream for one purpose: the same whatever else is planted.
Rng stream(uint64_t seed, uint64_t request, uint64_t purpose) {
  Rng r{seed ^ (request * 0x100000001b3ull) ^ (purpose << 56)};
  r.next();
  return r;
}

const char* const kWords[] = {
    "account", "answer", "apple", "autumn", "basket", "bridge", "bright", "button", "candle", "careful", "castle", "cloud",
    "copper", "corner", "cotton", "county", "dinner", "distant", "doctor", "engine", "evening", "family", "farmer", "feather",
    "field", "forest", "garden", "gentle", "glass", "golden", "harbour", "hidden", "history", "honest", "island", "journey",
    "kettle", "kitchen", "ladder", "lantern", "letter", "library", "market", "meadow", "memory", "metal", "middle", "minute",
    "morning", "mountain", "narrow", "needle", "number", "ocean", "orange", "paper", "parcel", "pencil", "people", "picture",
    "pocket", "potato", "quiet", "rabbit", "river", "rocket", "saddle", "school", "season", "shadow", "silver", "simple",
    "sister", "small", "spring", "station", "stone", "summer", "supper", "table", "thunder", "ticket", "timber", "travel",
    "valley", "velvet", "village", "violet", "wagon", "water", "window", "winter", "wooden", "yellow", "young", "anchor",
    "blanket", "border", "cabin", "canvas", "circle", "compass", "courage", "crystal", "desert", "eagle", "fabric", "fountain",
    "the", "a", "and", "of", "to", "with", "under", "over", "near", "after", "before", "because", "while", "is", "was", "has"};
constexpr int kNumWords = static_cast<int>(sizeof kWords / sizeof kWords[0]);

std::string sentence(Rng& r, int lo, int hi, char end = '.') {
  std::string s;
  const int n = r.between(lo, hi);
  for (int i = 0; i < n; ++i) {
    std::string w = kWords[r.below(kNumWords)];
    if (i == 0) w[0] = static_cast<char>(w[0] - 'a' + 'A');
    if (i) s += ' ';
    s += w;
  }
  return s + end;
}

std::string sentences(Rng& r, int lo, int hi) {
  std::string s;
  const int n = r.between(lo, hi);
  for (int i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += sentence(r, 6, 14);
  }
  return s;
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) s += sep;
    s += parts[i];
  }
  return s;
}

enum class App { Chat, Agent, Rag };

struct Turn {
  std::vector<std::string> user_lines;  // agent turns are several pasted lines; chat and rag turns one
  std::string assistant;
};

struct Session {
  App app{};
  int id = 0;
  std::vector<Turn> turns;
  int document = -1;  // rag
};

constexpr int kDocuments = 6;
constexpr int kTruncatedHistory = 4;  // messages a truncating chat client keeps

struct World {
  std::string chat_system_head, chat_system_tail, agent_system, rag_system;
  std::vector<ordered_json> tools;
  std::vector<std::string> documents;
  std::vector<Session> sessions;
  std::vector<std::pair<int, int>> arrivals;  // (session, turn) in arrival order
};

ordered_json tool(const std::string& name, const std::string& description, const std::vector<std::string>& params) {
  ordered_json props = ordered_json::object();
  for (const auto& p : params) props[p] = {{"type", "string"}, {"description", "The " + p + " to use."}};
  return {{"type", "function"},
          {"function", {{"name", name}, {"description", description}, {"parameters", {{"type", "object"}, {"properties", props}, {"required", params}}}}}};
}

// Everything that does not depend on what is planted.
World plan(const TrafficSpec& spec) {
  World w;
  Rng r{spec.seed};
  w.chat_system_head = "You are Quill, a friendly assistant for the readers of a small village library.";
  w.chat_system_tail = "Answer in at most 3 short paragraphs. " + sentences(r, 4, 5);
  w.agent_system = "You are Wrench, an operations agent. Call a tool when it helps, one call at a time. " + sentences(r, 2, 3);
  w.rag_system = "Answer the question from the document only. If the document does not say, answer that it does not.";
  w.tools = {tool("search_orders", "Find orders by customer or parcel.", {"customer", "parcel"}),
             tool("get_weather", "Current weather at a place.", {"place"}),
             tool("send_letter", "Send a letter to a customer.", {"customer", "subject", "body"}),
             tool("open_ticket", "Open a support ticket.", {"title", "details"}),
             tool("read_manual", "Read a page of the engine manual.", {"page"})};
  for (int d = 0; d < kDocuments; ++d) {
    std::vector<std::string> paras;
    for (int p = 0; p < 3; ++p) paras.push_back(sentences(r, 4, 5));
    w.documents.push_back(join(paras, "\n\n"));
  }
  int total = 0;
  while (total < spec.requests) {
    Session s;
    s.id = static_cast<int>(w.sessions.size());
    const int pick = r.below(100);
    s.app = pick < 17 ? App::Chat : pick < 35 ? App::Agent : App::Rag;
    const int turns = s.app == App::Chat ? r.between(2, 8) : s.app == App::Agent ? r.between(2, 5) : 1;
    if (s.app == App::Rag) s.document = r.below(kDocuments);
    for (int t = 0; t < turns; ++t) {
      Turn turn;
      if (s.app == App::Agent) {
        const int lines = r.between(3, 5);
        for (int l = 0; l < lines; ++l) turn.user_lines.push_back(sentence(r, 5, 10, l + 1 == lines ? '?' : '.'));
        turn.assistant = sentences(r, 2, 3);
      } else if (s.app == App::Chat) {
        turn.user_lines.push_back(sentences(r, 1, 2));
        turn.assistant = sentences(r, 2, 4);
      } else {
        turn.user_lines.push_back(sentence(r, 7, 12, '?'));
      }
      s.turns.push_back(std::move(turn));
    }
    total += turns;
    w.sessions.push_back(std::move(s));
  }
  // Arrival: up to 8 sessions in progress, each request from one of them at random.
  std::vector<std::pair<int, int>> active;  // (session, next turn)
  size_t next_session = 0;
  while (static_cast<int>(w.arrivals.size()) < spec.requests) {
    while (active.size() < 8 && next_session < w.sessions.size()) active.push_back({static_cast<int>(next_session++), 0});
    if (active.empty()) break;
    const int k = r.below(static_cast<int>(active.size()));
    auto& [sid, turn] = active[static_cast<size_t>(k)];
    w.arrivals.push_back({sid, turn});
    if (++turn == static_cast<int>(w.sessions[static_cast<size_t>(sid)].turns.size())) active.erase(active.begin() + k);
  }
  return w;
}

std::string chat_system(const World& w, bool volatile_planted, uint64_t seed, int request) {
  std::string when = "Current date: 2026-12-02.";
  if (volatile_planted) {
    Rng r = stream(seed, static_cast<uint64_t>(request), 'V');
    const int t = 9 * 3600 + request * 7 + r.below(5);  // seconds since midnight
    char buf[160];
    const uint64_t a = r.next(), b = r.next();
    std::snprintf(buf, sizeof buf, "Current date and time: 2026-12-02 %02d:%02d:%02d UTC. Request id: %08llx-%04llx-%04llx-%04llx-%012llx.",
                  (t / 3600) % 24, (t / 60) % 60, t % 60, static_cast<unsigned long long>(a >> 32),
                  static_cast<unsigned long long>((a >> 16) & 0xffff), static_cast<unsigned long long>(a & 0xffff),
                  static_cast<unsigned long long>(b >> 48), static_cast<unsigned long long>(b & 0xffffffffffffull));
    when = buf;
  }
  return w.chat_system_head + "\n" + when + "\n" + w.chat_system_tail;
}

// A turn as a user's text box sends it: one of three spellings of the lines that a client trims later.
std::string as_typed(const std::vector<std::string>& lines, Rng r) {
  switch (r.below(3)) {
    case 0: return join(lines, "\r\n") + "\r\n";  // Windows newlines
    case 1: return join(lines, " \n") + "\n";       // a blank before each newline, a final newline
    default: {                                     // two spaces after a sentence, a final newline
      std::string s = join(lines, "\n") + "\n";
      const size_t dot = s.find(". ");
      return dot == std::string::npos ? s : s.replace(dot, 2, ".  ");
    }
  }
}

}  // namespace

Log generate_traffic(const TrafficSpec& spec) {
  if (spec.requests < 1) throw std::invalid_argument("generate at least one request");
  auto planted = [&](Cause c) { return std::find(spec.planted.begin(), spec.planted.end(), c) != spec.planted.end(); };
  const World w = plan(spec);
  Log log;
  for (size_t k = 0; k < w.arrivals.size(); ++k) {
    const int req = static_cast<int>(k);
    const auto [sid, turn] = w.arrivals[k];
    const Session& s = w.sessions[static_cast<size_t>(sid)];
    LoggedRequest r;
    r.chat = true;
    char id[32];
    std::snprintf(id, sizeof id, "req-%05d", req);
    r.id = id;
    const char* app = s.app == App::Chat ? "chat" : s.app == App::Agent ? "agent" : "rag";
    r.session = std::string(app) + "-" + std::to_string(s.id);
    std::vector<Message> history;
    if (s.app == App::Chat) {
      r.messages.push_back({"system", chat_system(w, planted(Cause::Volatile), spec.seed, req)});
      for (int t = 0; t < turn; ++t) {
        history.push_back({"user", s.turns[static_cast<size_t>(t)].user_lines[0]});
        history.push_back({"assistant", s.turns[static_cast<size_t>(t)].assistant});
      }
      if (planted(Cause::Truncation) && static_cast<int>(history.size()) > kTruncatedHistory)
        history.erase(history.begin(), history.end() - kTruncatedHistory);
      history.push_back({"user", s.turns[static_cast<size_t>(turn)].user_lines[0]});
    } else if (s.app == App::Agent) {
      r.messages.push_back({"system", w.agent_system});
      r.tools = w.tools;
      if (planted(Cause::Tools)) {
        Rng t = stream(spec.seed, static_cast<uint64_t>(req), 'T');
        for (size_t i = r.tools.size(); i > 1; --i) std::swap(r.tools[i - 1], r.tools[static_cast<size_t>(t.below(static_cast<int>(i)))]);
      }
      for (int t = 0; t < turn; ++t) {
        history.push_back({"user", join(s.turns[static_cast<size_t>(t)].user_lines, "\n")});
        history.push_back({"assistant", s.turns[static_cast<size_t>(t)].assistant});
      }
      const auto& lines = s.turns[static_cast<size_t>(turn)].user_lines;
      history.push_back({"user", planted(Cause::Whitespace) ? as_typed(lines, stream(spec.seed, static_cast<uint64_t>(req), 'W'))
                                                            : join(lines, "\n")});
    } else {
      r.messages.push_back({"system", w.rag_system});
      const std::string& doc = w.documents[static_cast<size_t>(s.document)];
      const std::string& question = s.turns[0].user_lines[0];
      history.push_back({"user", planted(Cause::Documents) ? question + "\n\n" + doc : doc + "\n\n" + question});
    }
    r.messages.insert(r.messages.end(), history.begin(), history.end());
    log.push_back(std::move(r));
  }
  return log;
}

GroundTruth ground_truth(const TrafficSpec& spec, PromptRenderer& renderer, const SimOptions& sim) {
  auto without = [&](const std::vector<Cause>& removed) {
    TrafficSpec s = spec;
    std::erase_if(s.planted, [&](Cause c) { return std::find(removed.begin(), removed.end(), c) != removed.end(); });
    return simulate_log(generate_traffic(s), renderer, sim);
  };
  GroundTruth g;
  const SimResult planted = without({});
  SimResult before = planted;
  g.hit_rate = before.hit_rate();
  std::vector<Cause> removed;
  for (Cause c : kAttributionOrder) {
    TruthRow row;
    row.cause = c;
    row.planted = std::find(spec.planted.begin(), spec.planted.end(), c) != spec.planted.end();
    removed.push_back(c);
    const SimResult after = without(removed);
    row.planted_prompt_tokens = planted.prompt_tokens;
    row.tokens_lost = before.computed_tokens() - after.computed_tokens();
    row.alone_tokens_lost = planted.computed_tokens() - without({c}).computed_tokens();
    g.rows.push_back(row);
    before = after;
  }
  g.hit_rate_clean = before.hit_rate();
  return g;
}

}  // namespace kvpack::analyze
