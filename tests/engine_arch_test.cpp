// The phi3 and gemma3 architectures: gen-model's tiny presets are written, loaded (shapes, hyper-
// parameters) and run through the engine (paged KV, flash attention / the sliding-window path, chunked
// prefill and decode), and the logits are compared with a float64 forward pass written here from
// llama.cpp's graphs (src/models/phi3.cpp, gemma3.cpp). The reference reads the tensors straight from the
// GGUF by name (fused attn_qkv / ffn_up split here, not by the loader's views) and shares no code with
// model/forward.cpp; it takes its architecture rules from the arch name, not from ModelConfig's flags.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "engine_logits.h"
#include "gguf/gguf.h"
#include "gguf/model_writer.h"
#include "kernels/matmul.h"
#include "model/model.h"

using namespace kvpack;

namespace {

using Vec = std::vector<double>;

// A float64 llama.cpp-style forward over dense K/V history, one token at a time.
class ArchRef {
 public:
  explicit ArchRef(const std::string& path) : f_(gguf::File::open(path)) {
    arch_ = f_->get_string("general.architecture").value();
    auto u = [&](const std::string& k, int64_t def) { return f_->get_int(arch_ + "." + k).value_or(def); };
    auto fl = [&](const std::string& k, double def) { return f_->get_float(arch_ + "." + k).value_or(def); };
    E_ = u("embedding_length", 0);
    n_layer_ = u("block_count", 0);
    n_head_ = u("attention.head_count", 0);
    n_kv_ = u("attention.head_count_kv", n_head_);
    HD_ = u("attention.key_length", E_ / n_head_);
    F_ = u("feed_forward_length", 0);
    eps_ = fl("attention.layer_norm_rms_epsilon", 1e-5);
    theta_ = fl("rope.freq_base", 10000.0);
    rot_ = u("rope.dimension_count", HD_);
    gemma_ = arch_ == "gemma3";
    neox_ = arch_ != "llama";
    if (const gguf::TensorInfo* rf = arch_ == "llama" ? f_->tensor("rope_freqs.weight") : nullptr) {
      const auto* d = static_cast<const float*>(rf->data);
      factors_.assign(d, d + rf->shape[0]);
    }
    if (gemma_) {
      window_ = u("attention.sliding_window", 0);  // phi3's is ignored, as llama.cpp does
      theta_swa_ = fl("rope.freq_base_swa", 10000.0);
      softcap_ = fl("final_logit_softcapping", 0.0);
    }
    K_.resize(static_cast<size_t>(n_layer_));
    V_.resize(static_cast<size_t>(n_layer_));
  }

  bool is_swa(int64_t l) const { return gemma_ && window_ > 0 && l % 6 < 5; }  // 5 local : 1 global

  Vec step(int32_t tok) {
    Vec x = row("token_embd.weight", tok);
    if (gemma_)
      for (double& v : x) v *= std::sqrt(static_cast<double>(static_cast<float>(E_)));
    const int64_t QD = n_head_ * HD_, KVD = n_kv_ * HD_;
    for (int64_t l = 0; l < n_layer_; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Vec xb = norm(x, p + "attn_norm.weight");
      Vec q, k, v;
      if (arch_ == "phi3") {
        const Vec qkv = mul(p + "attn_qkv.weight", xb);
        q.assign(qkv.begin(), qkv.begin() + QD);
        k.assign(qkv.begin() + QD, qkv.begin() + QD + KVD);
        v.assign(qkv.begin() + QD + KVD, qkv.end());
      } else {
        q = mul(p + "attn_q.weight", xb);
        k = mul(p + "attn_k.weight", xb);
        v = mul(p + "attn_v.weight", xb);
      }
      const double theta = is_swa(l) ? theta_swa_ : theta_;
      for (int64_t h = 0; h < n_head_; ++h) head(q, h, gemma_ ? p + "attn_q_norm.weight" : "", theta);
      for (int64_t h = 0; h < n_kv_; ++h) head(k, h, gemma_ ? p + "attn_k_norm.weight" : "", theta);
      auto& K = K_[static_cast<size_t>(l)];
      auto& V = V_[static_cast<size_t>(l)];
      K.push_back(k);
      V.push_back(v);
      const size_t first = is_swa(l) && static_cast<int64_t>(K.size()) > window_ ? K.size() - static_cast<size_t>(window_) : 0;
      Vec att(static_cast<size_t>(QD), 0.0);
      for (int64_t h = 0; h < n_head_; ++h) {
        const int64_t kh = h / (n_head_ / n_kv_);
        Vec s(K.size(), -INFINITY);
        double mx = -INFINITY;
        for (size_t j = first; j < K.size(); ++j) {
          double d = 0;
          for (int64_t e = 0; e < HD_; ++e) d += q[static_cast<size_t>(h * HD_ + e)] * K[j][static_cast<size_t>(kh * HD_ + e)];
          s[j] = d / std::sqrt(static_cast<double>(HD_));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (size_t j = first; j < K.size(); ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (size_t j = first; j < K.size(); ++j)
          for (int64_t e = 0; e < HD_; ++e)
            att[static_cast<size_t>(h * HD_ + e)] += s[j] / sum * V[j][static_cast<size_t>(kh * HD_ + e)];
      }
      Vec o = mul(p + "attn_output.weight", att);
      if (gemma_) o = norm(o, p + "post_attention_norm.weight");
      for (int64_t i = 0; i < E_; ++i) x[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
      xb = norm(x, p + "ffn_norm.weight");
      Vec g, up;
      if (arch_ == "phi3") {
        const Vec gu = mul(p + "ffn_up.weight", xb);
        g.assign(gu.begin(), gu.begin() + F_);
        up.assign(gu.begin() + F_, gu.end());
      } else {
        g = mul(p + "ffn_gate.weight", xb);
        up = mul(p + "ffn_up.weight", xb);
      }
      for (size_t i = 0; i < g.size(); ++i) {
        const double a = g[i];
        const double act = gemma_ ? 0.5 * a * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (a + 0.044715 * a * a * a)))
                                  : a / (1.0 + std::exp(-a));
        g[i] = act * up[i];
      }
      Vec d = mul(p + "ffn_down.weight", g);
      if (gemma_) d = norm(d, p + "post_ffw_norm.weight");
      for (int64_t i = 0; i < E_; ++i) x[static_cast<size_t>(i)] += d[static_cast<size_t>(i)];
    }
    ++pos_;
    Vec logits = mul(f_->tensor("output.weight") ? "output.weight" : "token_embd.weight", norm(x, "output_norm.weight"));
    if (softcap_ > 0)
      for (double& z : logits) z = softcap_ * std::tanh(z / softcap_);
    return logits;
  }

 private:
  const gguf::TensorInfo& t(const std::string& name) const {
    const gguf::TensorInfo* ti = f_->tensor(name);
    if (ti == nullptr) throw std::runtime_error("reference: no tensor " + name);
    return *ti;
  }
  Vec row(const std::string& name, int64_t r) const {
    const gguf::TensorInfo& ti = t(name);
    const auto n = static_cast<int64_t>(ti.shape[0]);
    std::vector<float> fr(static_cast<size_t>(n));
    kernels::dequantize_row(static_cast<const uint8_t*>(ti.data) + row_bytes(ti.type, static_cast<uint64_t>(n)) * static_cast<uint64_t>(r),
                            ti.type, n, fr.data());
    return Vec(fr.begin(), fr.end());
  }
  Vec mul(const std::string& name, const Vec& x) const {
    const gguf::TensorInfo& ti = t(name);
    EXPECT_EQ(ti.shape[0], x.size()) << name;
    Vec y(static_cast<size_t>(ti.shape[1]));
    for (size_t o = 0; o < y.size(); ++o) {
      const Vec r = row(name, static_cast<int64_t>(o));
      double s = 0;
      for (size_t i = 0; i < x.size(); ++i) s += r[i] * x[i];
      y[o] = s;
    }
    return y;
  }
  Vec norm(const Vec& x, const std::string& wname) const {
    const auto* w = static_cast<const float*>(t(wname).data);
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps_);
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
    return y;
  }
  // Optional per-head RMSNorm, then RoPE at pos_: NeoX pairs (i, i + rot/2) for phi3 / gemma3 / qwen,
  // adjacent pairs (2i, 2i + 1) for llama; Llama 3's rope_freqs divide the frequencies.
  void head(Vec& x, int64_t h, const std::string& nw, double theta) const {
    double* v = x.data() + h * HD_;
    if (!nw.empty()) {
      const auto* w = static_cast<const float*>(t(nw).data);
      double ss = 0;
      for (int64_t e = 0; e < HD_; ++e) ss += v[e] * v[e];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(HD_) + eps_);
      for (int64_t e = 0; e < HD_; ++e) v[e] = v[e] * inv * w[e];
    }
    const int64_t half = rot_ / 2;
    for (int64_t i = 0; i < half; ++i) {
      double ang = static_cast<double>(pos_) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot_));
      if (!factors_.empty()) ang /= factors_[static_cast<size_t>(i)];
      const int64_t a = neox_ ? i : 2 * i, b = neox_ ? i + half : 2 * i + 1;
      const double c = std::cos(ang), s = std::sin(ang), x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }

  std::unique_ptr<gguf::File> f_;
  std::string arch_;
  int64_t E_ = 0, n_layer_ = 0, n_head_ = 0, n_kv_ = 0, HD_ = 0, F_ = 0, rot_ = 0, window_ = 0;
  double eps_ = 1e-5, theta_ = 10000, theta_swa_ = 10000, softcap_ = 0;
  bool gemma_ = false, neox_ = true;
  std::vector<double> factors_;
  std::vector<std::vector<Vec>> K_, V_;  // [layer][pos][kv_dim]
  int64_t pos_ = 0;
};

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("kvpack_arch_" + std::to_string(getpid()) + "_" + name + ".gguf")).string();
}

// Worst over positions of max_i |a_i - r_i| / max_i |r_i|.
void compare(const Model& m, const std::string& path, int32_t n_tokens, int32_t chunk, double tol, DType kv_type = DType::F32) {
  const int32_t V = m.config().n_vocab;
  std::vector<int32_t> toks = test::padded_tokens(m, test::kStoryText, n_tokens, 37);
  ArchRef ref(path);
  const std::vector<float> got = test::teacher_forced_logits(m, toks, kv_type, chunk);
  double worst = 0;
  for (int32_t t = 0; t < n_tokens; ++t) {
    const Vec want = ref.step(toks[static_cast<size_t>(t)]);
    double num = 0, den = 0;
    for (int32_t i = 0; i < V; ++i) {
      num = std::max(num, std::abs(got[static_cast<size_t>(t) * V + i] - want[static_cast<size_t>(i)]));
      den = std::max(den, std::abs(want[static_cast<size_t>(i)]));
    }
    worst = std::max(worst, num / den);
    ASSERT_LT(num / den, tol) << m.config().arch << " position " << t << " chunk " << chunk;
  }
  std::printf("  %s chunk=%d: worst relative logit error %.3g over %d positions\n", m.config().arch.c_str(), chunk, worst,
              n_tokens);
}

struct TmpModel {
  std::string path;
  explicit TmpModel(const gguf::RandomModelSpec& s, const std::string& name) : path(tmp_path(name)) {
    gguf::write_random_model(s, path);
  }
  ~TmpModel() { std::filesystem::remove(path); }
};

}  // namespace

TEST(ArchPhi3, PresetLoadsWithFusedTensorsSplitInPlace) {
  const gguf::RandomModelSpec s = gguf::RandomModelSpec::preset("tiny-phi3");
  TmpModel file(s, "phi3");
  auto f = gguf::File::open(file.path);
  ASSERT_NE(f->tensor("blk.0.attn_qkv.weight"), nullptr);
  EXPECT_EQ(f->tensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ(f->tensor("blk.0.ffn_gate.weight"), nullptr);
  EXPECT_EQ(f->tensor("blk.0.ffn_up.weight")->shape[1], 2u * s.n_ff);
  EXPECT_EQ(f->get_int("phi3.attention.sliding_window").value_or(0), 2047);

  auto m = Model::load(file.path);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, "phi3");
  EXPECT_EQ(c.n_embd, 256);
  EXPECT_EQ(c.n_layer, 3);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.rope_dims, 32);
  EXPECT_TRUE(c.rope_neox);
  EXPECT_EQ(c.swa_window, 0) << "llama.cpp ignores phi3's sliding window";
  const LayerWeights& L = m->weights().layers[1];
  const auto* qkv = static_cast<const uint8_t*>(f->tensor("blk.1.attn_qkv.weight")->data);
  const size_t rb = row_bytes(L.wq.type, 256);
  EXPECT_EQ(L.wq.n_out, 256);
  EXPECT_EQ(L.wk.n_out, 256);
  EXPECT_EQ(L.wv.n_out, 256);
  EXPECT_EQ(L.wk.n_in, 256);
  // The loader maps the file itself, so compare offsets within each mapping.
  const auto* mq = static_cast<const uint8_t*>(L.wq.data);
  EXPECT_EQ(static_cast<const uint8_t*>(L.wk.data) - mq, static_cast<ptrdiff_t>(256 * rb));
  EXPECT_EQ(static_cast<const uint8_t*>(L.wv.data) - mq, static_cast<ptrdiff_t>(512 * rb));
  EXPECT_EQ(std::memcmp(mq, qkv, rb), 0);
  EXPECT_EQ(L.w_gate.n_out, 512);
  EXPECT_EQ(static_cast<const uint8_t*>(L.w_up.data) - static_cast<const uint8_t*>(L.w_gate.data),
            static_cast<ptrdiff_t>(512 * rb));
}

TEST(ArchPhi3, ForwardMatchesFloat64Reference) {
  TmpModel file(gguf::RandomModelSpec::preset("tiny-phi3"), "phi3_fwd");
  auto m = Model::load(file.path);
  compare(*m, file.path, 24, 1, 1e-4);
  compare(*m, file.path, 24, 7, 1e-4);
}

TEST(ArchPhi3, RefusesLongRopeFactors) {
  // A 128k Phi-3 carries rope_factors_long/short: not implemented, so refused by name.
  gguf::Writer w;
  gguf::build_random_model(gguf::RandomModelSpec::preset("tiny-phi3"), w);
  const std::vector<float> factors(16, 1.0f);
  w.add_tensor("rope_factors_long.weight", {16}, DType::F32, factors.data(), factors.size() * sizeof(float));
  const std::string path = tmp_path("phi3_longrope");
  w.write(path);
  try {
    Model::load(path);
    ADD_FAILURE() << "loaded";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("LongRoPE"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(ArchGemma3, PresetLoadsWithSlidingWindowPattern) {
  TmpModel file(gguf::RandomModelSpec::preset("tiny-gemma3"), "gemma3");
  auto m = Model::load(file.path);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, "gemma3");
  EXPECT_EQ(c.n_layer, 6);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 512);
  EXPECT_TRUE(c.qk_norm && c.post_norms && c.gelu_ffn && c.rope_neox && c.tied_embeddings);
  EXPECT_FLOAT_EQ(c.embd_scale, 16.0f);
  EXPECT_EQ(c.swa_window, 16);
  for (int32_t l = 0; l < 6; ++l) EXPECT_EQ(c.is_swa(l), l != 5) << l;
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c.rope_theta_swa, 10000.0f);
  EXPECT_TRUE(m->weights().layers[0].attn_post_norm && m->weights().layers[0].ffn_post_norm);
}

TEST(ArchGemma3, ForwardMatchesFloat64ReferenceAcrossTheWindow) {
  // 40 tokens: past the 16-token window of the local layers, in decode and in chunked prefill (chunks
  // of 7 and 40: some query blocks straddle the window edge, some lie wholly inside it).
  TmpModel file(gguf::RandomModelSpec::preset("tiny-gemma3"), "gemma3_fwd");
  auto m = Model::load(file.path);
  compare(*m, file.path, 40, 1, 1e-4);
  compare(*m, file.path, 40, 7, 1e-4);
  compare(*m, file.path, 40, 40, 1e-4);
  compare(*m, file.path, 40, 7, 2e-2, DType::F16);
}

TEST(ArchGemma3, AWindowOfSeveralPagesMatchesTheReference) {
  // A 40-slot window over 16-slot pages: the window's whole pages go through the paged kernel and the
  // slots before its first page boundary (0 to 15 of them, as the window slides) through the loop, folded
  // by their log-sum-exps (Forward::window_attention); decode and chunked prefill.
  gguf::RandomModelSpec s = gguf::RandomModelSpec::preset("tiny-gemma3");
  s.sliding_window = 40;
  s.n_ctx = 256;
  TmpModel file(s, "gemma3_win40");
  auto m = Model::load(file.path);
  ASSERT_EQ(m->config().swa_window, 40);
  compare(*m, file.path, 100, 1, 1e-4);
  compare(*m, file.path, 100, 9, 1e-4);
}

TEST(ArchGemma3, SoftcapAndNoWindow) {
  gguf::RandomModelSpec s = gguf::RandomModelSpec::preset("tiny-gemma3");
  s.sliding_window = 0;  // every layer global (llama.cpp: LLAMA_SWA_TYPE_NONE)
  s.final_logit_softcapping = 2.0f;
  TmpModel file(s, "gemma3_cap");
  auto m = Model::load(file.path);
  EXPECT_EQ(m->config().swa_window, 0);
  EXPECT_FLOAT_EQ(m->config().logit_softcap, 2.0f);
  compare(*m, file.path, 24, 5, 1e-4);
}

TEST(ArchGemma3, WindowPathKeyMassIsEachHeadsProbabilityInsideTheWindow) {
  // H2O's per-slot attention mass on the sliding-window path: on a local layer it is zero outside the
  // window and sums to the group size (each query head's probabilities sum to 1); on the global layer
  // every slot gets some.
  TmpModel file(gguf::RandomModelSpec::preset("tiny-gemma3"), "gemma3_mass");
  auto m = Model::load(file.path);
  const ModelConfig& c = m->config();
  EngineOptions eo;
  eo.threads = 2;
  eo.page_size = 16;
  eo.kv_type = DType::F32;
  eo.max_batch_tokens = 64;
  Engine engine(*m, eo);
  auto kv = engine.kv().new_sequence();
  const std::vector<int32_t> toks = test::padded_tokens(*m, test::kStoryText, 41, 37);
  BatchItem prefill;
  prefill.kv = kv.get();
  prefill.tokens = std::span<const int32_t>(toks.data(), 40);
  ASSERT_TRUE(engine.runner().forward().run(std::span<BatchItem>(&prefill, 1)));
  const int32_t slots = 41, streams = c.n_layer * c.n_head_kv;
  std::vector<float> mass(static_cast<size_t>(streams) * slots, 0.0f);
  BatchItem step;
  step.kv = kv.get();
  step.tokens = std::span<const int32_t>(toks.data() + 40, 1);
  step.key_mass = mass.data();
  step.key_mass_stride = slots;
  ASSERT_TRUE(engine.runner().forward().run(std::span<BatchItem>(&step, 1)));
  for (int32_t l = 0; l < c.n_layer; ++l)
    for (int32_t h = 0; h < c.n_head_kv; ++h) {
      const float* row = mass.data() + static_cast<size_t>(kv->stream_index(l, h)) * slots;
      double sum = 0, outside = 0;
      for (int32_t j = 0; j < slots; ++j) {
        sum += row[j];
        if (j <= 40 - c.swa_window) outside += row[j];
      }
      EXPECT_NEAR(sum, c.group(), 1e-4) << "layer " << l;
      if (c.is_swa(l))
        EXPECT_EQ(outside, 0.0) << "layer " << l;
      else
        EXPECT_GT(outside, 0.0) << "layer " << l;
    }
}

TEST(ArchLlama, Llama3RopeFreqsAreReadAndMatchTheFloat64Reference) {
  const gguf::RandomModelSpec s = gguf::RandomModelSpec::preset("tiny-llama3");
  TmpModel file(s, "llama3");
  auto f = gguf::File::open(file.path);
  const gguf::TensorInfo* rf = f->tensor("rope_freqs.weight");
  ASSERT_NE(rf, nullptr);
  ASSERT_EQ(rf->shape[0], 16u);
  auto m = Model::load(file.path);
  const ModelConfig& c = m->config();
  ASSERT_EQ(c.rope_freq_factors.size(), 16u);
  // The llama3 scaling: the highest frequencies untouched, the lowest slowed by the full factor, a smooth
  // band between (theta 5e5, head_dim 32: wavelengths from 6.3 to ~1.4e6 positions).
  EXPECT_FLOAT_EQ(c.rope_freq_factors.front(), 1.0f);
  EXPECT_FLOAT_EQ(c.rope_freq_factors.back(), 8.0f);
  int between = 0;
  for (float v : c.rope_freq_factors) between += v > 1.0f && v < 8.0f;
  EXPECT_GE(between, 1);
  EXPECT_FALSE(c.rope_neox);
  // 200 positions: the stretched frequencies turn by tenths of a radian less than unscaled ones would.
  compare(*m, file.path, 200, 64, 1e-4);
  compare(*m, file.path, 60, 1, 1e-4);
}

TEST(ArchLlama, RopeFreqsMustBePositiveFinite) {
  gguf::RandomModelSpec s = gguf::RandomModelSpec::preset("tiny-llama3");
  gguf::Writer w;
  gguf::build_random_model(s, w);
  const std::string path = tmp_path("llama3_bad");
  w.write(path);
  {  // poison one factor in place
    auto f = gguf::File::open(path);
    const uint64_t off = f->data_offset() + f->tensor("rope_freqs.weight")->offset;
    f.reset();
    std::FILE* fp = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(fp, nullptr);
    const float bad = -1.0f;
    std::fseek(fp, static_cast<long>(off) + 4, SEEK_SET);
    std::fwrite(&bad, sizeof bad, 1, fp);
    std::fclose(fp);
  }
  try {
    Model::load(path);
    ADD_FAILURE() << "a negative rope_freqs factor was accepted";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("rope_freqs"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(ArchLlama, MistralNemoStyleHeadDimApartFromEmbdOverHeads) {
  const gguf::RandomModelSpec s = gguf::RandomModelSpec::preset("tiny-mistral");
  TmpModel file(s, "mistral");
  auto m = Model::load(file.path);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_embd / c.n_head, 32);
  EXPECT_EQ(c.q_dim(), 512);
  EXPECT_EQ(c.group(), 4);
  EXPECT_TRUE(c.rope_freq_factors.empty());
  compare(*m, file.path, 48, 1, 1e-4);
  compare(*m, file.path, 48, 17, 1e-4);
}
