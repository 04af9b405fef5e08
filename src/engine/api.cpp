// Implementation of the public embedding API (include/kvpack/kvpack.h) on top of the engine.
#include "kvpack/kvpack.h"

#include <stdexcept>

#include "compress/calibration.h"
#include "engine/auto_calibration.h"
#include "engine/engine.h"
#include "kernels/attention.h"
#include "model/model.h"

namespace kvpack {

struct Session::Impl {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  compress::CompressConfig kv;
  AutoCalibrationInfo calibration;
};

Session::Session() : impl_(std::make_unique<Impl>()) {}
Session::~Session() = default;

std::unique_ptr<Session> Session::open(const SessionOptions& o) {
  std::unique_ptr<Session> s(new Session());
  Impl& im = *s->impl_;
  im.model = Model::load(o.model_path, o.tokenizer_path);
  EngineOptions eo;
  eo.threads = o.threads;
  eo.kv_type = kernels::parse_kv_type(o.kv_type);  // throws on unknown names
  eo.kv_pages = o.kv_pages;
  im.engine = std::make_unique<Engine>(*im.model, eo);
  im.kv.policy = compress::resolve_policy(o.kv_policy, o.kv_budget);  // "" + a budget: the recommended policy
  im.kv.budget = o.kv_budget;
  im.kv.interval = o.kv_interval;
  im.kv.split = compress::parse_split(o.kv_split);
  if (compress::policy_needs_calibration(im.kv.policy) && !o.kv_calib.empty())
    im.engine->set_calibration(compress::QueryStats::load(o.kv_calib, im.model->config()));
  // triattention without kv_calib: computed once on built-in text and cached (engine/auto_calibration.h).
  if (im.kv.budget > 0) ensure_calibration(*im.engine, im.kv.policy, &im.calibration, /*progress=*/false);
  im.kv.validate(im.model->config(), im.engine->calibration());
  return s;
}

std::string Session::generate(const std::string& prompt, const GenerateOptions& o,
                              const std::function<bool(std::string_view)>& on_text, GenerateStats* stats) {
  const Tokenizer& tok = impl_->model->tokenizer();
  Request req;
  req.prompt = tok.encode(prompt, o.add_bos && tok.bos() >= 0);
  if (req.prompt.empty()) throw std::invalid_argument("empty prompt and the model has no BOS token");
  req.max_tokens = o.max_tokens;
  req.sampling.temperature = o.temperature;
  req.sampling.top_k = o.top_k;
  req.sampling.top_p = o.top_p;
  req.sampling.min_p = o.min_p;
  req.sampling.repeat_penalty = o.repeat_penalty;
  req.sampling.seed = o.seed;
  req.stop = o.stop;
  req.kv = impl_->kv;
  const GenerateResult r = impl_->engine->generate(req, on_text);
  if (stats) {
    stats->prompt_tokens = r.prompt_tokens;
    stats->generated_tokens = static_cast<int32_t>(r.tokens.size());
    stats->stop_reason = finish_reason_name(r.finish);
    stats->prefill_tokens_per_s = r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0;
    stats->decode_tokens_per_s = r.decode_seconds > 0 ? r.decode_steps / r.decode_seconds : 0;
    stats->resident_kv_bytes = r.resident_kv_bytes;
    stats->peak_resident_kv_bytes = r.peak_resident_kv_bytes;
    stats->kv_pages_in_use = r.kv_pages_in_use;
    stats->compactions = r.compression.events;
    stats->evicted_slots = r.compression.evicted_slots;
    stats->freed_pages = r.compression.freed_pages;
    stats->reclaim_efficiency = r.compression.reclaim_efficiency();
    stats->compaction_seconds = r.compression.seconds;
  }
  return r.text;
}

std::vector<int32_t> Session::tokenize(const std::string& text, bool add_bos) const {
  return impl_->model->tokenizer().encode(text, add_bos);
}

std::string Session::detokenize(const std::vector<int32_t>& tokens) const { return impl_->model->tokenizer().decode(tokens); }

std::string Session::describe() const {
  const ModelConfig& c = impl_->model->config();
  return c.arch + " " + std::to_string(c.n_layer) + " layers, embd " + std::to_string(c.n_embd) + ", heads " +
         std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + ", vocab " + std::to_string(c.n_vocab) + ", ctx " +
         std::to_string(c.n_ctx) + (c.random_weights ? " (random weights)" : "");
}

std::string Session::calibration_report() const {
  return impl_->calibration.tokens > 0 ? impl_->calibration.describe() : "";
}

}  // namespace kvpack
