#include "engine/model_runner.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/sequence.h"

namespace kvpack {

void ModelRunner::ObserverMux::on_query_pre_rope(int32_t b, int32_t l, const float* q, int32_t n, int64_t st) {
  if (ForwardObserver* o = obs[static_cast<size_t>(b)]) o->on_query_pre_rope(0, l, q, n, st);
}
void ModelRunner::ObserverMux::on_query_post_rope(int32_t b, int32_t l, const float* q, int32_t n, int64_t st) {
  if (ForwardObserver* o = obs[static_cast<size_t>(b)]) o->on_query_post_rope(0, l, q, n, st);
}

ModelRunner::ModelRunner(const Model& model, ThreadPool& threads, int32_t max_batch_tokens)
    : model_(&model), threads_(&threads), forward_(model, threads, max_batch_tokens) {}

std::span<float> ModelRunner::execute(const StepPlan& plan) {
  const size_t V = static_cast<size_t>(model_->config().n_vocab);
  // Grows to the largest batch seen, then a step allocates nothing.
  if (logits_.size() < static_cast<size_t>(plan.n_logits) * V) logits_.resize(static_cast<size_t>(plan.n_logits) * V);
  items_.clear();
  mux_.obs.clear();
  bool any_observer = false;
  for (const StepPlan::Item& it : plan.items) {
    Sequence& s = *it.seq;
    BatchItem b;
    b.kv = s.kv.get();
    b.tokens = std::span<const int32_t>(s.tokens.data() + it.begin, static_cast<size_t>(it.n));
    if (it.logits) b.logits = logits_.data() + static_cast<size_t>(it.logits_row) * V;
    if (s.comp) s.comp->prepare(*s.kv, b);
    items_.push_back(b);
    mux_.obs.push_back(s.comp.get());
    any_observer |= s.comp != nullptr;
  }
  if (!forward_.run(items_, any_observer ? &mux_ : nullptr))
    throw std::runtime_error("model runner: the KV pool could not hold the planned step");
  return std::span<float>(logits_.data(), static_cast<size_t>(plan.n_logits) * V);
}

int32_t ModelRunner::decode_greedy(kv::SequenceKv& kv, int32_t token, float* logits, compress::SequenceCompressor* comp) {
  BatchItem item;
  item.kv = &kv;
  item.tokens = std::span<const int32_t>(&token, 1);
  item.logits = logits;
  if (comp) comp->prepare(kv, item);
  if (!forward_.run(std::span<BatchItem>(&item, 1), comp)) throw std::runtime_error("KV pool exhausted");
  if (comp) comp->after_forward(kv, false);
  const int32_t V = model_->config().n_vocab;
  return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
}

int64_t ModelRunner::prefill(kv::SequenceKv& kv, std::span<const int32_t> tokens, float* logits,
                             compress::SequenceCompressor* comp) {
  int64_t peak = kv.pages_held();
  for (size_t i = 0, n = 0; i < tokens.size(); i += n) {
    n = std::min(tokens.size() - i, static_cast<size_t>(forward_.max_batch_tokens()));
    if (comp) n = std::min(n, static_cast<size_t>(comp->tokens_until_trigger(kv)));
    const bool last = i + n == tokens.size();
    BatchItem item;
    item.kv = &kv;
    item.tokens = tokens.subspan(i, n);
    item.logits = last ? logits : nullptr;
    if (comp) comp->prepare(kv, item);
    if (!forward_.run(std::span<BatchItem>(&item, 1), comp))
      throw std::runtime_error("KV cache exhausted: " + std::to_string(kv.pool().used_pages()) + " of " +
                               std::to_string(kv.pool().capacity()) + " pages in use (raise --kv-pages)");
    peak = std::max(peak, kv.pages_held());
    if (comp) comp->after_forward(kv, last);
  }
  return peak;
}

}  // namespace kvpack
