// Random-weight model files: llama.cpp key/tensor conventions, weight encodings, determinism.
#include <stdlib.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/model_writer.h"
#include "util/half.h"

using namespace kvpack;
using namespace kvpack::gguf;

namespace {

struct Built {
  std::vector<uint8_t> bytes;
  std::unique_ptr<File> file;
};

Built build(const RandomModelSpec& s) {
  Writer w;
  build_random_model(s, w);
  Built b;
  b.bytes = w.to_bytes();
  b.file = File::parse(b.bytes.data(), b.bytes.size(), "random.gguf");
  return b;
}

RandomModelSpec with_type(RandomModelSpec s, DType t) {
  s.weight_type = t;
  return s;
}

std::vector<float> f32_data(const TensorInfo& t) {
  std::vector<float> v(t.n_elements);
  std::memcpy(v.data(), t.data, t.n_bytes);
  return v;
}

// Expected tensors {name -> shape} for a spec, written independently of the model writer.
std::map<std::string, std::vector<uint64_t>> expected_tensors(const RandomModelSpec& s) {
  const uint64_t E = s.n_embd, V = s.n_vocab, F = s.n_ff, hd = s.head_dim;
  const uint64_t Q = s.n_head * hd, KV = s.n_head_kv * hd;
  std::map<std::string, std::vector<uint64_t>> m;
  m["token_embd.weight"] = {E, V};
  m["output_norm.weight"] = {E};
  if (!s.tied_embeddings) m["output.weight"] = {E, V};
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    m[p + "attn_norm.weight"] = {E};
    m[p + "attn_q.weight"] = {E, Q};
    m[p + "attn_k.weight"] = {E, KV};
    m[p + "attn_v.weight"] = {E, KV};
    m[p + "attn_output.weight"] = {Q, E};
    m[p + "ffn_norm.weight"] = {E};
    m[p + "ffn_gate.weight"] = {E, F};
    m[p + "ffn_up.weight"] = {E, F};
    m[p + "ffn_down.weight"] = {F, E};
    if (s.arch == "qwen2") {
      m[p + "attn_q.bias"] = {Q};
      m[p + "attn_k.bias"] = {KV};
      m[p + "attn_v.bias"] = {KV};
    }
    if (s.arch == "qwen3") {
      m[p + "attn_q_norm.weight"] = {hd};
      m[p + "attn_k_norm.weight"] = {hd};
    }
  }
  return m;
}

// ggml's reference Q8_0 quantiser, restated independently for comparison.
std::vector<uint8_t> ref_q8_0(const std::vector<float>& x) {
  std::vector<uint8_t> out(x.size() / 32 * 34);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    const uint16_t dh = f32_to_fp16(d);
    std::memcpy(&out[b * 34], &dh, 2);
    for (int j = 0; j < 32; ++j) out[b * 34 + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[b * 32 + j] * id)));
  }
  return out;
}

class ModelWriterPreset : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(ModelWriterPreset, KeysTensorsAndVocab) {
  const RandomModelSpec s = RandomModelSpec::preset(GetParam());
  const Built b = build(s);
  const File& f = *b.file;
  const std::string a = s.arch;
  EXPECT_EQ(f.get_string("general.architecture"), a);
  EXPECT_NE(f.get_string("general.name")->find("random"), std::string::npos);
  EXPECT_EQ(f.get_int(a + ".context_length"), s.n_ctx);
  EXPECT_EQ(f.get_int(a + ".embedding_length"), s.n_embd);
  EXPECT_EQ(f.get_int(a + ".block_count"), s.n_layer);
  EXPECT_EQ(f.get_int(a + ".feed_forward_length"), s.n_ff);
  EXPECT_EQ(f.get_int(a + ".attention.head_count"), s.n_head);
  EXPECT_EQ(f.get_int(a + ".attention.head_count_kv"), s.n_head_kv);
  EXPECT_EQ(f.get_int(a + ".attention.key_length"), s.head_dim);
  EXPECT_EQ(f.get_int(a + ".attention.value_length"), s.head_dim);
  EXPECT_FLOAT_EQ(static_cast<float>(*f.get_float(a + ".attention.layer_norm_rms_epsilon")), s.rms_eps);
  EXPECT_FLOAT_EQ(static_cast<float>(*f.get_float(a + ".rope.freq_base")), s.rope_theta);
  EXPECT_EQ(f.find(a + ".attention.key_length")->type, ValueType::UINT32);
  EXPECT_EQ(f.find(a + ".rope.freq_base")->type, ValueType::FLOAT32);
  EXPECT_EQ(f.get_int("general.file_type"), 0);  // tiny presets are F32

  // Vocabulary: GPT-2 byte symbols first, then merges' results, specials and fillers.
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), a == "llama" ? "llama-bpe" : "qwen2");
  const auto& toks = *f.get_string_array("tokenizer.ggml.tokens");
  const auto& types = *f.get_int_array("tokenizer.ggml.token_type");
  ASSERT_EQ(toks.size(), s.n_vocab);
  ASSERT_EQ(types.size(), s.n_vocab);
  EXPECT_EQ(toks[0], "!");
  EXPECT_EQ(toks[93], "~");
  EXPECT_EQ(toks[94], "\xc2\xa1");   // U+00A1
  EXPECT_EQ(toks[188], "\xc4\x80");  // byte 0 -> U+0100
  EXPECT_EQ(toks[220], "\xc4\xa0");  // space -> U+0120 'Ġ'
  EXPECT_EQ(toks[255], "\xc5\x83");  // byte 0xAD -> U+0143
  std::set<std::string> uniq(toks.begin(), toks.end());
  EXPECT_EQ(uniq.size(), toks.size());
  const auto& merges = *f.get_string_array("tokenizer.ggml.merges");
  ASSERT_FALSE(merges.empty());
  for (const auto& m : merges) {  // every merge's parts and result are tokens
    const auto sp = m.find(' ');
    ASSERT_NE(sp, std::string::npos);
    EXPECT_TRUE(uniq.count(m.substr(0, sp)) && uniq.count(m.substr(sp + 1)) &&
                uniq.count(m.substr(0, sp) + m.substr(sp + 1)))
        << m;
  }
  const int64_t bos = *f.get_int("tokenizer.ggml.bos_token_id"), eos = *f.get_int("tokenizer.ggml.eos_token_id");
  ASSERT_LT(bos, s.n_vocab);
  ASSERT_LT(eos, s.n_vocab);
  EXPECT_EQ(types[bos], 3);
  EXPECT_EQ(types[eos], 3);
  EXPECT_EQ(toks[eos], a == "llama" ? "<|end_of_text|>" : "<|endoftext|>");

  // Tensors: exactly the llama.cpp set, with ggml-order shapes; 2-D weights in weight_type, rest F32.
  const auto want = expected_tensors(s);
  ASSERT_EQ(f.tensors().size(), want.size());
  for (const auto& [name, shape] : want) {
    const TensorInfo* t = f.tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, shape) << name;
    EXPECT_EQ(t->type, DType::F32) << name;
  }
  EXPECT_EQ(f.tensor("output.weight") == nullptr, s.tied_embeddings);

  // Values: norms are exactly 1; weights are centred with std ~ 1/sqrt(fan_in).
  for (const auto& v : f32_data(*f.tensor("blk.1.ffn_norm.weight"))) ASSERT_EQ(v, 1.0f);
  if (a == "qwen3") {
    for (const auto& v : f32_data(*f.tensor("blk.0.attn_k_norm.weight"))) ASSERT_EQ(v, 1.0f);
  }
  for (const char* name : {"token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight"}) {
    const TensorInfo& t = *f.tensor(name);
    const auto x = f32_data(t);
    double sum = 0, sq = 0;
    for (float v : x) {
      sum += v;
      sq += double(v) * v;
    }
    const double mean = sum / x.size(), sd = std::sqrt(sq / x.size() - mean * mean);
    const double want_sd = 1.0 / std::sqrt(double(t.shape[0]));
    EXPECT_NEAR(sd, want_sd, 0.05 * want_sd) << name;
    EXPECT_NEAR(mean, 0.0, 5 * want_sd / std::sqrt(double(x.size()))) << name;
  }
  if (a == "qwen2") {
    const auto bq = f32_data(*f.tensor("blk.0.attn_q.bias"));
    float amax = 0;
    for (float v : bq) amax = std::max(amax, std::fabs(v));
    EXPECT_GT(amax, 0.0f);
    EXPECT_LE(amax, 0.02f);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, ModelWriterPreset, ::testing::Values("tiny-llama", "tiny-qwen2", "tiny-qwen3"));

TEST(ModelWriter, WeightTypesEncodeTheSameValues) {
  // The underlying floats depend only on (seed, tensor, row), so each type must be exactly the
  // F32 model's values converted (F16/BF16 round-to-nearest-even, Q8_0 as ggml quantises).
  for (const char* preset : {"tiny-llama", "tiny-qwen2", "tiny-qwen3"}) {
    const RandomModelSpec base = RandomModelSpec::preset(preset);
    const Built f32 = build(base);
    for (DType t : {DType::F16, DType::BF16, DType::Q8_0}) {
      const Built q = build(with_type(base, t));
      ASSERT_EQ(q.file->tensors().size(), f32.file->tensors().size());
      const uint32_t want_ftype = t == DType::F16 ? 1 : t == DType::BF16 ? 32 : 7;
      EXPECT_EQ(q.file->get_int("general.file_type"), want_ftype);
      EXPECT_EQ(q.file->get_int("general.quantization_version").has_value(), t == DType::Q8_0);
      for (const TensorInfo& ti : q.file->tensors()) {
        const TensorInfo& ref = *f32.file->tensor(ti.name);
        const auto x = f32_data(ref);
        EXPECT_EQ(ti.shape, ref.shape);
        if (ti.shape.size() == 1) {  // norms and biases stay F32
          EXPECT_EQ(ti.type, DType::F32) << ti.name;
          EXPECT_EQ(std::memcmp(ti.data, ref.data, ref.n_bytes), 0) << ti.name;
          continue;
        }
        ASSERT_EQ(ti.type, t) << ti.name;
        std::vector<uint8_t> want;
        if (t == DType::Q8_0) {
          want = ref_q8_0(x);
        } else {
          want.resize(x.size() * 2);
          for (size_t i = 0; i < x.size(); ++i) {
            const uint16_t h = t == DType::F16 ? f32_to_fp16(x[i]) : f32_to_bf16(x[i]);
            std::memcpy(&want[2 * i], &h, 2);
          }
        }
        ASSERT_EQ(ti.n_bytes, want.size()) << ti.name;
        EXPECT_EQ(std::memcmp(ti.data, want.data(), want.size()), 0) << preset << " " << ti.name;
      }
    }
  }
}

TEST(ModelWriter, DeterministicPerSeed) {
  RandomModelSpec s = RandomModelSpec::preset("tiny-qwen3");
  s.weight_type = DType::Q8_0;
  s.seed = 42;
  const Built a = build(s), b = build(s);
  EXPECT_EQ(a.bytes, b.bytes);
  s.seed = 43;
  const Built c = build(s);
  ASSERT_EQ(c.bytes.size(), a.bytes.size());
  for (const char* name : {"token_embd.weight", "blk.1.attn_v.weight"}) {
    const TensorInfo& ta = *a.file->tensor(name);
    const TensorInfo& tc = *c.file->tensor(name);
    EXPECT_NE(std::memcmp(ta.data, tc.data, ta.n_bytes), 0) << name;
  }
  // Tensors of the same shape within a model differ from each other too.
  EXPECT_NE(std::memcmp(a.file->tensor("blk.0.ffn_gate.weight")->data, a.file->tensor("blk.0.ffn_up.weight")->data,
                        a.file->tensor("blk.0.ffn_up.weight")->n_bytes),
            0);
  // Pinned values: the generator must not change silently (files are compared across builds and
  // against llama.cpp runs). Update deliberately if the generator is changed on purpose.
  const Built f = build(RandomModelSpec::preset("tiny-llama"));
  const TensorInfo& emb = *f.file->tensor("token_embd.weight");
  uint32_t first_bits;
  std::memcpy(&first_bits, emb.data, 4);
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t i = 0; i < emb.n_bytes; ++i) h = (h ^ static_cast<const uint8_t*>(emb.data)[i]) * 0x100000001b3ull;
  EXPECT_EQ(first_bits, 0xbe362117u);  // -0.1779...
  EXPECT_EQ(h, 0x8150e90d8a4a7d88ull);
}

TEST(ModelWriter, WritesFile) {
  std::string dir_t = ::testing::TempDir() + "gguf_model_XXXXXX";
  const std::string dir = ::mkdtemp(dir_t.data());
  const std::string path = dir + "/tiny.gguf";
  RandomModelSpec s = RandomModelSpec::preset("tiny-qwen2");
  s.weight_type = DType::BF16;
  write_random_model(s, path);
  auto f = File::open(path);
  Writer w;
  build_random_model(s, w);
  const auto bytes = w.to_bytes();
  ASSERT_EQ(f->file_size(), bytes.size());
  EXPECT_EQ(std::memcmp(f->tensor("output_norm.weight")->data,
                        bytes.data() + f->data_offset() + f->tensor("output_norm.weight")->offset, 4 * s.n_embd),
            0);
  EXPECT_EQ(f->get_string("general.architecture"), "qwen2");
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}

TEST(ModelWriter, Qwen3_0_6bPreset) {
  const RandomModelSpec s = RandomModelSpec::preset("qwen3-0.6b");
  EXPECT_EQ(s.arch, "qwen3");
  EXPECT_EQ(s.n_vocab, 151936u);
  EXPECT_EQ(s.n_embd, 1024u);
  EXPECT_EQ(s.n_layer, 28u);
  EXPECT_EQ(s.n_head, 16u);
  EXPECT_EQ(s.n_head_kv, 8u);
  EXPECT_EQ(s.head_dim, 128u);
  EXPECT_EQ(s.n_ff, 3072u);
  EXPECT_EQ(s.n_ctx, 40960u);
  EXPECT_EQ(s.rope_theta, 1e6f);
  EXPECT_EQ(s.rms_eps, 1e-6f);
  EXPECT_TRUE(s.tied_embeddings);
  // Building the writer is cheap (tensors are only generated when serialised).
  Writer w;
  build_random_model(s, w);
  EXPECT_EQ(w.n_tensors(), 2u + 28u * 11u);
}

TEST(ModelWriter, Llama32_1bAndGemma3_1bPresets) {
  const RandomModelSpec l = RandomModelSpec::preset("llama-3.2-1b");
  EXPECT_EQ(l.arch, "llama");
  EXPECT_EQ(l.n_vocab, 128256u);
  EXPECT_EQ(l.n_embd, 2048u);
  EXPECT_EQ(l.n_layer, 16u);
  EXPECT_EQ(l.n_head, 32u);
  EXPECT_EQ(l.n_head_kv, 8u);
  EXPECT_EQ(l.head_dim, 64u);
  EXPECT_EQ(l.n_ff, 8192u);
  EXPECT_EQ(l.rope_theta, 500000.0f);
  EXPECT_EQ(l.llama3_rope_factor, 32.0f);
  EXPECT_TRUE(l.tied_embeddings);
  Writer wl;
  build_random_model(l, wl);
  EXPECT_EQ(wl.n_tensors(), 3u + 16u * 9u);  // token_embd, output_norm, rope_freqs + 9 per layer
  // theta 5e5, head_dim 64, factor 32: wavelengths 2 pi 5e5^(i/32) below 8192/4 (i <= 14) are kept, above
  // 8192 (i >= 18) slowed 32x, the three between interpolated: i = 16, wavelength 4442.9, smooth
  // (8192/4442.9 - 1)/3 = 0.28127, divisor 1/((1 - 0.28127)/32 + 0.28127) = 3.2923.
  const std::vector<float> f = llama3_rope_factors(500000.0f, 64, 32.0f);
  ASSERT_EQ(f.size(), 32u);
  int kept = 0, full = 0;
  for (float v : f) {
    kept += v == 1.0f;
    full += v == 32.0f;
  }
  EXPECT_EQ(kept, 15);
  EXPECT_EQ(full, 14);
  EXPECT_NEAR(f[16], 3.2923, 1e-3);
  for (size_t i = 1; i < f.size(); ++i) EXPECT_GE(f[i], f[i - 1]) << i;

  const RandomModelSpec g = RandomModelSpec::preset("gemma3-1b");
  EXPECT_EQ(g.arch, "gemma3");
  EXPECT_EQ(g.n_layer, 26u);
  EXPECT_EQ(g.n_head_kv, 1u);
  EXPECT_EQ(g.head_dim, 256u);
  EXPECT_EQ(g.sliding_window, 512u);
  Writer wg;
  build_random_model(g, wg);
  EXPECT_EQ(wg.n_tensors(), 2u + 26u * 13u);
}

TEST(ModelWriter, RejectsBadSpecs) {
  EXPECT_THROW(RandomModelSpec::preset("gpt-5"), Error);
  auto s = RandomModelSpec::preset("tiny-llama");
  Writer w;
  auto bad = [&](auto mutate) {
    RandomModelSpec x = RandomModelSpec::preset("tiny-llama");
    mutate(x);
    EXPECT_THROW(x.validate(), Error);
  };
  bad([](RandomModelSpec& x) { x.arch = "gpt2"; });
  bad([](RandomModelSpec& x) {  // qwen2 / phi3: must be n_embd / n_head (llama may differ: Mistral Nemo)
    x.arch = "qwen2";
    x.head_dim = 32;
  });
  bad([](RandomModelSpec& x) { x.head_dim = 15; });  // odd: RoPE rotates pairs
  bad([](RandomModelSpec& x) {  // llama3 RoPE factors are a llama feature
    x.arch = "qwen3";
    x.llama3_rope_factor = 8;
  });
  bad([](RandomModelSpec& x) { x.llama3_rope_factor = 0.5f; });
  bad([](RandomModelSpec& x) { x.n_head_kv = 3; });
  bad([](RandomModelSpec& x) { x.n_vocab = 260; });
  bad([](RandomModelSpec& x) { x.n_layer = 0; });
  bad([](RandomModelSpec& x) { x.weight_type = DType::Q4_0; });
  bad([](RandomModelSpec& x) {
    x.weight_type = DType::Q8_0;
    x.n_ff = 100;
  });
  EXPECT_NO_THROW(s.validate());
  s.arch = "nope";
  EXPECT_THROW(build_random_model(s, w), Error);
}
