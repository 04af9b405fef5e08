// Sliding-window layers free their pages as they fall out of the window (Scheduler::release_out_of_window):
// greedy outputs stay bitwise those of a run that keeps every page (the model runner alone), with
// batching, chunked prefill, the prefix cache and n > 1; the local layers hold a bounded number of pages
// while the global ones grow; admission projects the bound; pool invariants hold at every step.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "gguf/model_writer.h"

using namespace kvpack;

namespace {

struct TmpGemma {
  std::string path;
  explicit TmpGemma(uint32_t window) {
    path = (std::filesystem::temp_directory_path() /
            ("kvpack_swa_" + std::to_string(getpid()) + "_" + std::to_string(window) + ".gguf")).string();
    gguf::RandomModelSpec s = gguf::RandomModelSpec::preset("tiny-gemma3");
    s.sliding_window = window;
    s.n_ctx = 512;
    gguf::write_random_model(s, path);
  }
  ~TmpGemma() { std::filesystem::remove(path); }
};

std::vector<int32_t> prompt_tokens(int32_t n, int32_t salt, int32_t vocab) {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < n; ++i) t.push_back(3 + (i * 37 + salt * 101 + (i * i) % 13) % (vocab - 3));
  return t;
}

double log_softmax_at(const std::vector<float>& lg, int32_t tok) {
  double m = -1e300, sum = 0;
  for (float x : lg) m = std::max(m, static_cast<double>(x));
  for (float x : lg) sum += std::exp(static_cast<double>(x) - m);
  return static_cast<double>(lg[static_cast<size_t>(tok)]) - m - std::log(sum);
}

struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<double> logprobs;  // of each chosen token (float64 log-softmax of the logits)
};

// Greedy continuation with every page kept: the model runner on its own sequence, one token per step.
GreedyRun reference(Engine& e, const std::vector<int32_t>& prompt, int32_t n) {
  auto kv = e.kv().new_sequence(static_cast<int32_t>(prompt.size()) + n);
  std::vector<float> lg(static_cast<size_t>(e.model().config().n_vocab));
  e.runner().prefill(*kv, prompt, lg.data());
  GreedyRun r;
  int32_t tok = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
  for (;;) {
    r.tokens.push_back(tok);
    r.logprobs.push_back(log_softmax_at(lg, tok));
    if (static_cast<int32_t>(r.tokens.size()) == n) return r;
    tok = e.runner().decode_greedy(*kv, tok, lg.data());
  }
}

struct Got {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  RequestStats stats;
  bool done = false;
};

struct Served {
  std::vector<std::vector<Got>> by_prompt;  // [prompt][choice]
  int64_t peak_used = 0;                    // most pool pages in use at any step
  SchedulerMetrics metrics;
};

// The prompts through one scheduler (batching, 40-token prefill chunks that straddle the window edge,
// the prefix cache, prompt 2 with n = 2), pool invariants checked at every step.
Served serve(const Model& model, const std::vector<std::vector<int32_t>>& prompts, int32_t n_gen, bool window_free) {
  EngineOptions eo;
  eo.page_size = 8;
  eo.max_batch_tokens = 64;
  eo.window_free = window_free;
  Engine engine(model, eo);
  SchedulerOptions so;
  so.max_running = 8;
  so.step_tokens = 40;
  Scheduler sched(engine, so);
  std::map<uint64_t, std::vector<Got>> got;
  std::map<uint64_t, size_t> which;
  auto submit = [&](size_t i, int32_t n) {
    Request r;
    r.prompt = prompts[i];
    r.max_tokens = n_gen;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.logprobs = 0;  // the chosen token's log-probability: sees any change in the logits, not only argmax flips
    r.n = n;
    auto holder = std::make_shared<uint64_t>(0);
    const uint64_t id = sched.submit(r, [&got, holder](const RequestEvent& ev) {
      auto& v = got[*holder];
      if (v.size() <= static_cast<size_t>(ev.index)) v.resize(static_cast<size_t>(ev.index) + 1);
      Got& g = v[static_cast<size_t>(ev.index)];
      for (const TokenLogprob& lp : ev.logprobs) g.logprobs.push_back(lp.logprob);
      if (ev.kind == RequestEvent::Kind::Finished) {  // carries every token of the choice
        g.done = true;
        g.tokens = ev.tokens;
        g.stats = ev.stats;
      }
    });
    *holder = id;
    got[id];
    which[id] = i;
  };
  Served out;
  submit(0, 1);
  for (int i = 0; i < 6; ++i) sched.step();  // the first prompt's blocks are cached before the others arrive
  for (size_t i = 1; i < prompts.size(); ++i) submit(i, i == 2 ? 2 : 1);
  for (int step = 0; step < 5000; ++step) {
    bool all = true;
    for (const auto& [id, v] : got) {
      all &= !v.empty();
      for (const Got& g : v) all &= g.done;
    }
    if (all) break;
    sched.step();
    EXPECT_EQ(sched.check_invariants(), "") << "step " << step;
    out.peak_used = std::max(out.peak_used, engine.kv().pool().used_pages());
  }
  out.by_prompt.resize(prompts.size());
  for (auto& [id, v] : got) out.by_prompt[which[id]] = v;
  out.metrics = sched.metrics();
  return out;
}

}  // namespace

TEST(SlidingWindowPages, LocalLayersStayBoundedAndOutputsAreThoseOfKeepingEveryPage) {
  TmpGemma file(24);
  auto model = Model::load(file.path);
  const ModelConfig& c = model->config();
  ASSERT_EQ(c.swa_window, 24);
  const int32_t V = c.n_vocab, n_gen = 150;
  // Prompts of 100 tokens sharing their first 48 (the prefix cache).
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 4; ++i) {
    std::vector<int32_t> p = prompt_tokens(48, 0, V);
    const std::vector<int32_t> tail = prompt_tokens(52, i + 1, V);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  std::vector<GreedyRun> want;
  {
    EngineOptions eo;
    eo.page_size = 8;
    Engine engine(*model, eo);
    for (const auto& p : prompts) want.push_back(reference(engine, p, n_gen));
  }
  const Served freed = serve(*model, prompts, n_gen, true);
  const Served kept = serve(*model, prompts, n_gen, false);
  int64_t freed_pages = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(freed.by_prompt[i].size(), i == 2 ? 2u : 1u);
    ASSERT_EQ(kept.by_prompt[i].size(), freed.by_prompt[i].size());
    for (size_t k = 0; k < freed.by_prompt[i].size(); ++k) {
      const Got& g = freed.by_prompt[i][k];
      const Got& h = kept.by_prompt[i][k];
      ASSERT_TRUE(g.done && h.done);
      EXPECT_EQ(g.tokens, want[i].tokens) << "prompt " << i << " choice " << k;
      EXPECT_EQ(g.tokens, h.tokens) << "prompt " << i << " choice " << k;
      EXPECT_EQ(g.logprobs, h.logprobs) << "bitwise the same with and without freeing: prompt " << i << " choice " << k;
      ASSERT_EQ(g.logprobs.size(), want[i].logprobs.size());
      for (size_t t = 0; t < g.logprobs.size(); ++t)
        ASSERT_NEAR(g.logprobs[t], want[i].logprobs[t], 1e-5) << "prompt " << i << " choice " << k << " token " << t;
      freed_pages += g.stats.window_pages_freed;
      EXPECT_EQ(h.stats.window_pages_freed, 0);
    }
  }
  EXPECT_GT(freed.metrics.prefix.hits, 0) << "the shared 48 tokens hit the cache";
  EXPECT_EQ(freed.metrics.window_pages_freed, freed_pages);
  // Five sequences of 250 tokens, 8-token pages: a global stream holds 32 pages, a local one at most the
  // window plus a prefill step (24 - 1 + 40 slots, rounded out to pages on both ends: 9).
  const int64_t ps = 8, per_stream = (100 + n_gen + ps - 1) / ps, local_bound = (24 - 1 + 40 + ps - 1) / ps + 1;
  int64_t n_local = 0;
  for (int32_t l = 0; l < c.n_layer; ++l) n_local += c.is_swa(l) ? 1 : 0;
  ASSERT_GT(n_local, 0);
  const int64_t bounded = ((c.n_layer - n_local) * per_stream + n_local * local_bound) * c.n_head_kv;
  EXPECT_LE(freed.peak_used, 5 * bounded);
  EXPECT_GT(kept.peak_used * 10, freed.peak_used * 14) << "keeping every page holds at least 1.4x the pages (672 vs 442 when written)";
  EXPECT_GE(freed_pages, 5 * n_local * c.n_head_kv * (per_stream - local_bound));
  std::printf("  tiny-gemma3 window 24, 5 sequences x 250 tokens: peak pages %lld freeing vs %lld keeping; %lld local pages freed\n",
              static_cast<long long>(freed.peak_used), static_cast<long long>(kept.peak_used), static_cast<long long>(freed_pages));
}

// Compression on a model with sliding-window layers applies to the global layers only: the local ones
// keep one slot per token in position order (their pages are freed by the window, not by eviction),
// the global ones are cut back to the budget. With window_layers set (what the scheduler does when
// window freeing is off) every layer is compressed, as before.
TEST(SlidingWindowCompression, PoliciesScoreAndEvictGlobalLayersOnly) {
  TmpGemma file(24);
  auto model = Model::load(file.path);
  const ModelConfig& c = model->config();
  EngineOptions eo;
  eo.page_size = 8;
  Engine engine(*model, eo);
  const std::vector<int32_t> prompt = prompt_tokens(200, 7, c.n_vocab);
  for (const char* policy : {"trispan", "snapkv", "knorm", "h2o"}) {
    for (bool window_layers : {false, true}) {
      compress::CompressConfig kv;
      kv.policy = compress::parse_policy(policy);
      kv.budget = 48;
      kv.interval = 16;
      kv.window_layers = window_layers;
      compress::SequenceCompressor comp(kv, c, nullptr, static_cast<int32_t>(prompt.size()));
      auto seq = engine.kv().new_sequence();
      std::vector<float> lg(static_cast<size_t>(c.n_vocab));
      engine.runner().prefill(*seq, prompt, lg.data(), &comp);
      int32_t tok = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
      for (int i = 0; i < 40; ++i) tok = engine.runner().decode_greedy(*seq, tok, lg.data(), &comp);
      const int32_t total = static_cast<int32_t>(prompt.size()) + 40;
      ASSERT_GT(comp.stats().events, 0) << policy;
      for (int32_t l = 0; l < c.n_layer; ++l)
        for (int32_t h = 0; h < c.n_head_kv; ++h) {
          const int32_t s = seq->stream_index(l, h);
          if (c.is_swa(l) && !window_layers) {
            ASSERT_EQ(seq->n_slots(s), total) << policy << " local layer " << l << " keeps one slot per token";
            for (int32_t j = 0; j < total; ++j) ASSERT_EQ(seq->position(s, j), j) << policy << " layer " << l;
          } else {
            EXPECT_LE(seq->n_slots(s), kv.budget + kv.interval) << policy << " layer " << l << (window_layers ? " (all layers)" : "");
          }
        }
    }
  }
}

// Through the scheduler: compressed requests (with the cold tier and recall on) free their local pages
// as the window passes, compress their global layers, keep the pool's invariants at every step, and
// give the same greedy tokens batched as alone.
TEST(SlidingWindowCompression, CompressedRequestsFreeWindowPagesAndAreBatchInvariant) {
  TmpGemma file(24);
  auto model = Model::load(file.path);
  const ModelConfig& c = model->config();
  const int32_t n_gen = 60;
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 3; ++i) prompts.push_back(prompt_tokens(180 + 10 * i, i + 11, c.n_vocab));
  compress::CompressConfig kv;
  kv.policy = compress::PolicyKind::TriSpan;
  kv.budget = 48;
  kv.interval = 16;
  kv.recall.enabled = true;
  kv.recall.every = 4;
  auto run = [&](bool batched) {
    EngineOptions eo;
    eo.page_size = 8;
    eo.max_batch_tokens = 64;
    eo.kv_cold = "host:64M";
    Engine engine(*model, eo);
    SchedulerOptions so;
    so.max_running = batched ? 8 : 1;
    so.step_tokens = 40;
    Scheduler sched(engine, so);
    std::vector<Got> got(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      Request r;
      r.prompt = prompts[i];
      r.max_tokens = n_gen;
      r.sampling.temperature = 0;
      r.ignore_eos = true;
      r.kv = kv;
      sched.submit(r, [&got, i](const RequestEvent& ev) {
        if (ev.kind != RequestEvent::Kind::Finished) return;
        got[i].done = true;
        got[i].tokens = ev.tokens;
        got[i].stats = ev.stats;
      });
    }
    for (int step = 0; step < 5000; ++step) {
      bool all = true;
      for (const Got& g : got) all &= g.done;
      if (all) break;
      sched.step();
      EXPECT_EQ(sched.check_invariants(), "") << "step " << step;
    }
    return got;
  };
  const std::vector<Got> batched = run(true), alone = run(false);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(batched[i].done && alone[i].done);
    EXPECT_EQ(batched[i].tokens, alone[i].tokens) << "prompt " << i;
    EXPECT_EQ(static_cast<int32_t>(batched[i].tokens.size()), n_gen);
    EXPECT_GT(batched[i].stats.compression.events, 0) << "prompt " << i;
    EXPECT_GT(batched[i].stats.compression.evicted_slots, 0) << "prompt " << i;
    EXPECT_GT(batched[i].stats.window_pages_freed, 0) << "a compressed request frees its local pages too: prompt " << i;
    EXPECT_GT(batched[i].stats.compression.recall.checks, 0) << "prompt " << i;
  }
}
