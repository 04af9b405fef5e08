#include "eval/tasks.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <set>
#include <stdexcept>

#include "engine/engine.h"

namespace kvpack::eval {
namespace {

constexpr TaskKind kAll[] = {TaskKind::Needle, TaskKind::VarTrack, TaskKind::Pointer};  // "all": walk is asked for by name

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t kind_tag(TaskKind k) { return static_cast<uint64_t>(k) + 1; }

// ---- word lists (plain lowercase ASCII) ----
const char* const kAdjectives[] = {"red",   "blue",  "green",  "quiet", "happy",  "brave", "small", "tall",
                                   "cold",  "warm",  "bright", "dark",  "gentle", "proud", "quick", "slow",
                                   "round", "sharp", "soft",   "loud",  "early",  "late",  "sweet", "young",
                                   "old",   "wild",  "calm",   "clever", "funny", "lucky", "shiny", "busy"};
const char* const kNouns[] = {"apple", "river", "garden", "window", "dragon", "pencil", "castle", "forest",
                              "rabbit", "candle", "mirror", "basket", "ladder", "kettle", "violin", "anchor",
                              "button", "carpet", "tiger",  "meadow", "jacket", "bottle", "rocket", "flower",
                              "pillow", "harbor", "island", "wagon",  "lantern", "blanket", "compass", "saddle"};
// Built-in filler: "<subject> <verb> <object> <time>."
const char* const kSubjects[] = {"The old farmer", "A little girl",   "The tall teacher", "My neighbour",
                                 "The young baker", "A quiet boy",    "The kind doctor",  "Her brother",
                                 "The busy mother", "A small dog",    "The grey cat",     "His best friend",
                                 "The happy sailor", "An old woman",  "The brave knight", "A tired painter"};
const char* const kVerbs[] = {"walked to",   "looked at",  "talked about", "painted",    "cleaned",    "visited",
                              "waited near", "read about", "sang about",   "dreamed of", "smiled at",  "ran past",
                              "thought about", "played near", "wrote about", "sat beside"};
const char* const kObjects[] = {"the red house", "the green garden", "the old bridge", "the wide river",
                                "the busy market", "the big tree",   "the little boat", "the village school",
                                "the quiet lake", "the tall tower",  "the sunny hill",  "the small bakery",
                                "the dusty road", "the warm kitchen", "the old church", "the windy beach"};
const char* const kTimes[] = {"in the morning", "after lunch",   "before dinner", "on a sunny day", "in the evening",
                              "last week",      "every day",     "in the spring", "during the rain", "at night",
                              "on the weekend", "once again",    "in the summer", "after school",    "before the storm",
                              "with a smile"};

template <class T, size_t N>
const T& pick(Rng& r, const T (&a)[N]) {
  return a[r.below(N)];
}

std::string upper_name(Rng& r, int len) {
  std::string s;
  for (int i = 0; i < len; ++i) s += static_cast<char>('A' + r.below(26));
  return s;
}

// Distinct names of `len` uppercase letters.
std::vector<std::string> upper_names(Rng& r, int count, int len) {
  std::set<std::string> seen;
  std::vector<std::string> out;
  while (static_cast<int>(out.size()) < count) {
    std::string s = upper_name(r, len);
    if (s == "VAR" || !seen.insert(s).second) continue;
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<int64_t> distinct_numbers(Rng& r, int count, int64_t lo, int64_t hi) {  // [lo, hi)
  std::set<int64_t> seen;
  std::vector<int64_t> out;
  while (static_cast<int>(out.size()) < count) {
    const int64_t v = lo + static_cast<int64_t>(r.below(static_cast<uint64_t>(hi - lo)));
    if (seen.insert(v).second) out.push_back(v);
  }
  return out;
}

// The parts of a task that do not depend on how much filler there is.
struct Skeleton {
  std::string header, question, answer;
  struct Item {
    double depth;  // relative position among the filler lines, [0, 1]
    std::string line;
  };
  std::vector<Item> items;  // in emission order for equal positions
  size_t key_item = 0;      // the item whose depth is reported
};

// pointer's and walk's link lines: `chains` chains of `hops` links over distinct 4-letter names, each line at
// its own random depth, chain 0 first (the queried one: node i of chain c is nodes[c * (hops + 1) + i]).
std::vector<std::string> add_link_chains(Skeleton& sk, Rng& r, int chains, int hops) {
  std::vector<std::string> nodes = upper_names(r, chains * (hops + 1), 4);
  sk.header = "Links in this text are written A -> B.";
  for (int c = 0; c < chains; ++c)
    for (int h = 0; h < hops; ++h) {
      const size_t a = static_cast<size_t>(c * (hops + 1) + h);
      sk.items.push_back({r.unit(), nodes[a] + " -> " + nodes[a + 1]});
    }
  sk.key_item = 0;  // the queried chain's first link
  return nodes;
}

Skeleton make_skeleton(TaskKind kind, Rng& r, const TaskOptions& opt, int32_t walk_count) {
  Skeleton sk;
  switch (kind) {
    case TaskKind::Needle: {
      // Queried key adj-noun; distractors share its adjective, its noun, and neither.
      const size_t a = r.below(std::size(kAdjectives)), b = r.below(std::size(kNouns));
      size_t b2 = r.below(std::size(kNouns) - 1), a2 = r.below(std::size(kAdjectives) - 1);
      if (b2 >= b) ++b2;
      if (a2 >= a) ++a2;
      size_t a3, b3;
      do {
        a3 = r.below(std::size(kAdjectives));
        b3 = r.below(std::size(kNouns));
      } while (a3 == a || a3 == a2 || b3 == b || b3 == b2);
      auto key = [](size_t ai, size_t ni) { return std::string(kAdjectives[ai]) + "-" + kNouns[ni]; };
      const std::string keys[4] = {key(a, b), key(a, b2), key(a2, b), key(a3, b3)};
      const std::vector<int64_t> vals = distinct_numbers(r, 4, 1000000, 10000000);
      sk.header = "Some magic numbers are hidden in this text. Remember them.";
      for (int i = 0; i < 4; ++i) {
        const double d = i == 0 && opt.depth >= 0 ? std::clamp(opt.depth, 0.0, 1.0) : r.unit();
        sk.items.push_back({d, "The magic number for " + keys[i] + " is: " + std::to_string(vals[static_cast<size_t>(i)]) + "."});
      }
      // Extra needles (training data only): random keys and values distinct from all others, drawn after the first
      // four so that needles == 4 keeps every existing seed's prompt.
      std::set<std::string> used(std::begin(keys), std::end(keys));
      std::set<int64_t> used_vals(vals.begin(), vals.end());
      for (int i = 4; i < opt.needles; ++i) {
        std::string k;
        do k = key(r.below(std::size(kAdjectives)), r.below(std::size(kNouns)));
        while (!used.insert(k).second);
        int64_t v;
        do v = 1000000 + static_cast<int64_t>(r.below(9000000));
        while (!used_vals.insert(v).second);
        sk.items.push_back({r.unit(), "The magic number for " + k + " is: " + std::to_string(v) + "."});
      }
      sk.key_item = 0;
      sk.question = "What is the magic number for " + keys[0] + "?\nThe magic number for " + keys[0] + " is:";
      sk.answer = " " + std::to_string(vals[0]);
      break;
    }
    case TaskKind::VarTrack: {
      constexpr int kChains = 2, kHops = 4;
      const std::vector<std::string> names = upper_names(r, kChains * (kHops + 1), 5);
      const std::vector<int64_t> vals = distinct_numbers(r, kChains, 10000, 100000);
      sk.header = "Remember the variables in this text.";
      // One chain's lines: its number, then each variable copying the previous one, in order at random depths.
      auto add_chain = [&](const std::string* chain, int64_t val) {
        std::vector<double> d(kHops + 1);
        for (double& x : d) x = r.unit();
        std::sort(d.begin(), d.end());
        for (int h = 0; h <= kHops; ++h) {
          const std::string rhs = h == 0 ? std::to_string(val) : "VAR " + chain[h - 1];
          sk.items.push_back({d[static_cast<size_t>(h)], "VAR " + chain[h] + " = " + rhs + "."});
        }
      };
      for (int c = 0; c < kChains; ++c) add_chain(&names[static_cast<size_t>(c * (kHops + 1))], vals[static_cast<size_t>(c)]);
      // Extra chains (training data only), drawn after the first two so that chains == 2 keeps every seed's prompt.
      std::set<std::string> used_names(names.begin(), names.end());
      std::set<int64_t> used_vals(vals.begin(), vals.end());
      for (int c = kChains; c < opt.chains; ++c) {
        std::string chain[kHops + 1];
        for (std::string& v : chain) {
          do v = upper_name(r, 5);
          while (!used_names.insert(v).second);
        }
        int64_t val;
        do val = 10000 + static_cast<int64_t>(r.below(90000));
        while (!used_vals.insert(val).second);
        add_chain(chain, val);
      }
      sk.key_item = 0;
      // The answer traces the chain back to its number, one assignment per step ("VAR E = VAR D = ... = 12345"),
      // so each generated step must find its line far back in the prompt (as in pointer). Asking for the bare
      // number instead needs all four hops resolved inside one forward pass, which a small testbed model does
      // not learn (it settles at guessing one of the two chains' numbers: 50%; docs/testbed.md).
      const std::string& last = names[kHops];
      sk.question = "Question: What is the value of VAR " + last + "?\nAnswer: VAR " + last + " =";
      for (int h = kHops - 1; h >= 0; --h) sk.answer += " VAR " + names[static_cast<size_t>(h)] + " =";
      sk.answer += " " + std::to_string(vals[0]);
      break;
    }
    case TaskKind::Pointer: {
      constexpr int kHops = 4, kDistractorChains = 3;
      const std::vector<std::string> nodes = add_link_chains(sk, r, 1 + kDistractorChains, kHops);
      sk.question = "Question: Start at " + nodes[0] + " and follow " + std::to_string(kHops) + " links.\n"
                    "Answer: " + nodes[0] + " ->";
      std::string ans;
      for (int h = 1; h <= kHops; ++h) ans += (h > 1 ? " -> " : " ") + nodes[static_cast<size_t>(h)];
      sk.answer = ans;
      break;
    }
    case TaskKind::Walk: {
      // Pointer's links (the walk's 4 plus three distractor chains of 4). The answer walks, counts down, and
      // repeats the answer line from its start: every token of the repeat is an induction copy of the
      // model's own walk ~3 tokens per count earlier ("Answer:" -> the start node -> " ->" -> the next node
      // ...), the regime where a compressed cache must have kept what the model generated long before.
      // (Stating where the walk ended instead — "The walk ended at X" — needed the node five tokens back
      // without a copy cue; the testbed model did not learn it: docs/testbed.md §12.)
      constexpr int kHops = 4, kDistractorChains = 3;
      const std::vector<std::string> nodes = add_link_chains(sk, r, 1 + kDistractorChains, kHops);
      auto node = [&](int i) -> const std::string& { return nodes[static_cast<size_t>(i)]; };
      sk.question = "Question: Start at " + node(0) + " and follow " + std::to_string(kHops) + " links. Then count down from " +
                    std::to_string(walk_count) + ". Then repeat the answer.\nAnswer: " + node(0) + " ->";
      std::string walk;
      for (int h = 1; h <= kHops; ++h) walk += (h > 1 ? " -> " : " ") + node(h);
      // The count restates the question's words, so its first number is a copy of the question's (a model
      // trained without the cue wrote a default number there instead).
      std::string ans = walk + ". Then count down from " + std::to_string(walk_count) + ":";
      for (int k = walk_count; k >= 0; --k) ans += " " + std::to_string(k) + (k > 0 ? "," : ".");
      sk.answer = ans + " Answer: " + node(0) + " ->" + walk;
      break;
    }
  }
  return sk;
}

struct Assembled {
  std::string prompt;
  double key_depth = 0;
};

// Filler lines interleaved with the skeleton's items: item i goes before filler line round(depth * S).
Assembled assemble(const Skeleton& sk, int64_t S, const std::function<const std::string&(int64_t)>& filler) {
  std::vector<std::pair<int64_t, size_t>> order;  // (position, item index)
  for (size_t i = 0; i < sk.items.size(); ++i)
    order.emplace_back(static_cast<int64_t>(std::llround(sk.items[i].depth * static_cast<double>(S))), i);
  std::stable_sort(order.begin(), order.end(), [](auto& x, auto& y) { return x.first < y.first; });
  Assembled a;
  std::string& p = a.prompt;
  p = sk.header;
  p += '\n';
  size_t k = 0;
  for (int64_t j = 0; j <= S; ++j) {
    for (; k < order.size() && order[k].first == j; ++k) {
      p += sk.items[order[k].second].line;
      p += '\n';
    }
    if (j < S) {
      p += filler(j);
      p += '\n';
    }
  }
  p += sk.question;
  a.key_depth = S > 0 ? static_cast<double>(order.empty() ? 0 : std::llround(sk.items[sk.key_item].depth * static_cast<double>(S))) / static_cast<double>(S)
                      : 0.0;
  return a;
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

}  // namespace

uint64_t Rng::next() {
  uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint64_t Rng::below(uint64_t n) { return next() % n; }
double Rng::unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

uint64_t sample_seed(uint64_t seed, TaskKind kind, int32_t index) {
  return mix(mix(seed) ^ (kind_tag(kind) << 32) ^ static_cast<uint64_t>(static_cast<uint32_t>(index)));
}

TaskKind parse_task(const std::string& name) {
  if (name == "needle") return TaskKind::Needle;
  if (name == "vartrack") return TaskKind::VarTrack;
  if (name == "pointer") return TaskKind::Pointer;
  if (name == "walk") return TaskKind::Walk;
  throw std::invalid_argument("unknown task '" + name + "' (valid: needle, vartrack, pointer, walk, all)");
}

const char* task_name(TaskKind k) {
  switch (k) {
    case TaskKind::Needle: return "needle";
    case TaskKind::VarTrack: return "vartrack";
    case TaskKind::Pointer: return "pointer";
    case TaskKind::Walk: return "walk";
  }
  return "?";
}

std::vector<TaskKind> all_tasks() { return {std::begin(kAll), std::end(kAll)}; }

std::vector<TaskKind> parse_tasks(const std::string& list) {
  if (list == "all") return all_tasks();
  std::vector<TaskKind> out;
  size_t i = 0;
  while (i <= list.size()) {
    const size_t j = std::min(list.find(',', i), list.size());
    const std::string name = list.substr(i, j - i);
    if (!name.empty()) {
      const std::vector<TaskKind> ks = name == "all" ? all_tasks() : std::vector<TaskKind>{parse_task(name)};
      for (TaskKind k : ks)
        if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
    }
    i = j + 1;
  }
  if (out.empty()) throw std::invalid_argument("no task given (valid: needle, vartrack, pointer, walk, all)");
  return out;
}

std::string builtin_filler(uint64_t seed, int64_t index) {
  Rng r(mix(seed ^ 0xF111E5ull) ^ mix(static_cast<uint64_t>(index)));
  std::string s = pick(r, kSubjects);
  s += ' ';
  s += pick(r, kVerbs);
  s += ' ';
  s += pick(r, kObjects);
  s += ' ';
  s += pick(r, kTimes);
  s += '.';
  return s;
}

std::vector<std::string> filler_sentences(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    // trim
    size_t b = 0, e = cur.size();
    while (b < e && cur[b] == ' ') ++b;
    while (e > b && cur[e - 1] == ' ') --e;
    std::string s = cur.substr(b, e - b);
    cur.clear();
    if (s.empty()) return;
    int words = 1, upper_run = 0;
    bool ok = true;
    for (size_t i = 0; i < s.size() && ok; ++i) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      if (c < 0x20 || c > 0x7e || std::isdigit(c)) ok = false;
      if (c == ' ') ++words;
      upper_run = std::isupper(c) ? upper_run + 1 : 0;
      if (upper_run >= 2) ok = false;
      if (c == '-' && i + 1 < s.size() && s[i + 1] == '>') ok = false;
    }
    if (ok && words >= 3 && words <= 30) out.push_back(std::move(s));
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '_') continue;
    if (is_ws(c)) {
      if (!cur.empty() && cur.back() != ' ') cur += ' ';
      continue;
    }
    cur += c;
    if ((c == '.' || c == '!' || c == '?') && (i + 1 == text.size() || is_ws(text[i + 1]))) flush();
  }
  return out;
}

Task make_task(TaskKind kind, int32_t ctx_tokens, uint64_t seed, const Tokenizer* tok, const TaskOptions& opt) {
  if (opt.needles < kNeedlesMin || opt.needles > kNeedlesMax)
    throw std::invalid_argument("needles must be in [" + std::to_string(kNeedlesMin) + ", " + std::to_string(kNeedlesMax) +
                                "], got " + std::to_string(opt.needles));
  if (opt.chains < kChainsMin || opt.chains > kChainsMax)
    throw std::invalid_argument("chains must be in [" + std::to_string(kChainsMin) + ", " + std::to_string(kChainsMax) +
                                "], got " + std::to_string(opt.chains));
  if (opt.walk_count != 0 && (opt.walk_count < kWalkCountMin || opt.walk_count > kWalkCountMax))
    throw std::invalid_argument("walk count must be 0 (the default, " + std::to_string(kWalkCountDefault) + ") or in [" +
                                std::to_string(kWalkCountMin) + ", " + std::to_string(kWalkCountMax) + "], got " +
                                std::to_string(opt.walk_count));
  const int32_t walk_count = opt.walk_count != 0 ? opt.walk_count : kWalkCountDefault;
  Rng r(mix(seed) ^ mix(kind_tag(kind)));
  const Skeleton sk = make_skeleton(kind, r, opt, walk_count);
  // Filler: its own stream, independent of how many lines end up used.
  Rng fr(mix(seed ^ 0xF1ull) ^ mix(kind_tag(kind) + 7));
  const uint64_t fseed = fr.next();
  const int64_t fstart = opt.filler.empty() ? 0 : static_cast<int64_t>(fr.below(opt.filler.size()));
  std::string scratch;
  auto filler = [&](int64_t j) -> const std::string& {
    if (!opt.filler.empty()) return opt.filler[static_cast<size_t>((fstart + j) % static_cast<int64_t>(opt.filler.size()))];
    scratch = builtin_filler(fseed, j);
    return scratch;
  };
  auto count = [&](const std::string& s) -> int64_t {
    if (tok == nullptr) return static_cast<int64_t>(s.size());
    return static_cast<int64_t>(tok->encode(s, tok->bos() >= 0).size());
  };
  const int64_t ans_est = tok ? static_cast<int64_t>(tok->encode(sk.answer, false).size()) : static_cast<int64_t>(sk.answer.size());
  const int64_t target = static_cast<int64_t>(ctx_tokens) - ans_est - opt.gen_margin;
  auto prompt_len = [&](int64_t S) { return count(assemble(sk, S, filler).prompt); };
  const int64_t base = prompt_len(0);
  if (base > target)
    throw std::invalid_argument(std::string("context ") + std::to_string(ctx_tokens) + " is too small for task " + task_name(kind) +
                                " (it needs at least " + std::to_string(base + ans_est + opt.gen_margin) + ")");
  // Largest S with prompt_len(S) <= target: grow, then bisect.
  int64_t lo = 0, hi = 8;
  while (prompt_len(hi) <= target) {
    lo = hi;
    if (hi > (int64_t{1} << 24)) throw std::invalid_argument("task sizing did not converge");
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (prompt_len(mid) <= target ? lo : hi) = mid;
  }
  for (int64_t S = lo;; --S) {
    Assembled a = assemble(sk, S, filler);
    Task t;
    t.kind = kind;
    t.seed = seed;
    t.ctx_target = ctx_tokens;
    t.prompt_tokens = static_cast<int32_t>(count(a.prompt));
    t.answer_tokens = static_cast<int32_t>(count(a.prompt + sk.answer) - t.prompt_tokens);
    t.max_tokens = t.answer_tokens + opt.gen_margin;
    if (t.prompt_tokens + t.max_tokens > ctx_tokens && S > 0) continue;
    if (t.prompt_tokens + t.max_tokens > ctx_tokens)
      throw std::invalid_argument(std::string("context ") + std::to_string(ctx_tokens) + " is too small for task " + task_name(kind));
    t.prompt = std::move(a.prompt);
    t.answer = sk.answer;
    t.depth = a.key_depth;
    t.filler_lines = static_cast<int32_t>(S);
    return t;
  }
}

bool score_answer(std::string_view generated, std::string_view expected) {
  std::string g, e;
  for (char c : generated)
    if (!is_ws(c)) g += c;
  for (char c : expected)
    if (!is_ws(c)) e += c;
  return !e.empty() && g.compare(0, e.size(), e) == 0;
}

TaskResult run_task(Engine& engine, TaskKind kind, int32_t ctx_tokens, int32_t n, uint64_t seed,
                    const compress::CompressConfig& kv, const TaskOptions& opt) {
  const Model& m = engine.model();
  const Tokenizer& tok = m.tokenizer();
  if (ctx_tokens > m.config().n_ctx)
    throw std::invalid_argument("--ctx " + std::to_string(ctx_tokens) + " exceeds the model's context " + std::to_string(m.config().n_ctx));
  if (n < 1) throw std::invalid_argument("task sample count must be >= 1");
  TaskResult res;
  res.kind = kind;
  res.n = n;
  double prompt_sum = 0;
  TaskOptions o = opt;  // copied once (the filler may be large); only the depth changes per sample
  for (int32_t i = 0; i < n; ++i) {
    if (kind == TaskKind::Needle && opt.depth < 0) o.depth = n > 1 ? static_cast<double>(i) / (n - 1) : 0.5;
    TaskSample s;
    s.task = make_task(kind, ctx_tokens, sample_seed(seed, kind, i), &tok, o);
    Request req;
    req.prompt = tok.encode(s.task.prompt, tok.bos() >= 0);
    req.max_tokens = opt.answer_only ? s.task.answer_tokens : s.task.max_tokens;
    req.sampling.temperature = 0;  // greedy
    req.kv = kv;
    const GenerateResult g = engine.generate(req, nullptr);
    s.generated = g.text;
    s.correct = score_answer(g.text, s.task.answer);
    s.peak_resident_kv_bytes = g.peak_resident_kv_bytes;
    s.recall = g.compression.recall;
    s.evicted = g.evicted;
    res.correct += s.correct ? 1 : 0;
    prompt_sum += static_cast<double>(req.prompt.size());
    res.peak_resident_kv_bytes = std::max(res.peak_resident_kv_bytes, g.peak_resident_kv_bytes);
    res.compression.add(g.compression);
    res.samples.push_back(std::move(s));
    if (opt.on_sample) opt.on_sample(i + 1);
  }
  res.accuracy = static_cast<double>(res.correct) / n;
  res.mean_prompt_tokens = prompt_sum / n;
  return res;
}

}  // namespace kvpack::eval
