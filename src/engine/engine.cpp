#include "engine/engine.h"

#include <chrono>
#include <stdexcept>

#include "engine/text_stream.h"

namespace kvpack {
namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

kv::PoolConfig default_pool_config(const ModelConfig& c, const EngineOptions& opt) {
  kv::PoolConfig pc;
  pc.page_size = opt.page_size;
  pc.head_dim = c.head_dim;
  pc.kv_type = opt.kv_type;
  const int64_t streams = static_cast<int64_t>(c.n_layer) * c.n_head_kv;
  pc.max_pages = opt.kv_pages > 0 ? opt.kv_pages : streams * ((c.n_ctx + opt.page_size - 1) / opt.page_size);
  return pc;
}

Engine::Engine(const Model& model, const EngineOptions& opt)
    : model_(&model),
      opt_(opt),
      threads_(opt.threads),
      pool_(default_pool_config(model.config(), opt)),
      forward_(model, threads_, opt.max_batch_tokens) {}

std::unique_ptr<kv::SequenceKv> Engine::new_sequence() {
  return std::make_unique<kv::SequenceKv>(pool_, model_->config().n_layer, model_->config().n_head_kv);
}

int64_t Engine::prefill(kv::SequenceKv& kv, std::span<const int32_t> tokens, float* logits,
                        compress::SequenceCompressor* comp) {
  int64_t peak = kv.pages_held();
  for (size_t i = 0, n = 0; i < tokens.size(); i += n) {
    n = std::min(tokens.size() - i, static_cast<size_t>(opt_.max_batch_tokens));
    // A compressed sequence's chunk ends where the next event fires (never above budget + interval).
    if (comp) n = std::min(n, static_cast<size_t>(comp->tokens_until_trigger(kv)));
    const bool last = i + n == tokens.size();
    BatchItem item;
    item.kv = &kv;
    item.tokens = tokens.subspan(i, n);
    item.logits = last ? logits : nullptr;
    if (comp) comp->prepare(kv, item);
    if (!forward_.run(std::span<BatchItem>(&item, 1), comp))
      throw std::runtime_error("KV cache exhausted: " + std::to_string(pool_.used_pages()) + " of " +
                               std::to_string(pool_.capacity()) + " pages in use (raise --kv-pages)");
    peak = std::max(peak, kv.pages_held());
    if (comp) comp->after_forward(kv, last);
  }
  return peak;
}

GenerateResult Engine::generate(const GenerateRequest& req, const std::function<bool(std::string_view)>& on_text) {
  const ModelConfig& c = model_->config();
  const Tokenizer& tok = model_->tokenizer();
  if (req.prompt.empty()) throw std::invalid_argument("empty prompt (it needs at least one token, e.g. BOS)");
  if (static_cast<int64_t>(req.prompt.size()) > c.n_ctx)
    throw std::invalid_argument("prompt has " + std::to_string(req.prompt.size()) + " tokens but the context is " +
                                std::to_string(c.n_ctx));
  GenerateResult res;
  res.prompt_tokens = static_cast<int32_t>(req.prompt.size());
  auto kv = new_sequence();
  // Page tables sized for the whole request up front: decode steps then allocate nothing.
  kv->reserve_slots(static_cast<int32_t>(std::min<int64_t>(c.n_ctx, static_cast<int64_t>(req.prompt.size()) + req.max_tokens + 1)));
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  Sampler sampler(req.sampling, c.n_vocab);
  TextStream stream(req.stop);
  std::unique_ptr<compress::SequenceCompressor> comp;
  if (req.kv.enabled())
    comp = std::make_unique<compress::SequenceCompressor>(req.kv, c, calib_.get(), static_cast<int32_t>(req.prompt.size()),
                                                          &threads_);
  std::vector<int32_t> history(req.prompt);
  history.reserve(req.prompt.size() + static_cast<size_t>(std::max(0, req.max_tokens)));
  size_t peak_pages = 0;

  const double t0 = now_seconds();
  peak_pages = static_cast<size_t>(prefill(*kv, req.prompt, logits.data(), comp.get()));
  const double t1 = now_seconds();
  res.prefill_seconds = t1 - t0;

  int32_t prev = req.prompt.back();
  res.stop_reason = "length";
  for (int32_t i = 0; i < req.max_tokens; ++i) {
    const int32_t next = sampler.sample(logits.data(), history);
    if (!req.ignore_eos && tok.is_eog(next)) {
      res.stop_reason = "eos";
      break;
    }
    res.tokens.push_back(next);
    history.push_back(next);
    const std::string piece = tok.piece_after(prev, next);  // SPM: no leading space right after BOS
    prev = next;
    const std::string text = stream.push(piece);
    res.text += text;
    if (!text.empty() && on_text && !on_text(text)) {
      res.stop_reason = "cancelled";
      break;
    }
    if (stream.stopped()) {
      res.stop_reason = "stop";
      break;
    }
    if (i + 1 == req.max_tokens) break;  // no need to run the model for a token nobody samples
    if (kv->next_pos() >= c.n_ctx) {
      res.stop_reason = "context";
      break;
    }
    BatchItem item;
    item.kv = kv.get();
    const int32_t one[1] = {next};
    item.tokens = std::span<const int32_t>(one, 1);
    item.logits = logits.data();
    if (comp) comp->prepare(*kv, item);
    if (!forward_.run(std::span<BatchItem>(&item, 1), comp.get()))
      throw std::runtime_error("KV cache exhausted during decode (" + std::to_string(pool_.used_pages()) + " pages in use)");
    ++res.decode_steps;
    peak_pages = std::max(peak_pages, static_cast<size_t>(comp ? comp->peak_accounted_pages(*kv) : kv->pages_held()));
    if (comp) comp->after_forward(*kv, false);
  }
  if (res.stop_reason != "stop") {
    const std::string rest = stream.flush();
    res.text += rest;
    if (!rest.empty() && on_text) on_text(rest);
  }
  res.decode_seconds = now_seconds() - t1;
  res.kv_pages_in_use = comp ? comp->accounted_pages(*kv) : kv->pages_held();
  res.resident_kv_bytes = static_cast<size_t>(res.kv_pages_in_use) * pool_.page_bytes();
  res.peak_resident_kv_bytes = peak_pages * pool_.page_bytes();
  res.pool_reserved_bytes = pool_.reserved_bytes();
  if (comp) res.compression = comp->stats();
  return res;
}

}  // namespace kvpack
