// GGUF model loading: hyper-parameters from `<arch>.*` keys, tensors by llama.cpp's names.
#include <algorithm>
#include <cmath>
#include <limits>
#include <filesystem>

#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "util/checked.h"

namespace kvpack {
namespace {

struct Loader {
  const gguf::File& f;
  const std::string& arch;
  size_t bytes = 0;

  // Integer hyper-parameters: a value that does not fit the int32 destination is an error, never
  // truncated (key_length = 2^32 + 8 must not become 8); ranges are checked by Model::check_hparams.
  int32_t need_int(const std::string& key) const {
    auto v = f.get_int(arch + "." + key);
    if (!v) throw ModelError(f.name() + ": missing metadata key '" + arch + "." + key + "'");
    return checked_cast<int32_t>(*v, f.name() + ": " + arch + "." + key);
  }
  int32_t opt_int(const std::string& key, int64_t def) const {
    return checked_cast<int32_t>(f.get_int(arch + "." + key).value_or(def), f.name() + ": " + arch + "." + key);
  }
  // Float hyper-parameters: converting a double outside float's range is undefined behaviour, so such a
  // value (or NaN) is an error here; positivity is checked by Model::check_hparams.
  float opt_float(const std::string& key, double def) const {
    const double v = f.get_float(arch + "." + key).value_or(def);
    if (!(std::fabs(v) <= std::numeric_limits<float>::max()))
      throw ModelError(f.name() + ": " + arch + "." + key + " = " + std::to_string(v) + " is not a finite float");
    return static_cast<float>(v);
  }

  // Loads a tensor and checks its shape: GGUF shape is {n_in, n_out} (or {n} for vectors).
  Weight tensor(const std::string& name, int64_t n_in, int64_t n_out, bool required = true) {
    const gguf::TensorInfo* t = f.tensor(name);
    if (t == nullptr) {
      if (required) throw ModelError(f.name() + ": missing tensor '" + name + "'");
      return {};
    }
    const bool vec = n_out == 1;
    const bool ok = vec ? (t->shape.size() == 1 && static_cast<int64_t>(t->shape[0]) == n_in)
                        : (t->shape.size() == 2 && static_cast<int64_t>(t->shape[0]) == n_in &&
                           static_cast<int64_t>(t->shape[1]) == n_out);
    if (!ok) {
      std::string got;
      for (auto d : t->shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
      throw ModelError(f.name() + ": tensor '" + name + "' has shape [" + got + "], expected [" + std::to_string(n_in) +
                       (vec ? "" : ", " + std::to_string(n_out)) + "]");
    }
    if (vec && t->type != DType::F32)
      throw ModelError(f.name() + ": tensor '" + name + "' must be F32 (norm/bias), is " + std::string(dtype_name(t->type)));
    if (!vec && !kernels::matmul_supports(t->type))
      throw ModelError(f.name() + ": tensor '" + name + "' has unsupported type " + std::string(dtype_name(t->type)));
    bytes += t->n_bytes;
    return Weight{t->data, t->type, n_in, n_out};
  }
};

// Rows [r0, r0 + n) of a matrix as a matrix of its own (no copy: GGUF rows are contiguous and every
// row is a whole number of blocks). How phi3's fused attn_qkv / ffn_up tensors are split.
Weight row_view(const Weight& w, int64_t r0, int64_t n) {
  Weight v = w;
  v.data = static_cast<const uint8_t*>(w.data) + row_bytes(w.type, static_cast<uint64_t>(w.n_in)) * static_cast<uint64_t>(r0);
  v.n_out = n;
  return v;
}

}  // namespace

std::unique_ptr<Model> Model::load_gguf(const std::string& path) {
  std::unique_ptr<Model> m(new Model());
  m->gguf_ = gguf::File::open(path);
  const gguf::File& f = *m->gguf_;
  ModelConfig& c = m->cfg_;
  c.arch = f.get_string("general.architecture").value_or("");
  if (c.arch.empty()) throw ModelError(path + ": no general.architecture (vocab-only file?)");
  if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "qwen3" && c.arch != "phi3" && c.arch != "gemma3")
    throw ModelError(path + ": unknown architecture '" + c.arch + "' (supported: llama, qwen2, qwen3, phi3, gemma3)");
  const bool phi3 = c.arch == "phi3", gemma3 = c.arch == "gemma3";
  c.name = f.get_string("general.name").value_or(std::filesystem::path(path).filename().string());
  c.random_weights = f.get_bool("kvpack.random_weights").value_or(false) ||
                     c.name.find("random") != std::string::npos;
  Loader L{f, c.arch};
  c.n_embd = L.need_int("embedding_length");
  c.n_layer = L.need_int("block_count");
  c.n_head = L.need_int("attention.head_count");
  c.n_head_kv = L.opt_int("attention.head_count_kv", c.n_head);
  c.n_ff = L.need_int("feed_forward_length");
  c.n_ctx = L.need_int("context_length");
  c.head_dim = L.opt_int("attention.key_length", c.n_head > 0 ? c.n_embd / c.n_head : 0);
  if (L.opt_int("attention.value_length", c.head_dim) != c.head_dim)
    throw ModelError(path + ": key_length != value_length is not supported");
  c.rope_dims = L.opt_int("rope.dimension_count", c.head_dim);
  c.rope_theta = L.opt_float("rope.freq_base", 10000.0);
  c.rms_eps = L.opt_float("attention.layer_norm_rms_epsilon", 1e-5);
  if (auto st = f.get_string(c.arch + ".rope.scaling.type"); st && *st == "linear")
    c.rope_freq_scale = 1.0f / L.opt_float("rope.scaling.factor", 1.0);
  else if (st && *st != "none")
    throw ModelError(path + ": rope scaling '" + *st + "' is not supported yet");
  c.rope_neox = c.arch != "llama";  // llama.cpp: LLAMA uses normal RoPE, QWEN2/QWEN3/PHI3/GEMMA3 NeoX
  c.qk_norm = c.arch == "qwen3" || gemma3;
  c.qkv_bias = c.arch == "qwen2";
  if (phi3) {
    // llama.cpp ignores phi3.attention.sliding_window (it warns "Phi SWA is currently disabled" and runs
    // full causal attention, llama-model phi3 hparams); kvpack does the same, so logits match llama.cpp.
    // LongRoPE (the 128k models' rope_factors_long/short tensors) is not implemented: refused below.
    if (f.tensor("rope_factors_long.weight") != nullptr || f.tensor("rope_factors_short.weight") != nullptr)
      throw ModelError(path + ": phi3 with LongRoPE factors (rope_factors_long/short, the 128k-context models) is "
                              "not supported yet");
  }
  if (gemma3) {
    // As llama.cpp's gemma3 graph: embeddings * sqrt(n_embd), GeGLU, post-attention / post-FFN norms (the
    // converter already stored Gemma's RMSNorm weights as 1 + w), q/k norms, query scale 1/sqrt(head_dim)
    // except the 27B shape (62 layers: 1/sqrt(n_embd / n_head)); llama.cpp does not read
    // query_pre_attn_scalar for gemma3, nor does kvpack.
    c.gelu_ffn = true;
    c.post_norms = true;
    c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
    if (c.n_layer == 62 && c.n_head > 0) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head));
    c.logit_softcap = L.opt_float("final_logit_softcapping", 0.0);
    if (c.logit_softcap < 0) throw ModelError(path + ": negative gemma3.final_logit_softcapping");
    c.swa_window = L.opt_int("attention.sliding_window", 0);
    if (c.swa_window < 0) throw ModelError(path + ": negative gemma3.attention.sliding_window");
    if (c.swa_window > 0) {
      c.rope_theta_swa = L.opt_float("rope.freq_base_swa", 10000.0);
      c.rope_freq_scale_swa = 1.0f;  // llama.cpp: linear rope scaling applies to the global layers only
      if (!(c.rope_theta_swa > 0)) throw ModelError(path + ": gemma3.rope.freq_base_swa must be positive");
    }
  }

  m->tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(f));
  c.n_vocab = L.opt_int("vocab_size", m->tok_->n_vocab());
  // Before anything is sized from them (w.layers, the tensor shapes below, the engine's buffers).
  m->check_hparams(path);
  if (c.swa_window > 0) {
    c.swa_layer.assign(static_cast<size_t>(c.n_layer), 0);
    const std::string pk = c.arch + ".attention.sliding_window_pattern";
    if (const auto* arr = f.get_int_array(pk)) {  // per-layer flags
      if (arr->size() < c.swa_layer.size()) throw ModelError(path + ": " + pk + " is shorter than block_count");
      for (size_t l = 0; l < c.swa_layer.size(); ++l) c.swa_layer[l] = (*arr)[l] != 0;
    } else {
      // llama.cpp set_swa_pattern(n): every n-th layer global, the others local (default n = 6: 5 : 1).
      const int32_t n = L.opt_int("attention.sliding_window_pattern", 6);
      if (n < 0) throw ModelError(path + ": negative " + pk);
      for (int32_t l = 0; l < c.n_layer; ++l) c.swa_layer[static_cast<size_t>(l)] = n == 0 || l % n < n - 1;
    }
  }

  ModelWeights& w = m->w_;
  w.tok_embd = L.tensor("token_embd.weight", c.n_embd, c.n_vocab);
  w.out_norm = L.tensor("output_norm.weight", c.n_embd, 1);
  w.output = L.tensor("output.weight", c.n_embd, c.n_vocab, false);
  if (!w.output) {
    w.output = w.tok_embd;
    c.tied_embeddings = true;
  }
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int32_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    lw.attn_norm = L.tensor(p + "attn_norm.weight", c.n_embd, 1);
    if (phi3 && f.tensor(p + "attn_qkv.weight") != nullptr) {
      // Fused Q|K|V rows (llama.cpp build_qkv: Q at 0, K at q_dim, V at q_dim + kv_dim).
      const Weight qkv = L.tensor(p + "attn_qkv.weight", c.n_embd, int64_t{c.q_dim()} + 2 * int64_t{c.kv_dim()});
      lw.wq = row_view(qkv, 0, c.q_dim());
      lw.wk = row_view(qkv, c.q_dim(), c.kv_dim());
      lw.wv = row_view(qkv, int64_t{c.q_dim()} + c.kv_dim(), c.kv_dim());
      if (f.tensor(p + "attn_qkv.bias") != nullptr) throw ModelError(path + ": phi3 attn_qkv.bias is not supported");
    } else {
      lw.wq = L.tensor(p + "attn_q.weight", c.n_embd, c.q_dim());
      lw.wk = L.tensor(p + "attn_k.weight", c.n_embd, c.kv_dim());
      lw.wv = L.tensor(p + "attn_v.weight", c.n_embd, c.kv_dim());
    }
    lw.wo = L.tensor(p + "attn_output.weight", c.q_dim(), c.n_embd);
    if (c.qkv_bias) {
      lw.bq = L.tensor(p + "attn_q.bias", c.q_dim(), 1);
      lw.bk = L.tensor(p + "attn_k.bias", c.kv_dim(), 1);
      lw.bv = L.tensor(p + "attn_v.bias", c.kv_dim(), 1);
    }
    if (c.qk_norm) {
      lw.q_norm = L.tensor(p + "attn_q_norm.weight", c.head_dim, 1);
      lw.k_norm = L.tensor(p + "attn_k_norm.weight", c.head_dim, 1);
    }
    lw.ffn_norm = L.tensor(p + "ffn_norm.weight", c.n_embd, 1);
    if (phi3) {
      // ffn_up holds gate then up (llama.cpp LLM_FFN_SWIGLU on one tensor: silu(first half) * second half).
      const Weight gate_up = L.tensor(p + "ffn_up.weight", c.n_embd, 2 * int64_t{c.n_ff});
      lw.w_gate = row_view(gate_up, 0, c.n_ff);
      lw.w_up = row_view(gate_up, c.n_ff, c.n_ff);
    } else {
      lw.w_gate = L.tensor(p + "ffn_gate.weight", c.n_embd, c.n_ff);
      lw.w_up = L.tensor(p + "ffn_up.weight", c.n_embd, c.n_ff);
    }
    lw.w_down = L.tensor(p + "ffn_down.weight", c.n_ff, c.n_embd);
    if (c.post_norms) {
      lw.attn_post_norm = L.tensor(p + "post_attention_norm.weight", c.n_embd, 1);
      lw.ffn_post_norm = L.tensor(p + "post_ffw_norm.weight", c.n_embd, 1);
    }
  }
  if (c.arch == "llama") {
    // Llama 3.1+ files carry the "llama3" RoPE scaling as per-frequency divisors (llama.cpp's
    // rope_freqs, applied through ggml_rope_ext's freq_factors on every layer).
    if (const Weight rf = L.tensor("rope_freqs.weight", c.rope_dims / 2, 1, false)) {
      c.rope_freq_factors.assign(rf.f32(), rf.f32() + c.rope_dims / 2);
      for (float v : c.rope_freq_factors)
        if (!(std::isfinite(v) && v > 0)) throw ModelError(path + ": rope_freqs.weight holds a value that is not a positive finite float");
    }
  }
  m->weight_bytes_ = L.bytes;
  m->chat_template_ = f.get_string("tokenizer.chat_template").value_or("");
  m->validate();
  m->pack_weights();
  return m;
}

}  // namespace kvpack
