#include "eval/kld.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>

namespace kvpack::eval {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

EngineOptions sized_for(const Model& model, const EngineOptions& eo, int32_t ctx, int sequences) {
  EngineOptions e = eo;
  if (e.kv_pages == 0) {
    const ModelConfig& c = model.config();
    const int64_t streams = static_cast<int64_t>(c.n_layer) * c.n_head_kv;
    e.kv_pages = sequences * streams * ((ctx + e.page_size - 1) / e.page_size + 1);
  }
  return e;
}

void run_one(Engine& engine, kv::SequenceKv& seq, const int32_t* token, float* logits, compress::SequenceCompressor* comp) {
  BatchItem item;
  item.kv = &seq;
  item.tokens = std::span<const int32_t>(token, 1);
  item.logits = logits;
  if (comp) comp->prepare(seq, item);
  if (!engine.runner().forward().run(std::span<BatchItem>(&item, 1), comp))
    throw std::runtime_error("KV cache exhausted: " + std::to_string(engine.kv().pool().used_pages()) + " of " +
                             std::to_string(engine.kv().pool().capacity()) + " pages in use (raise --kv-pages)");
}

}  // namespace

int32_t log_softmax(const float* x, int32_t n, std::vector<double>& lp) {
  int32_t am = 0;
  for (int32_t i = 1; i < n; ++i)
    if (x[i] > x[am]) am = i;
  const double mx = x[am];
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = std::log(sum);
  for (int32_t i = 0; i < n; ++i) lp[static_cast<size_t>(i)] = (static_cast<double>(x[i]) - mx) - lse;
  return am;
}

std::vector<std::vector<int32_t>> make_windows(const Model& model, std::span<const int32_t> text_tokens, int32_t ctx,
                                               int32_t max_windows) {
  const ModelConfig& c = model.config();
  if (ctx < 2 || ctx > c.n_ctx)
    throw std::invalid_argument("--ctx " + std::to_string(ctx) + " must be in [2, " + std::to_string(c.n_ctx) + "] (the model's context)");
  const int32_t bos = model.tokenizer().bos();
  const size_t per = static_cast<size_t>(ctx - (bos >= 0 ? 1 : 0));
  const size_t n = std::min(static_cast<size_t>(std::max(0, max_windows)), text_tokens.size() / per);
  if (n == 0)
    throw std::invalid_argument("the text has " + std::to_string(text_tokens.size()) + " tokens, fewer than one window of " +
                                std::to_string(ctx));
  std::vector<std::vector<int32_t>> w(n);
  for (size_t k = 0; k < n; ++k) {
    if (bos >= 0) w[k].push_back(bos);
    w[k].insert(w[k].end(), text_tokens.begin() + static_cast<long>(k * per), text_tokens.begin() + static_cast<long>((k + 1) * per));
  }
  return w;
}

FullReference full_reference(const Model& model, const std::vector<std::vector<int32_t>>& windows, const EngineOptions& eo) {
  if (windows.empty()) throw std::invalid_argument("no windows");
  const int32_t V = model.config().n_vocab;
  Engine engine(model, sized_for(model, eo, static_cast<int32_t>(windows[0].size()), 1));
  FullReference ref;
  for (const auto& w : windows) {
    std::vector<float> lg(w.size() * static_cast<size_t>(V));
    auto seq = engine.kv().new_sequence();
    for (size_t i = 0; i < w.size(); ++i) {
      run_one(engine, *seq, &w[i], lg.data() + i * static_cast<size_t>(V), nullptr);
      ref.peak_pages = std::max(ref.peak_pages, seq->pages_held());
    }
    ref.final_pages = seq->pages_held();
    ref.logits.push_back(std::move(lg));
  }
  return ref;
}

KldResult kld(const Model& model, const std::vector<std::vector<int32_t>>& windows, const compress::CompressConfig& kv,
              const compress::QueryStats* calib, const EngineOptions& eo, const FullReference* ref,
              const std::function<void(int64_t)>& on_position) {
  if (windows.empty()) throw std::invalid_argument("no windows");
  int64_t done = 0;
  if (ref && ref->logits.size() != windows.size()) throw std::invalid_argument("reference does not match the windows");
  const ModelConfig& c = model.config();
  const int32_t V = c.n_vocab;
  const int32_t ctx = static_cast<int32_t>(windows[0].size());
  const double t0 = now_s();
  Engine engine(model, sized_for(model, eo, ctx, ref ? 1 : 2));
  KldResult r;
  r.windows = static_cast<int32_t>(windows.size());
  r.ctx = ctx;
  r.page_bytes = engine.kv().pool().page_bytes();
  std::vector<float> lf(static_cast<size_t>(V)), lc(static_cast<size_t>(V));
  std::vector<double> pf(static_cast<size_t>(V)), pc(static_cast<size_t>(V));
  std::vector<double> kls;
  double nll_f = 0, nll_c = 0, kl_after = 0;
  int64_t agree = 0;
  for (size_t wi = 0; wi < windows.size(); ++wi) {
    const auto& w = windows[wi];
    if (static_cast<int32_t>(w.size()) != ctx) throw std::invalid_argument("windows must all have the same length");
    std::unique_ptr<compress::SequenceCompressor> comp;
    if (kv.enabled()) comp = std::make_unique<compress::SequenceCompressor>(kv, c, calib, 1, &engine.runner().threads());
    auto seq_c = engine.kv().new_sequence();
    std::unique_ptr<kv::SequenceKv> seq_f = ref ? nullptr : engine.kv().new_sequence();
    bool evicted = false;
    for (size_t i = 0; i < w.size(); ++i) {
      const float* full_logits;
      if (ref) {
        full_logits = ref->logits[wi].data() + i * static_cast<size_t>(V);
      } else {
        run_one(engine, *seq_f, &w[i], lf.data(), nullptr);
        r.full_peak_pages = std::max(r.full_peak_pages, seq_f->pages_held());
        full_logits = lf.data();
      }
      run_one(engine, *seq_c, &w[i], lc.data(), comp.get());
      r.peak_pages = std::max(r.peak_pages, comp ? comp->accounted_pages(*seq_c) : seq_c->pages_held());  // naive: virtual pages
      if (i + 1 < w.size()) {
        const int32_t af = log_softmax(full_logits, V, pf);
        const int32_t ac = log_softmax(lc.data(), V, pc);
        double kl = 0;
        for (int32_t v = 0; v < V; ++v) {
          const double lp = pf[static_cast<size_t>(v)];
          kl += std::exp(lp) * (lp - pc[static_cast<size_t>(v)]);
        }
        kl = std::max(0.0, kl);  // rounding can leave a -1e-17
        kls.push_back(kl);
        agree += af == ac ? 1 : 0;
        const int32_t next = w[i + 1];
        nll_f -= pf[static_cast<size_t>(next)];
        nll_c -= pc[static_cast<size_t>(next)];
        if (evicted) {
          ++r.positions_after_eviction;
          kl_after += kl;
        }
      }
      if (comp && comp->after_forward(*seq_c, i == 0)) evicted = true;
      if (on_position) on_position(++done);
    }
    r.final_pages = comp ? comp->accounted_pages(*seq_c) : seq_c->pages_held();
    if (seq_f) r.full_final_pages = seq_f->pages_held();
    if (comp) r.compression.add(comp->stats());
  }
  if (ref) {
    r.full_peak_pages = ref->peak_pages;
    r.full_final_pages = ref->final_pages;
  }
  r.positions = static_cast<int64_t>(kls.size());
  if (r.positions > 0) {
    double sum = 0;
    for (double k : kls) sum += k;
    r.mean_kl = sum / static_cast<double>(r.positions);
    std::vector<double> sorted = kls;
    std::sort(sorted.begin(), sorted.end());
    const size_t idx = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(sorted.size()))) - 1;  // nearest rank
    r.p99_kl = sorted[std::min(idx, sorted.size() - 1)];
    r.max_kl = sorted.back();
    r.top1 = static_cast<double>(agree) / static_cast<double>(r.positions);
    r.ppl_full = std::exp(nll_f / static_cast<double>(r.positions));
    r.ppl_compressed = std::exp(nll_c / static_cast<double>(r.positions));
  }
  r.mean_kl_after_eviction = r.positions_after_eviction > 0 ? kl_after / static_cast<double>(r.positions_after_eviction) : 0.0;
  r.seconds = now_s() - t0;
  return r;
}

KldResult kld(const Model& model, std::span<const int32_t> text_tokens, const compress::CompressConfig& kv,
              const compress::QueryStats* calib, const KldOptions& opt) {
  return kld(model, make_windows(model, text_tokens, opt.ctx, opt.max_windows), kv, calib, opt.engine, nullptr);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> tokenize_head(const Tokenizer& tok, const std::string& text, int64_t max_tokens) {
  size_t len = static_cast<size_t>(std::max<int64_t>(64, max_tokens) * 6);
  for (;;) {
    size_t cut = std::min(len, text.size());
    if (cut < text.size()) {  // end at whitespace, so no word (or UTF-8 sequence) is split
      const size_t ws = text.find_last_of(" \n", cut);
      if (ws != std::string::npos && ws > 0) cut = ws;
    }
    std::vector<int32_t> t = tok.encode(std::string_view(text).substr(0, cut), false);
    if (static_cast<int64_t>(t.size()) >= max_tokens || cut >= text.size()) {
      if (static_cast<int64_t>(t.size()) > max_tokens) t.resize(static_cast<size_t>(max_tokens));
      return t;
    }
    len *= 2;
  }
}


}  // namespace kvpack::eval
