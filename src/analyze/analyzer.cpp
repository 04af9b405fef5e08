#include "analyze/analyzer.h"

#include <cstdio>

namespace kvpack::analyze {
namespace {

constexpr size_t kContextBytes = 40;  // shown before a difference
constexpr size_t kSpanBytes = 80;     // at most, per side
constexpr size_t kResyncBytes = 12;   // the two texts agree again when this many bytes match

bool continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

size_t char_start(const std::string& s, size_t i) {  // never cut a UTF-8 character
  while (i > 0 && i < s.size() && continuation(s[i])) --i;
  return i;
}

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %%", 100.0 * x);
  return buf;
}

std::string fixed1(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f", x);
  return buf;
}

std::string pad(std::string s, size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

}  // namespace

DiffSpan first_difference(const std::string& a, const std::string& b) {
  DiffSpan d;
  size_t p = 0;
  while (p < a.size() && p < b.size() && a[p] == b[p]) ++p;
  p = char_start(a, p);
  d.offset = p;
  const size_t c0 = char_start(a, p > kContextBytes ? p - kContextBytes : 0);
  d.context = a.substr(c0, p - c0);
  // The shortest pair of spans after which both texts read the same again.
  auto agree = [&](size_t i, size_t j) {
    const size_t ai = p + i, bj = p + j;
    const size_t ra = a.size() - ai, rb = b.size() - bj;
    if (ra < kResyncBytes || rb < kResyncBytes)  // near the end: the rest must be the same
      return ra == rb && a.compare(ai, ra, b, bj, rb) == 0;
    return a.compare(ai, kResyncBytes, b, bj, kResyncBytes) == 0;
  };
  size_t ea = std::min(a.size() - p, kSpanBytes), eb = std::min(b.size() - p, kSpanBytes);
  bool found = false;
  for (size_t sum = 1; sum <= 2 * kSpanBytes && !found; ++sum)
    for (size_t i = 0; i <= sum && !found; ++i) {
      const size_t j = sum - i;
      if (i > kSpanBytes || j > kSpanBytes || p + i > a.size() || p + j > b.size()) continue;
      if (agree(i, j)) {
        ea = i;
        eb = j;
        found = true;
      }
    }
  // Whole characters only: extend a cut span to the end of its character.
  while (p + ea < a.size() && continuation(a[p + ea])) ++ea;
  while (p + eb < b.size() && continuation(b[p + eb])) ++eb;
  d.a = a.substr(p, ea);
  d.b = b.substr(p, eb);
  return d;
}

SimResult simulate_log(const Log& log, PromptRenderer& renderer, const SimOptions& opt) {
  std::vector<const BlockedPrompt*> prompts;  // the renderer keeps them
  std::vector<std::string> salts;
  prompts.reserve(log.size());
  salts.reserve(log.size());
  for (const auto& r : log) {
    prompts.push_back(&renderer.blocks(r, opt.page_size));
    salts.push_back(r.cache_salt);
  }
  return simulate_prefix_cache(prompts, salts, opt);
}

Report analyze_prefix_reuse(const Log& log, PromptRenderer& renderer, const AnalyzeOptions& opt) {
  Report rep;
  rep.sim = opt.sim;
  rep.order = opt.order;
  rep.chat_format = server::chat_format_name(renderer.format());
  rep.requests = static_cast<int64_t>(log.size());
  for (const auto& r : log) {
    if (r.chat) ++rep.chat_requests;
    if (r.logged_prompt_tokens && r.logged_cached_tokens) {
      ++rep.logged_requests;
      rep.logged_prompt_tokens += *r.logged_prompt_tokens;
      rep.logged_cached_tokens += *r.logged_cached_tokens;
    }
  }
  const SimResult actual = simulate_log(log, renderer, opt.sim);
  rep.prompt_tokens = actual.prompt_tokens;
  rep.computed_tokens = actual.computed_tokens();
  rep.hit_rate = actual.hit_rate();

  Log fixed = log;
  SimResult before = actual;
  for (Cause c : kAttributionOrder) {
    CauseReport row;
    row.cause = c;
    const Detection det = detect(c, log);  // what the log shows, before any fix
    row.requests_affected = static_cast<int64_t>(det.affected.size());
    if (det.example) {
      const Example& e = *det.example;
      row.example = CauseReport::ExampleText{log[e.first].id, log[e.second].id, e.where, e.note,
                                             first_difference(e.first_text, e.second_text)};
    }
    fixed = normalise(c, std::move(fixed));
    const SimResult after = simulate_log(fixed, renderer, opt.sim);
    row.log_prompt_tokens = actual.prompt_tokens;
    row.hit_rate_after = after.hit_rate();
    row.tokens_lost = before.computed_tokens() - after.computed_tokens();
    row.alone_tokens_lost = actual.computed_tokens() - simulate_log(normalise(c, log), renderer, opt.sim).computed_tokens();
    rep.causes.push_back(std::move(row));
    before = after;
  }
  rep.hit_rate_fixed = before.hit_rate();
  rep.computed_tokens_fixed = before.computed_tokens();
  return rep;
}

std::string format_report_text(const Report& r) {
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "Prefix reuse of %lld requests (%lld chat, %lld completion), %lld prompt tokens; chat format %s, "
                "blocks of %d tokens, cache %s, requests in %s\n",
                static_cast<long long>(r.requests), static_cast<long long>(r.chat_requests),
                static_cast<long long>(r.requests - r.chat_requests), static_cast<long long>(r.prompt_tokens),
                r.chat_format.c_str(), r.sim.page_size,
                r.sim.capacity_tokens > 0 ? (std::to_string(r.sim.capacity_tokens) + " tokens (LRU)").c_str() : "unbounded",
                r.order.c_str());
  s += buf;
  s += "Simulated prefix-cache hit rate: " + pct(r.hit_rate) + " (" + std::to_string(r.computed_tokens) + " prompt tokens computed)";
  if (r.logged_requests > 0 && r.logged_prompt_tokens > 0) {
    std::snprintf(buf, sizeof buf, " (the server reported %s on the %lld requests whose line has prompt_tokens and cached_tokens)",
                  pct(static_cast<double>(r.logged_cached_tokens) / static_cast<double>(r.logged_prompt_tokens)).c_str(),
                  static_cast<long long>(r.logged_requests));
    s += buf;
  }
  const int64_t saved = r.computed_tokens - r.computed_tokens_fixed;
  s += "\nFixing every cause below saves " + std::to_string(saved) + " of them: " +
       fixed1(r.prompt_tokens > 0 ? 100.0 * static_cast<double>(saved) / static_cast<double>(r.prompt_tokens) : 0) +
       " hit-rate points (the rewritten log's own hit rate: " + pct(r.hit_rate_fixed) + ")\n\n";
  s += "Lost hit rate per cause: tokens lost = prompt tokens computed because of the cause, points = those tokens\n"
       "over this log's prompt tokens. Causes are fixed one after another in the order of the table, so each row is\n"
       "what fixing that cause saves once the rows above it are fixed (the rows add up); \"alone\" fixes only that cause.\n\n";
  const std::vector<std::string> head = {"cause", "requests affected", "tokens lost", "hit-rate points lost", "alone"};
  const std::vector<size_t> w = {12, 17, 11, 20, 6};
  auto row = [&](const std::vector<std::string>& cells) {
    std::string line = "| ";
    for (size_t i = 0; i < cells.size(); ++i) line += pad(cells[i], w[i], i > 0) + " | ";
    line.pop_back();
    return line + "\n";
  };
  s += row(head);
  std::string rule = "|";
  for (size_t x : w) rule += std::string(x + 2, '-') + "|";
  s += rule + "\n";
  for (const auto& c : r.causes) {
    s += row({cause_name(c.cause), std::to_string(c.requests_affected), std::to_string(c.tokens_lost), fixed1(c.points_lost()),
              fixed1(c.alone_points_lost())});
  }
  s += "\n";
  for (const auto& c : r.causes) {
    s += std::string(cause_name(c.cause)) + ": " + cause_title(c.cause) + "\n";
    s += "  fix: " + std::string(cause_fix(c.cause)) + "\n";
    if (c.example) {
      const auto& e = *c.example;
      s += "  example: " + e.first_id + " then " + e.second_id + (e.note.empty() ? "" : ": " + e.note) + "\n";
      s += "    " + e.where + " first differs at byte " + std::to_string(e.diff.offset) + ", after \"" + escaped(e.diff.context) + "\"\n";
      s += "    " + e.first_id + ": \"" + escaped(e.diff.a) + "\"\n";
      s += "    " + e.second_id + ": \"" + escaped(e.diff.b) + "\"\n";
    } else if (c.requests_affected == 0) {
      s += "  not found in this log\n";
    }
  }
  return s;
}

ordered_json report_json(const Report& r) {
  ordered_json j;
  j["requests"] = r.requests;
  j["chat_requests"] = r.chat_requests;
  j["prompt_tokens"] = r.prompt_tokens;
  j["computed_tokens"] = r.computed_tokens;
  j["chat_format"] = r.chat_format;
  j["page_size"] = r.sim.page_size;
  j["cache_capacity_tokens"] = r.sim.capacity_tokens;
  j["order"] = r.order;
  j["hit_rate"] = r.hit_rate;
  j["computed_tokens_all_fixed"] = r.computed_tokens_fixed;
  j["hit_rate_of_rewritten_log_all_fixed"] = r.hit_rate_fixed;
  if (r.logged_requests > 0) {
    j["logged"] = {{"requests", r.logged_requests}, {"prompt_tokens", r.logged_prompt_tokens}, {"cached_tokens", r.logged_cached_tokens}};
  }
  j["attribution"] = "sequential: each cause is fixed on top of the ones before it, in the order listed; "
                     "points = tokens lost / prompt_tokens";
  ordered_json causes = ordered_json::array();
  for (const auto& c : r.causes) {
    ordered_json x;
    x["cause"] = cause_name(c.cause);
    x["title"] = cause_title(c.cause);
    x["requests_affected"] = c.requests_affected;
    x["tokens_lost"] = c.tokens_lost;
    x["hit_rate_points_lost"] = c.points_lost();
    x["alone_tokens_lost"] = c.alone_tokens_lost;
    x["alone_hit_rate_points_lost"] = c.alone_points_lost();
    x["hit_rate_of_rewritten_log"] = c.hit_rate_after;
    x["fix"] = cause_fix(c.cause);
    if (c.example) {
      const auto& e = *c.example;
      x["example"] = {{"first", e.first_id}, {"second", e.second_id}, {"where", e.where}, {"note", e.note}, {"offset", e.diff.offset},
                      {"context", e.diff.context}, {"first_text", e.diff.a}, {"second_text", e.diff.b}};
    }
    causes.push_back(std::move(x));
  }
  j["causes"] = std::move(causes);
  return j;
}

}  // namespace kvpack::analyze
