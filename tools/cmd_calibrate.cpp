// `kvpack calibrate`: TriAttention query statistics for a model, from one pass over plain text.
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "commands.h"
#include "compress/calibration.h"
#include "engine/calibrate.h"
#include "options.h"
#include "util/progress.h"

namespace kvpack::cli {

void add_calibrate(CLI::App& app) {
  auto* cmd = app.add_subcommand("calibrate", "Compute TriAttention query statistics for a model");
  auto o = std::make_shared<ModelOptions>();
  auto text_path = std::make_shared<std::string>();
  auto out_path = std::make_shared<std::string>();
  auto max_tokens = std::make_shared<int64_t>(32768);
  add_model_options(*cmd, *o);
  cmd->add_option("--text", *text_path, "Plain-text file to run the model over")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", *out_path, "Statistics file to write")->required();
  cmd->add_option("--max-tokens", *max_tokens, "Tokens of text to use (in context-sized windows)")->check(CLI::PositiveNumber);
  cmd->callback([=] {
    auto model = load_model(*o);
    const ModelConfig& c = model->config();
    const std::string text = read_file(*text_path).value_or("");
    // Tokenise at most what we need (about 8 bytes per token is generous for English).
    const std::string head = text.substr(0, static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(text.size()), *max_tokens * 8)));
    std::vector<int32_t> toks = model->tokenizer().encode(head, false);
    if (static_cast<int64_t>(toks.size()) > *max_tokens) toks.resize(static_cast<size_t>(*max_tokens));
    if (toks.empty()) throw std::runtime_error(*text_path + ": no tokens");
    Progress progress("calibrate", static_cast<int64_t>(toks.size()), "tokens");
    const compress::QueryStats st = calibrate(*model, toks, engine_options(*o), [&](int64_t done) { progress.set(done); });
    progress.finish();
    const int64_t used = st.tokens;
    st.save(*out_path);
    // Concentration summary (mean resultant length over all heads and bands, weighted by E|q|).
    double num = 0, den = 0;
    for (size_t i = 0; i < st.abs_mean.size(); ++i) {
      num += std::sqrt(st.mean_re[i] * st.mean_re[i] + st.mean_im[i] * st.mean_im[i]);
      den += st.abs_mean[i];
    }
    std::fprintf(stderr, "[kvpack] calibrated %s on %lld tokens: %d layers x %d heads x %d bands, mean concentration R=%.3f -> %s\n",
                 c.name.c_str(), static_cast<long long>(used), st.n_layer, st.n_head, st.n_bands, den > 0 ? num / den : 0.0,
                 out_path->c_str());
  });
}

}  // namespace kvpack::cli
