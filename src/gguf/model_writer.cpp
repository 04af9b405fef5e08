// Random-weight llama/qwen2/qwen3/phi3/gemma3 GGUFs (see model_writer.h). Key names, tensor names, shapes and
// per-tensor types follow llama.cpp's converter output, so the files load in llama.cpp unchanged.
#include "gguf/model_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "util/half.h"
#include "util/quant_codecs.h"

namespace kvpack::gguf {

namespace {

[[noreturn]] void bad_spec(const std::string& msg) { throw Error("random model spec: " + msg); }

// ---- deterministic randomness ------------------------------------------------------------------

uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct SplitMix64 {
  uint64_t s;
  uint64_t next() { return mix64(s += 0x9e3779b97f4a7c15ull); }
  // Uniform in [-1, 1): 24 random bits, exactly representable in float.
  float uniform_pm1() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }
};

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// ---- row encoders --------------------------------------------------------------------------------

// Q8_0 as ggml's reference quantiser does it: d = amax / 127 stored as f16, q = roundf(x / d)
// computed with the f32 d (round half away from zero).
void quantize_q8_0(const float* x, uint64_t n, uint8_t* out) {
  for (uint64_t b = 0; b < n / 32; ++b, x += 32, out += 34) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = f32_to_fp16(d);
    std::memcpy(out, &dh, 2);
    for (int j = 0; j < 32; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
  }
}

void encode_row(const float* x, uint64_t n, DType type, uint8_t* out) {
  switch (type) {
    case DType::F32: std::memcpy(out, x, n * 4); break;
    case DType::F16:
      for (uint64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_fp16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      break;
    case DType::BF16:
      for (uint64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      break;
    case DType::Q8_0: quantize_q8_0(x, n, out); break;
    default:  // Q4_K and the other codecs of util/quant_codecs.h
      if (!quantize_codec(type, x, static_cast<int64_t>(n), out))
        bad_spec("unsupported weight type " + std::string(dtype_name(type)));
  }
}

// How a tensor's values are made: uniform random with a given scale, or all ones (norm weights).
struct Init {
  bool ones = false;
  float scale = 0;
};

Writer::RowSource make_source(uint64_t seed, const std::string& name, uint64_t cols, DType type, Init init) {
  const uint64_t key = mix64(seed ^ mix64(fnv1a(name)));
  return [=](uint64_t r0, uint64_t n, uint8_t* out) {
    std::vector<float> row(cols, 1.0f);
    const uint64_t rb = row_bytes(type, cols);
    for (uint64_t r = 0; r < n; ++r) {
      if (!init.ones) {
        SplitMix64 rng{mix64(key + (r0 + r) * 0xd1b54a32d192ed03ull)};  // own stream per row
        for (auto& v : row) v = rng.uniform_pm1() * init.scale;
      }
      encode_row(row.data(), cols, type, out + r * rb);
    }
  };
}

// ---- vocabulary ----------------------------------------------------------------------------------

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

// GPT-2's byte-to-unicode table in its vocabulary order: printable bytes map to themselves
// ('!'..'~', '¡'..'¬', '®'..'ÿ'), the other 68 bytes to U+0100.. in byte order. GPT-2 style BPE
// vocabularies (gpt2, llama-bpe, qwen2) start with exactly these 256 tokens.
std::vector<std::string> byte_tokens() {
  std::vector<std::string> out;
  std::vector<bool> printable(256, false);
  for (uint32_t b = 0; b < 256; ++b)
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
      printable[b] = true;
      out.push_back(utf8(b));
    }
  uint32_t n = 0;
  for (uint32_t b = 0; b < 256; ++b)
    if (!printable[b]) out.push_back(utf8(256 + n++));
  return out;
}

// A handful of real GPT-2 merges ("Ġ" is the space byte), so BPE merging is exercised.
constexpr const char* kMerges[][2] = {
    {"\xc4\xa0", "t"}, {"\xc4\xa0", "a"}, {"h", "e"}, {"i", "n"},
    {"r", "e"},        {"o", "n"},        {"\xc4\xa0t", "he"}, {"e", "r"},
};
constexpr size_t kNumMerges = sizeof(kMerges) / sizeof(kMerges[0]);

enum TokenType : int32_t { kNormal = 1, kControl = 3 };

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  uint32_t bos = 0, eos = 0;
};

std::vector<std::string> special_tokens(const std::string& arch) {
  if (arch == "llama") return {"<|begin_of_text|>", "<|end_of_text|>"};
  // llama.cpp's vocab loader sets attributes on these by name when general.name says phi3 (it fails
  // without them); Phi-3's own specials: BOS <s>, EOS <|endoftext|>, end of turn <|end|>.
  if (arch == "phi3") return {"<s>", "</s>", "<unk>", "<|endoftext|>", "<|end|>"};
  return {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
}

Vocab make_vocab(const RandomModelSpec& s) {
  Vocab v;
  v.tokens = byte_tokens();
  v.types.assign(v.tokens.size(), kNormal);
  for (const auto& m : kMerges) {
    v.merges.push_back(std::string(m[0]) + " " + m[1]);
    v.tokens.push_back(std::string(m[0]) + m[1]);
    v.types.push_back(kNormal);
  }
  const auto specials = special_tokens(s.arch);
  const uint32_t first_special = static_cast<uint32_t>(v.tokens.size());
  for (const auto& t : specials) {
    v.tokens.push_back(t);
    v.types.push_back(kControl);
  }
  v.bos = first_special;
  v.eos = s.arch == "llama" ? first_special + 1 : s.arch == "phi3" ? first_special + 3 : first_special;  // qwen: <|endoftext|> for both
  // Filler tokens: unique, made only of printable ASCII so any GPT-2 byte decoder can render them.
  for (uint32_t i = static_cast<uint32_t>(v.tokens.size()); i < s.n_vocab; ++i) {
    v.tokens.push_back("<filler_" + std::to_string(i) + ">");
    v.types.push_back(kNormal);
  }
  return v;
}

size_t min_vocab(const std::string& arch) { return 256 + kNumMerges + special_tokens(arch).size(); }

uint32_t llama_file_type(DType t, const std::string& mix) {  // LLAMA_FTYPE_*
  if (mix == "q4_k_m") return 15;  // MOSTLY_Q4_K_M
  if (mix == "q5_k_m") return 17;  // MOSTLY_Q5_K_M
  switch (t) {
    case DType::F32: return 0;     // ALL_F32
    case DType::F16: return 1;     // MOSTLY_F16
    case DType::Q8_0: return 7;    // MOSTLY_Q8_0
    case DType::Q5_0: return 8;    // MOSTLY_Q5_0
    case DType::Q5_1: return 9;    // MOSTLY_Q5_1
    case DType::Q2_K: return 10;   // MOSTLY_Q2_K
    case DType::Q3_K: return 11;   // MOSTLY_Q3_K_S (every layer Q3_K)
    case DType::Q4_K: return 14;   // MOSTLY_Q4_K_S
    case DType::Q5_K: return 16;   // MOSTLY_Q5_K_S
    case DType::Q6_K: return 18;   // MOSTLY_Q6_K
    case DType::IQ4_NL: return 25; // MOSTLY_IQ4_NL
    case DType::IQ4_XS: return 30; // MOSTLY_IQ4_XS
    case DType::BF16: return 32;   // MOSTLY_BF16
    default: return 0;
  }
}

bool is_block_quant(DType t) {
  return t != DType::F32 && t != DType::F16 && t != DType::BF16 && traits(t).block_elems > 1;
}

// Type of token_embd.weight / output.weight without a mix: Q8_0 for the block-quantised types (their
// files exercise the type's kernels on the layers), else the weight type.
DType embd_type(DType weight_type) { return is_block_quant(weight_type) ? DType::Q8_0 : weight_type; }

// llama.cpp's use_more_bits(i_layer, n_layers): the layers its _M mixes give more bits.
bool more_bits_layer(uint32_t i, uint32_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

}  // namespace

RandomModelSpec RandomModelSpec::preset(std::string_view name) {
  RandomModelSpec s;
  if (name == "qwen3-0.6b") {
    s.arch = "qwen3";
    s.n_vocab = 151936;
    s.n_embd = 1024;
    s.n_layer = 28;
    s.n_head = 16;
    s.n_head_kv = 8;
    s.head_dim = 128;
    s.n_ff = 3072;
    s.n_ctx = 40960;
    s.rope_theta = 1e6f;
    s.rms_eps = 1e-6f;
    s.tied_embeddings = true;
    s.weight_type = DType::F16;
  } else if (name == "tiny-qwen3") {
    s.arch = "qwen3";
    s.head_dim = 32;  // n_head * head_dim = 128 != n_embd, as in real Qwen3 models
    s.rope_theta = 1e6f;
    s.rms_eps = 1e-6f;
    s.tied_embeddings = true;
  } else if (name == "tiny-qwen2") {
    s.arch = "qwen2";
    s.rope_theta = 1e6f;
    s.rms_eps = 1e-6f;
    s.tied_embeddings = true;
  } else if (name == "tiny-phi3") {
    // Phi-3-mini's layout at a small size: fused attn_qkv and gate+up, head_dim = n_embd / n_head, and a
    // sliding_window key as in the Phi-3-mini-4k GGUFs (llama.cpp ignores it; so does kvpack).
    s.arch = "phi3";
    s.n_embd = 256;
    s.n_layer = 3;
    s.n_head = 8;
    s.n_head_kv = 8;
    s.head_dim = 32;
    s.n_ff = 512;
    s.n_ctx = 4096;
    s.sliding_window = 2047;
  } else if (name == "tiny-gemma3") {
    // Gemma 3's layout at a small size: 6 layers so the default 5 local : 1 global pattern has one global
    // layer (layer 5); head_dim != n_embd / n_head as in the real models; a short window (16) so a few
    // hundred tokens exercise the sliding-window mask; local RoPE base 10000, global 1e6; tied embeddings.
    s.arch = "gemma3";
    s.n_embd = 256;
    s.n_layer = 6;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.head_dim = 128;
    s.n_ff = 512;
    s.n_ctx = 4096;
    s.rope_theta = 1e6f;
    s.rope_theta_swa = 10000.0f;
    s.rms_eps = 1e-6f;
    s.sliding_window = 16;
    s.tied_embeddings = true;
  } else if (name == "llama-3.2-1b") {
    s.arch = "llama";
    s.n_vocab = 128256;
    s.n_embd = 2048;
    s.n_layer = 16;
    s.n_head = 32;
    s.n_head_kv = 8;
    s.head_dim = 64;
    s.n_ff = 8192;
    s.n_ctx = 131072;
    s.rope_theta = 500000.0f;
    s.rms_eps = 1e-5f;
    s.llama3_rope_factor = 32.0f;
    s.tied_embeddings = true;
    s.weight_type = DType::F16;
  } else if (name == "gemma3-1b") {
    // Gemma 3 1B's shape: 26 layers (22 local with a 512-token window, 4 global), 4 query heads on one KV
    // head of 256 dims.
    s.arch = "gemma3";
    s.n_vocab = 262144;
    s.n_embd = 1152;
    s.n_layer = 26;
    s.n_head = 4;
    s.n_head_kv = 1;
    s.head_dim = 256;
    s.n_ff = 6912;
    s.n_ctx = 32768;
    s.rope_theta = 1e6f;
    s.rope_theta_swa = 10000.0f;
    s.rms_eps = 1e-6f;
    s.sliding_window = 512;
    s.tied_embeddings = true;
    s.weight_type = DType::F16;
  } else if (name == "tiny-llama") {
    s.arch = "llama";  // defaults: vocab 512, embd 64, 2 layers, 4/2 heads, head_dim 16, ffn 128
  } else if (name == "tiny-llama3") {
    // Llama 3.1+ at a small size: rope_freqs.weight (llama3 scaling, factor 8) on a large RoPE base, so the
    // low frequencies that the factors stretch are the ones a few thousand positions exercise.
    s.arch = "llama";
    s.n_embd = 256;
    s.n_layer = 3;
    s.n_head = 8;
    s.n_head_kv = 2;
    s.head_dim = 32;
    s.n_ff = 512;
    s.n_ctx = 16384;
    s.rope_theta = 500000.0f;
    s.llama3_rope_factor = 8.0f;
    s.tied_embeddings = true;
  } else if (name == "tiny-mistral") {
    // Mistral-Nemo's layout at a small size: llama architecture, head_dim (key_length) 64 while
    // n_embd / n_head = 32, 8 query heads on 2 KV heads, RoPE base 1e6.
    s.arch = "llama";
    s.n_embd = 256;
    s.n_layer = 3;
    s.n_head = 8;
    s.n_head_kv = 2;
    s.head_dim = 64;
    s.n_ff = 512;
    s.n_ctx = 8192;
    s.rope_theta = 1e6f;
  } else {
    bad_spec("unknown preset '" + std::string(name) + "' (known: qwen3-0.6b, llama-3.2-1b, gemma3-1b, tiny-llama, tiny-llama3, tiny-mistral, "
             "tiny-qwen2, tiny-qwen3, tiny-phi3, tiny-gemma3)");
  }
  return s;
}

void RandomModelSpec::validate() const {
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "phi3" && arch != "gemma3")
    bad_spec("unknown arch '" + arch + "' (llama, qwen2, qwen3, phi3, gemma3)");
  if (arch == "phi3" && n_head_kv != n_head) bad_spec("phi3 needs n_head_kv == n_head (attn_output is n_embd x n_embd)");
  if (!n_vocab || !n_embd || !n_layer || !n_head || !n_head_kv || !head_dim || !n_ff || !n_ctx)
    bad_spec("all sizes must be positive");
  if (n_head % n_head_kv != 0) bad_spec("n_head must be a multiple of n_head_kv");
  // llama files may set key_length apart from n_embd / n_head (Mistral Nemo: 128 vs 160); qwen2 / phi3 may not.
  if (arch != "qwen3" && arch != "gemma3" && arch != "llama" && (n_embd % n_head != 0 || head_dim != n_embd / n_head))
    bad_spec(arch + " needs head_dim == n_embd / n_head");
  if (llama3_rope_factor != 0 && (arch != "llama" || !(llama3_rope_factor >= 1)))
    bad_spec("llama3_rope_factor needs the llama architecture and a factor >= 1");
  if (head_dim % 2 != 0) bad_spec("head_dim must be even (RoPE rotates pairs)");
  if (n_vocab < min_vocab(arch)) bad_spec("n_vocab must be at least " + std::to_string(min_vocab(arch)));
  if (!(rope_theta > 0) || !(rms_eps > 0)) bad_spec("rope_theta and rms_eps must be positive");
  const DType t = weight_type;
  if (t != DType::F32 && t != DType::F16 && t != DType::BF16 && t != DType::Q8_0 && !is_superblock_codec(t) &&
      !is_block32_codec(t))
    bad_spec("weight type must be F32, F16, BF16, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, IQ4_NL or IQ4_XS");
  if (!mix.empty() && !((mix == "q4_k_m" && t == DType::Q4_K) || (mix == "q5_k_m" && t == DType::Q5_K)))
    bad_spec("mix '" + mix + "' needs its base type (q4_k_m: Q4_K, q5_k_m: Q5_K)");
  // Every 2-D weight's row (input) length must be a whole number of blocks.
  const uint32_t blk = traits(weight_type).block_elems;
  if (n_embd % blk || (n_head * head_dim) % blk || n_ff % blk)
    bad_spec("n_embd, n_head * head_dim and n_ff must be multiples of " + std::to_string(blk) + " for " +
             std::string(dtype_name(weight_type)));
}

void build_random_model(const RandomModelSpec& s, Writer& w) {
  s.validate();
  const std::string& a = s.arch;
  w.set_string("general.architecture", a);
  w.set_string("general.name", "kvpack random weights (" + a + ", seed " + std::to_string(s.seed) +
                                   ") - not a trained model");
  w.set_u32("general.file_type", llama_file_type(s.weight_type, s.mix));
  if (is_block_quant(s.weight_type))
    w.set_u32("general.quantization_version", 2);  // GGML_QNT_VERSION
  w.set_u32(a + ".context_length", s.n_ctx);
  w.set_u32(a + ".embedding_length", s.n_embd);
  w.set_u32(a + ".block_count", s.n_layer);
  w.set_u32(a + ".feed_forward_length", s.n_ff);
  w.set_u32(a + ".attention.head_count", s.n_head);
  w.set_u32(a + ".attention.head_count_kv", s.n_head_kv);
  w.set_u32(a + ".attention.key_length", s.head_dim);
  w.set_u32(a + ".attention.value_length", s.head_dim);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", s.rms_eps);
  w.set_f32(a + ".rope.freq_base", s.rope_theta);
  if (a == "llama") {
    w.set_u32(a + ".rope.dimension_count", s.head_dim);
    w.set_u32(a + ".vocab_size", s.n_vocab);
  }
  if (a == "phi3") {  // as convert_hf_to_gguf's Phi3MiniModel
    w.set_u32(a + ".rope.dimension_count", s.head_dim);
    w.set_u32(a + ".rope.scaling.original_context_length", s.n_ctx);
  }
  if ((a == "phi3" || a == "gemma3") && s.sliding_window > 0) w.set_u32(a + ".attention.sliding_window", s.sliding_window);
  if (a == "gemma3" && s.sliding_window > 0) w.set_f32(a + ".rope.freq_base_swa", s.rope_theta_swa);
  if (a == "gemma3" && s.final_logit_softcapping > 0) w.set_f32(a + ".final_logit_softcapping", s.final_logit_softcapping);

  Vocab v = make_vocab(s);
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", a == "llama" ? "llama-bpe" : "qwen2");
  w.set_string_array("tokenizer.ggml.tokens", std::move(v.tokens));
  w.set_i32_array("tokenizer.ggml.token_type", std::move(v.types));
  w.set_string_array("tokenizer.ggml.merges", std::move(v.merges));
  w.set_u32("tokenizer.ggml.bos_token_id", v.bos);
  w.set_u32("tokenizer.ggml.eos_token_id", v.eos);
  if (a != "llama") w.set_u32("tokenizer.ggml.padding_token_id", v.eos);
  w.set_bool("tokenizer.ggml.add_bos_token", a == "llama");

  const uint64_t E = s.n_embd, V = s.n_vocab, F = s.n_ff, hd = s.head_dim;
  const uint64_t q_dim = uint64_t{s.n_head} * hd, kv_dim = uint64_t{s.n_head_kv} * hd;
  // 2-D weight [in, out]: uniform with std 1/sqrt(in) keeps activations O(1) through each layer.
  auto weight = [&](const std::string& name, uint64_t in, uint64_t out, DType type) {
    const float scale = std::sqrt(3.0f / static_cast<float>(in));
    w.add_tensor_stream(name, {in, out}, type, make_source(s.seed, name, in, type, {false, scale}));
  };
  const DType wt = s.weight_type;
  const bool mixed = !s.mix.empty();
  const DType et = mixed ? wt : embd_type(wt), ot = mixed ? DType::Q6_K : et;
  auto norm = [&](const std::string& name, uint64_t n) {
    w.add_tensor_stream(name, {n}, DType::F32, make_source(s.seed, name, n, DType::F32, {true, 0}));
  };
  auto bias = [&](const std::string& name, uint64_t n) {
    w.add_tensor_stream(name, {n}, DType::F32, make_source(s.seed, name, n, DType::F32, {false, 0.02f}));
  };

  weight("token_embd.weight", E, V, et);
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const DType more = mixed && more_bits_layer(l, s.n_layer) ? DType::Q6_K : wt;  // attn_v, ffn_down
    norm(p + "attn_norm.weight", E);
    if (a == "phi3") {  // fused tensors: attn_qkv = Q|K|V rows, ffn_up = gate|up rows
      weight(p + "attn_qkv.weight", E, q_dim + 2 * kv_dim, wt);
      weight(p + "attn_output.weight", q_dim, E, wt);
      norm(p + "ffn_norm.weight", E);
      weight(p + "ffn_up.weight", E, 2 * F, wt);
      weight(p + "ffn_down.weight", F, E, more);
      continue;
    }
    weight(p + "attn_q.weight", E, q_dim, wt);
    if (a == "qwen2") bias(p + "attn_q.bias", q_dim);
    weight(p + "attn_k.weight", E, kv_dim, wt);
    if (a == "qwen2") bias(p + "attn_k.bias", kv_dim);
    weight(p + "attn_v.weight", E, kv_dim, more);
    if (a == "qwen2") bias(p + "attn_v.bias", kv_dim);
    weight(p + "attn_output.weight", q_dim, E, wt);
    if (a == "qwen3" || a == "gemma3") {
      norm(p + "attn_q_norm.weight", hd);
      norm(p + "attn_k_norm.weight", hd);
    }
    if (a == "gemma3") norm(p + "post_attention_norm.weight", E);
    norm(p + "ffn_norm.weight", E);
    weight(p + "ffn_gate.weight", E, F, wt);
    weight(p + "ffn_up.weight", E, F, wt);
    weight(p + "ffn_down.weight", F, E, more);
    if (a == "gemma3") norm(p + "post_ffw_norm.weight", E);
  }
  norm("output_norm.weight", E);
  if (!s.tied_embeddings) weight("output.weight", E, V, ot);
  if (s.llama3_rope_factor > 0) {
    const std::vector<float> f = llama3_rope_factors(s.rope_theta, s.head_dim, s.llama3_rope_factor);
    w.add_tensor("rope_freqs.weight", {f.size()}, DType::F32, f.data(), f.size() * sizeof(float));
  }
}

std::vector<float> llama3_rope_factors(float theta, uint32_t rot_dims, float factor) {
  // Meta's llama3 scaling: wavelengths shorter than original_context / high_freq_factor keep their
  // frequency, longer than original_context / low_freq_factor are slowed by `factor`, and the band
  // between is interpolated smoothly in 1 / frequency.
  constexpr double kOriginalContext = 8192, kLowFreqFactor = 1, kHighFreqFactor = 4;
  const double low_wavelen = kOriginalContext / kLowFreqFactor, high_wavelen = kOriginalContext / kHighFreqFactor;
  std::vector<float> out;
  for (uint32_t i = 0; i < rot_dims / 2; ++i) {
    const double freq = std::pow(static_cast<double>(theta), -2.0 * i / rot_dims);
    const double wavelen = 2 * std::numbers::pi / freq;
    double d = 1;
    if (wavelen > low_wavelen) {
      d = factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (kOriginalContext / wavelen - kLowFreqFactor) / (kHighFreqFactor - kLowFreqFactor);
      d = 1 / ((1 - smooth) / factor + smooth);
    }
    out.push_back(static_cast<float>(d));
  }
  return out;
}

void write_random_model(const RandomModelSpec& spec, const std::string& path) {
  Writer w;
  build_random_model(spec, w);
  w.write(path);
}

}  // namespace kvpack::gguf
