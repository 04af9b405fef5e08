// Quality harness, task part: the generators are deterministic per seed, sized to the target context,
// and their answers follow from the prompt (checked by parsing the prompt back); with budget >= context
// every policy generates exactly what full KV generates.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "eval/kld.h"
#include "eval/tasks.h"
#include "model/model.h"

namespace {

using kvpack::Model;
using kvpack::eval::TaskKind;
namespace eval = kvpack::eval;

const std::string kShared = KVPACK_SHARED_DIR;

const Model& model() {
  static const std::unique_ptr<Model> m = Model::load(kShared + "/models/stories260K.gguf");
  return *m;
}

size_t count_of(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The count option `field` of a 1024-token task: set to `harness` it gives exactly the harness's prompt
// (the default options'); returns the task made with `more` instead, checked to still fit the context.
eval::Task task_with_count(TaskKind kind, int32_t eval::TaskOptions::*field, int32_t harness, int32_t more, uint64_t seed,
                           const kvpack::Tokenizer& tok) {
  eval::TaskOptions o;
  o.*field = harness;
  EXPECT_EQ(eval::make_task(kind, 1024, seed, &tok, o).prompt, eval::make_task(kind, 1024, seed, &tok).prompt);
  o.*field = more;
  eval::Task t = eval::make_task(kind, 1024, seed, &tok, o);
  EXPECT_LE(t.prompt_tokens + t.max_tokens, 1024);
  return t;
}

// make_task(kind) rejects the count option `field` one below `lo` and one above `hi`.
void expect_count_range_enforced(TaskKind kind, int32_t eval::TaskOptions::*field, int32_t lo, int32_t hi,
                                 const kvpack::Tokenizer& tok) {
  eval::TaskOptions bad;
  for (int32_t v : {lo - 1, hi + 1}) {
    bad.*field = v;
    EXPECT_THROW(eval::make_task(kind, 1024, 1, &tok, bad), std::invalid_argument) << "count " << v;
  }
}

TEST(EvalTasks, NamesParse) {
  EXPECT_EQ(eval::parse_tasks("all").size(), 3u);  // the prompt-regime tasks; walk is asked for by name
  EXPECT_EQ(eval::parse_tasks("all,walk"), (std::vector<TaskKind>{TaskKind::Needle, TaskKind::VarTrack, TaskKind::Pointer, TaskKind::Walk}));
  EXPECT_EQ(eval::parse_task("walk"), TaskKind::Walk);
  EXPECT_STREQ(eval::task_name(TaskKind::Walk), "walk");
  EXPECT_EQ(eval::parse_tasks("pointer,needle"), (std::vector<TaskKind>{TaskKind::Pointer, TaskKind::Needle}));
  EXPECT_THROW(eval::parse_tasks("needle,bogus"), std::invalid_argument);
  for (TaskKind k : eval::all_tasks()) EXPECT_EQ(eval::parse_task(eval::task_name(k)), k);
}

TEST(EvalTasks, ScoringIsExactMatchAtTheStartIgnoringWhitespace) {
  EXPECT_TRUE(eval::score_answer(" 1234567.\nThe", " 1234567"));
  EXPECT_TRUE(eval::score_answer("AB -> CD ->EF", " AB -> CD -> EF"));
  EXPECT_FALSE(eval::score_answer(" 123456", " 1234567"));
  EXPECT_FALSE(eval::score_answer("x 1234567", " 1234567"));
  EXPECT_FALSE(eval::score_answer("anything", " "));
}

TEST(EvalTasks, DeterministicPerSeedAndSeedsDiffer) {
  for (const Model* m : {&model(), static_cast<const Model*>(nullptr)}) {
    const kvpack::Tokenizer* tok = m ? &m->tokenizer() : nullptr;
    for (TaskKind k : eval::all_tasks()) {
      const eval::Task a = eval::make_task(k, 512, 7, tok);
      const eval::Task b = eval::make_task(k, 512, 7, tok);
      const eval::Task c = eval::make_task(k, 512, 8, tok);
      EXPECT_EQ(a.prompt, b.prompt);
      EXPECT_EQ(a.answer, b.answer);
      EXPECT_NE(a.prompt, c.prompt);
      EXPECT_NE(a.answer, c.answer);
      EXPECT_EQ(a.answer[0], ' ');
      EXPECT_NE(a.prompt.back(), ' ');
    }
  }
  // Pinned: a seed means the same task on every platform (no std:: distributions).
  EXPECT_EQ(eval::Rng(1).next(), 0x910a2dec89025cc1ull);
  EXPECT_EQ(eval::builtin_filler(1, 0), eval::builtin_filler(1, 0));
}

TEST(EvalTasks, PromptLengthIsCloseToTheTarget) {
  const kvpack::Tokenizer& tok = model().tokenizer();
  for (TaskKind k : eval::all_tasks()) {
    for (int32_t ctx : {512, 1024, 2048}) {
      for (uint64_t seed : {1u, 2u, 3u}) {
        const eval::Task t = eval::make_task(k, ctx, seed, &tok);
        SCOPED_TRACE(std::string(eval::task_name(k)) + " ctx " + std::to_string(ctx));
        EXPECT_EQ(t.prompt_tokens, static_cast<int32_t>(tok.encode(t.prompt, true).size()));
        EXPECT_LE(t.prompt_tokens + t.max_tokens, ctx);
        EXPECT_GE(t.prompt_tokens + t.max_tokens, ctx - 40) << "one filler line short at most";
        EXPECT_GT(t.answer_tokens, 1);
      }
      // Byte-sized (character-level models).
      const eval::Task b = eval::make_task(k, ctx * 4, 5, nullptr);
      EXPECT_LE(static_cast<int32_t>(b.prompt.size()) + b.max_tokens, ctx * 4);
      EXPECT_GE(static_cast<int32_t>(b.prompt.size()) + b.max_tokens, ctx * 4 - 100);
      EXPECT_EQ(b.prompt_tokens, static_cast<int32_t>(b.prompt.size()));
    }
  }
  EXPECT_THROW(eval::make_task(TaskKind::VarTrack, 64, 1, &tok), std::invalid_argument);
}

TEST(EvalTasks, NeedleValueAppearsOnceForItsKeyAndDepthIsSwept) {
  const kvpack::Tokenizer& tok = model().tokenizer();
  const std::regex needle_re("The magic number for ([a-z]+-[a-z]+) is: ([0-9]{7})\\.");
  for (uint64_t seed = 0; seed < 20; ++seed) {
    eval::TaskOptions o;
    o.depth = static_cast<double>(seed % 5) / 4.0;
    const eval::Task t = eval::make_task(TaskKind::Needle, 1024, seed, &tok, o);
    const std::string value = t.answer.substr(1);
    EXPECT_EQ(count_of(t.prompt, value), 1u) << t.prompt;
    std::map<std::string, std::string> needles;
    int n_needles = 0;
    for (const auto& l : lines_of(t.prompt)) {
      std::smatch m;
      if (std::regex_match(l, m, needle_re)) {
        EXPECT_TRUE(needles.emplace(m[1], m[2]).second) << "key repeated: " << m[1];
        ++n_needles;
      }
    }
    EXPECT_EQ(n_needles, 4);
    // The question names the key whose needle holds the answer.
    const std::string q = lines_of(t.prompt).back();
    const std::string key = q.substr(std::string("The magic number for ").size(), q.size() - std::string("The magic number for ").size() - 4);
    ASSERT_TRUE(needles.count(key)) << q;
    EXPECT_EQ(needles[key], value);
    // Distractors share the key's adjective or noun.
    const std::string adj = key.substr(0, key.find('-')), noun = key.substr(key.find('-'));
    int share_adj = 0, share_noun = 0;
    for (const auto& [k2, v2] : needles) {
      if (k2 == key) continue;
      share_adj += k2.rfind(adj + "-", 0) == 0;
      share_noun += k2.size() >= noun.size() && k2.compare(k2.size() - noun.size(), noun.size(), noun) == 0;
    }
    EXPECT_GE(share_adj, 1);
    EXPECT_GE(share_noun, 1);
    // Depth: the needle sits where asked (relative position of its line among the body lines).
    EXPECT_NEAR(t.depth, o.depth, 0.05);
    const size_t at = t.prompt.find("for " + key + " is: " + value);
    const double rel = static_cast<double>(at) / static_cast<double>(t.prompt.size());
    EXPECT_NEAR(rel, o.depth, 0.15) << "needle at " << rel << " of the prompt";
  }
}

// More needles (training data for the testbed model): 4 stays the harness's prompt; 8 gives 8 distinct keys and
// values with the answer still under the queried key; out-of-range counts are rejected.
TEST(EvalTasks, NeedleCountIsAnOptionForTrainingData) {
  const kvpack::Tokenizer& tok = model().tokenizer();
  const std::regex needle_re("The magic number for ([a-z]+-[a-z]+) is: ([0-9]{7})\\.");
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const eval::Task t = task_with_count(TaskKind::Needle, &eval::TaskOptions::needles, 4, 8, seed, tok);
    std::map<std::string, std::string> needles;
    std::set<std::string> values;
    for (const auto& l : lines_of(t.prompt)) {
      std::smatch m;
      if (std::regex_match(l, m, needle_re)) {
        EXPECT_TRUE(needles.emplace(m[1], m[2]).second) << "key repeated: " << m[1];
        EXPECT_TRUE(values.insert(m[2]).second) << "value repeated: " << m[2];
      }
    }
    EXPECT_EQ(needles.size(), 8u) << t.prompt;
    const std::string q = lines_of(t.prompt).back();
    const std::string key = q.substr(std::string("The magic number for ").size(), q.size() - std::string("The magic number for ").size() - 4);
    ASSERT_TRUE(needles.count(key)) << q;
    EXPECT_EQ(" " + needles[key], t.answer);
  }
  expect_count_range_enforced(TaskKind::Needle, &eval::TaskOptions::needles, eval::kNeedlesMin, eval::kNeedlesMax, tok);
}

TEST(EvalTasks, VarTrackChainResolvesToTheAnswer) {
  const kvpack::Tokenizer& tok = model().tokenizer();
  const std::regex var_re("VAR ([A-Z]{5}) = (VAR ([A-Z]{5})|([0-9]{5}))\\.");
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const eval::Task t = eval::make_task(TaskKind::VarTrack, 1024, seed, &tok);
    std::map<std::string, std::string> assign;  // name -> rhs ("VAR X" or number)
    std::vector<std::string> order;
    for (const auto& l : lines_of(t.prompt)) {
      std::smatch m;
      if (std::regex_match(l, m, var_re)) {
        EXPECT_TRUE(assign.emplace(m[1], m[3].matched ? std::string(m[3]) : "=" + std::string(m[4])).second);
        if (m[3].matched) {
          EXPECT_TRUE(assign.count(m[3])) << "assigned before use: " << m[3];
        }
      }
    }
    EXPECT_EQ(assign.size(), 10u);
    const std::string q = lines_of(t.prompt)[lines_of(t.prompt).size() - 2];  // Question: What is the value of VAR X?
    std::smatch m;
    ASSERT_TRUE(std::regex_search(q, m, std::regex("VAR ([A-Z]{5})\\?"))) << q;
    std::string v = m[1];
    EXPECT_TRUE(t.prompt.ends_with("Answer: VAR " + v + " =")) << t.prompt.substr(t.prompt.size() - 60);
    int hops = 0;
    std::string trace;  // the expected answer: every variable of the chain, then its number
    while (assign[v][0] != '=') {
      v = assign[v];
      trace += " VAR " + v + " =";
      ++hops;
    }
    EXPECT_EQ(hops, 4);
    trace += " " + assign[v].substr(1);
    EXPECT_EQ(trace, t.answer);
    EXPECT_EQ(count_of(t.prompt, assign[v].substr(1)), 1u);
  }
}

// More chains (training data for the testbed model): 2 stays the harness's prompt; 4 gives 20 distinct variables
// in 4 chains of 4 hops, each ending at its own number, with the answer still tracing the queried chain;
// out-of-range counts are rejected.
TEST(EvalTasks, VarTrackChainCountIsAnOptionForTrainingData) {
  const kvpack::Tokenizer& tok = model().tokenizer();
  const std::regex var_re("VAR ([A-Z]{5}) = (VAR ([A-Z]{5})|([0-9]{5}))\\.");
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const eval::Task t = task_with_count(TaskKind::VarTrack, &eval::TaskOptions::chains, 2, 4, seed, tok);
    std::map<std::string, std::string> assign;  // name -> rhs name, or "=" + number
    std::set<std::string> rhs_names, numbers;
    for (const auto& l : lines_of(t.prompt)) {
      std::smatch m;
      if (!std::regex_match(l, m, var_re)) continue;
      EXPECT_TRUE(assign.emplace(m[1], m[3].matched ? std::string(m[3]) : "=" + std::string(m[4])).second) << "name repeated: " << m[1];
      if (m[3].matched) {
        EXPECT_TRUE(assign.count(m[3])) << "assigned before use: " << m[3];
        EXPECT_TRUE(rhs_names.insert(m[3]).second) << "two variables copy " << m[3];
      } else {
        EXPECT_TRUE(numbers.insert(m[4]).second) << "number repeated: " << m[4];
      }
    }
    EXPECT_EQ(assign.size(), 20u) << t.prompt;
    EXPECT_EQ(numbers.size(), 4u);
    int ends = 0;  // chain ends (variables nobody copies): each is 4 hops from its number
    for (const auto& [name, rhs] : assign) {
      if (rhs_names.count(name)) continue;
      ++ends;
      std::string v = name;
      int hops = 0;
      while (assign[v][0] != '=' && hops < 10) {
        v = assign[v];
        ++hops;
      }
      EXPECT_EQ(hops, 4) << name;
    }
    EXPECT_EQ(ends, 4);
    const std::string q = lines_of(t.prompt)[lines_of(t.prompt).size() - 2];
    std::smatch m;
    ASSERT_TRUE(std::regex_search(q, m, std::regex("VAR ([A-Z]{5})\\?"))) << q;
    std::string v = m[1], trace;
    while (assign[v][0] != '=') {
      v = assign[v];
      trace += " VAR " + v + " =";
    }
    EXPECT_EQ(trace + " " + assign[v].substr(1), t.answer);
  }
  expect_count_range_enforced(TaskKind::VarTrack, &eval::TaskOptions::chains, eval::kChainsMin, eval::kChainsMax, tok);
}

TEST(EvalTasks, PointerPathFollowsTheLinks) {
  const kvpack::Tokenizer& tok = model().tokenizer();
  const std::regex link_re("([A-Z]{4}) -> ([A-Z]{4})");
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const eval::Task t = eval::make_task(TaskKind::Pointer, 1024, seed, &tok);
    std::map<std::string, std::string> next;
    for (const auto& l : lines_of(t.prompt)) {
      std::smatch m;
      if (std::regex_match(l, m, link_re)) {
        EXPECT_TRUE(next.emplace(m[1], m[2]).second) << "source repeated: " << m[1];
      }
    }
    EXPECT_EQ(next.size(), 16u);
    const std::string last = lines_of(t.prompt).back();  // "Answer: ABCD ->"
    ASSERT_EQ(last.rfind("Answer: ", 0), 0u);
    std::string node = last.substr(8, 4), path;
    for (int h = 0; h < 4; ++h) {
      ASSERT_TRUE(next.count(node)) << node;
      node = next[node];
      path += (h ? " -> " : " ") + node;
    }
    EXPECT_EQ(path, t.answer);
    EXPECT_FALSE(next.count(node)) << "the path ends after 4 hops";
  }
}

// walk: parsing the prompt back, the answer is the 4-link walk from the start node, the count down from the
// question's number to 0, and the answer line again from "Answer:" after the whole count.
TEST(EvalTasks, WalkCountsDownAndRepeatsTheAnswerLine) {
  const kvpack::Tokenizer& tok = model().tokenizer();
  const std::regex link_re("([A-Z]{4}) -> ([A-Z]{4})");
  const std::regex question_re("Question: Start at ([A-Z]{4}) and follow 4 links\\. Then count down from ([0-9]+)\\. "
                               "Then repeat the answer\\.");
  for (const kvpack::Tokenizer* tk : {&tok, static_cast<const kvpack::Tokenizer*>(nullptr)}) {
    for (uint64_t seed = 0; seed < 12; ++seed) {
      const int32_t ctx = tk ? 1024 : 4096;
      const eval::Task t = eval::make_task(TaskKind::Walk, ctx, seed, tk);
      SCOPED_TRACE("seed " + std::to_string(seed));
      std::map<std::string, std::string> next;
      std::smatch m;
      std::string start;
      int count = -1;
      for (const auto& l : lines_of(t.prompt)) {
        if (std::regex_match(l, m, link_re)) {
          EXPECT_TRUE(next.emplace(m[1], m[2]).second) << "source repeated: " << m[1];
        } else if (std::regex_match(l, m, question_re)) {
          start = m[1];
          count = std::stoi(m[2]);
        }
      }
      EXPECT_EQ(next.size(), 16u);
      EXPECT_EQ(count, eval::kWalkCountDefault) << "the count is fixed, whatever the context";
      ASSERT_FALSE(start.empty());
      EXPECT_EQ(lines_of(t.prompt).back(), "Answer: " + start + " ->");
      std::string node = start, expect;
      for (int h = 0; h < 4; ++h) {
        node = next.at(node);
        expect += (h ? " -> " : " ") + node;
      }
      EXPECT_FALSE(next.count(node)) << "the walk ends after 4 hops";
      const std::string walk = expect;
      expect += ". Then count down from " + std::to_string(count) + ":";
      for (int k = count; k >= 0; --k) {  // appended piece by piece: GCC 12 warns (-Wrestrict) on " " + to_string
        expect += ' ';
        expect += std::to_string(k);
        expect += k ? ',' : '.';
      }
      expect += " Answer: " + start + " ->" + walk;
      EXPECT_EQ(t.answer, expect);
      EXPECT_EQ(count_of(t.prompt + t.answer, "Answer: " + start + " ->"), 2u);
      if (tk) {
        EXPECT_GT(t.answer_tokens, ctx / 8) << "the answer is a large share of the context";
      }
    }
  }
  // An explicit count: in the question and in the answer; out of range throws.
  eval::TaskOptions o;
  o.walk_count = 9;
  const eval::Task nine = eval::make_task(TaskKind::Walk, 1024, 3, &tok, o);
  EXPECT_NE(nine.prompt.find("Then count down from 9."), std::string::npos);
  EXPECT_NE(nine.answer.find(". Then count down from 9: 9, 8, 7, 6, 5, 4, 3, 2, 1, 0. Answer: "), std::string::npos);
  for (int32_t bad : {eval::kWalkCountMin - 1, eval::kWalkCountMax + 1}) {
    o.walk_count = bad;
    EXPECT_THROW(eval::make_task(TaskKind::Walk, 1024, 3, &tok, o), std::invalid_argument) << bad;
  }
}

TEST(EvalTasks, FillerFromRealText) {
  const std::vector<std::string> f = eval::filler_sentences(eval::read_text_file(kShared + "/corpora/austen.txt"));
  ASSERT_GT(f.size(), 1000u);
  for (const auto& s : f) {
    EXPECT_EQ(s.find_first_of("0123456789_\n"), std::string::npos) << s;
    EXPECT_EQ(s.find("->"), std::string::npos);
  }
  eval::TaskOptions o;
  o.filler = f;
  const eval::Task t = eval::make_task(TaskKind::Needle, 1024, 3, &model().tokenizer(), o);
  int from_file = 0;
  for (const auto& l : lines_of(t.prompt)) from_file += std::find(f.begin(), f.end(), l) != f.end();
  EXPECT_GT(from_file, 5);
  EXPECT_EQ(t.prompt, eval::make_task(TaskKind::Needle, 1024, 3, &model().tokenizer(), o).prompt);
}

// Acceptance criterion: with budget >= context, task accuracy (indeed every generation) equals full.
TEST(EvalTasks, BudgetAtLeastContextGeneratesExactlyWhatFullGenerates) {
  kvpack::EngineOptions eo;
  eo.threads = 1;
  kvpack::Engine engine(model(), eo);
  const auto toks = eval::tokenize_head(model().tokenizer(), eval::read_text_file(kShared + "/corpora/austen.txt"), 2048);
  engine.set_calibration(kvpack::calibrate(model(), toks, eo));
  const int32_t ctx = 512;
  using kvpack::compress::PolicyKind;
  kvpack::compress::CompressConfig full;
  for (TaskKind k : eval::all_tasks()) {
    const eval::TaskResult ref = eval::run_task(engine, k, ctx, 3, 11, full);
    EXPECT_EQ(ref.n, 3);
    EXPECT_GT(ref.mean_prompt_tokens, ctx * 0.8);
    EXPECT_LE(ref.mean_prompt_tokens, ctx);
    for (PolicyKind p : {PolicyKind::Streaming, PolicyKind::KNorm, PolicyKind::TriAttention, PolicyKind::SnapKV, PolicyKind::RKV,
                         PolicyKind::TOVA, PolicyKind::H2O}) {
      kvpack::compress::CompressConfig c;
      c.policy = p;
      c.budget = ctx;
      const eval::TaskResult r = eval::run_task(engine, k, ctx, 3, 11, c);
      SCOPED_TRACE(std::string(eval::task_name(k)) + " " + kvpack::compress::policy_name(p));
      EXPECT_EQ(r.accuracy, ref.accuracy);
      EXPECT_EQ(r.compression.events, 0);
      for (size_t i = 0; i < r.samples.size(); ++i) EXPECT_EQ(r.samples[i].generated, ref.samples[i].generated);
      EXPECT_EQ(r.peak_resident_kv_bytes, ref.peak_resident_kv_bytes);
    }
    // And a small budget does compress (decode-time eviction after a long prompt) and holds less KV.
    kvpack::compress::CompressConfig small;
    small.policy = PolicyKind::Streaming;
    small.budget = 64;
    const eval::TaskResult s = eval::run_task(engine, k, ctx, 3, 11, small);
    EXPECT_GT(s.compression.events, 0);
    EXPECT_LT(s.peak_resident_kv_bytes, ref.peak_resident_kv_bytes);
  }
}

}  // namespace
