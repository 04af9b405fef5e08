// llama2.c checkpoints (Karpathy's run.c format): the legacy "version 0" layout (7 int32 header, f32
// weights, RoPE tables) and export.py's "version 1" (magic "ak42", 256-byte header, f32). Both are
// read into memory (they are small) and checked against the exact expected file size, so a truncated
// or mismatched file is an error rather than garbage weights. The header is untrusted: every field
// is range-checked (Model::check_hparams) and the expected size is computed with checked arithmetic
// before a single weight byte is read or allocated, so a forged header whose size product wraps
// around 2^64 cannot pass the size check.
#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/model.h"
#include "util/checked.h"

namespace kvpack {
namespace {

constexpr uint32_t kMagicV1 = 0x616b3432u;  // "ak42" read as a little-endian u32
constexpr size_t kHeaderV0 = 28, kHeaderV1 = 256;
constexpr const char* kFieldNames[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};

int32_t rd_i32(const uint8_t* b) {
  int32_t v;
  std::memcpy(&v, b, 4);
  return v;
}

// The first bytes as text for error messages: printable ASCII as is, anything else as \xNN.
std::string printable(const uint8_t* b, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (b[i] >= 0x20 && b[i] < 0x7f && b[i] != '\'') {
      s += static_cast<char>(b[i]);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", b[i]);
      s += hex;
    }
  }
  return s;
}

// Number of f32 values the checkpoint holds after its header (overflow-checked; u64 throughout).
uint64_t weight_floats(const ModelConfig& c, uint64_t rope_tables, bool shared) {
  const uint64_t d = static_cast<uint64_t>(c.n_embd), L = static_cast<uint64_t>(c.n_layer);
  const uint64_t qd = static_cast<uint64_t>(c.n_head) * static_cast<uint64_t>(c.head_dim);
  const uint64_t kvd = static_cast<uint64_t>(c.n_head_kv) * static_cast<uint64_t>(c.head_dim);
  const uint64_t ff = static_cast<uint64_t>(c.n_ff), V = static_cast<uint64_t>(c.n_vocab);
  const char* what = "llama2.c weight count";
  uint64_t per_layer = checked_mul(d, uint64_t{2}, what);                          // attention + ffn norms
  per_layer = checked_add(per_layer, checked_product(what, d, qd, 2), what);        // wq, wo
  per_layer = checked_add(per_layer, checked_product(what, d, kvd, 2), what);       // wk, wv
  per_layer = checked_add(per_layer, checked_product(what, d, ff, 3), what);        // w1, w2, w3
  uint64_t n = checked_mul(per_layer, L, what);
  const uint64_t embd = checked_mul(V, d, what);
  n = checked_add(n, checked_mul(embd, shared ? uint64_t{1} : uint64_t{2}, what), what);
  n = checked_add(n, d, what);  // final norm
  return checked_add(n, rope_tables, what);
}

}  // namespace

std::unique_ptr<Model> Model::load_llama2c(const std::string& path, const std::string& tokenizer_path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError(path + ": cannot open file");
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) throw ModelError(path + ": cannot read file size: " + ec.message());
  uint8_t head[kHeaderV1] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  const size_t got = static_cast<size_t>(in.gcount());
  in.clear();
  const std::string magic_text = printable(head, std::min<size_t>(got, 4));
  if (got < kHeaderV0)
    throw ModelError(path + ": not a GGUF file (magic '" + magic_text + "') and too small for a llama2.c checkpoint (" +
                     std::to_string(file_size) + " bytes)");

  int version = 0;
  size_t header = kHeaderV0, p = 0;
  uint32_t magic;
  std::memcpy(&magic, head, 4);
  if (magic == kMagicV1) {
    if (got < kHeaderV1) throw ModelError(path + ": truncated llama2.c v1 header");
    version = rd_i32(head + 4);
    if (version != 1)
      throw ModelError(path + ": llama2.c export version " + std::to_string(version) + " is not supported (only 0 and 1)");
    p = 8;
    header = kHeaderV1;
  }
  int32_t h[7];
  for (int i = 0; i < 7; ++i) h[i] = rd_i32(head + p + 4 * static_cast<size_t>(i));
  std::string said;
  for (int i = 0; i < 7; ++i) said += (i ? ", " : "") + std::string(kFieldNames[i]) + "=" + std::to_string(h[i]);
  auto not_llama2c = [&](const std::string& why) {
    return ModelError(path + ": not a GGUF file (magic '" + magic_text + "') and not a llama2.c checkpoint (header says " +
                      said + ": " + why + ")");
  };

  std::unique_ptr<Model> m(new Model());
  ModelConfig& c = m->cfg_;
  c.arch = "llama";
  c.name = std::filesystem::path(path).filename().string();
  c.n_embd = h[0];
  c.n_ff = h[1];
  c.n_layer = h[2];
  c.n_head = h[3];
  c.n_head_kv = h[4];
  bool shared = h[5] > 0;  // version 0: a negative vocab size means a separate classifier
  const int64_t vocab = h[5] < 0 ? -int64_t{h[5]} : int64_t{h[5]};
  c.n_vocab = vocab > INT32_MAX ? 0 : static_cast<int32_t>(vocab);  // |INT32_MIN| is rejected as 0
  c.n_ctx = h[6];
  if (version == 1) shared = head[p + 28] != 0;
  if (c.n_head <= 0 || c.n_embd % c.n_head != 0)
    throw not_llama2c("dim is not a positive multiple of n_heads");
  c.head_dim = c.n_embd / c.n_head;
  c.rope_dims = c.head_dim;
  c.rope_theta = 10000.0f;
  c.rms_eps = 1e-5f;
  c.tied_embeddings = shared;
  const int32_t seq_len = c.n_ctx;  // before check_hparams may clip n_ctx: the v0 RoPE tables use it
  uint64_t n_floats = 0, rope_tables = 0, expected = 0;
  try {
    m->check_hparams(c.name);
    // version 0 stores RoPE tables: real + imaginary halves of seq_len * head_dim / 2 each
    rope_tables = version == 0 ? checked_mul(uint64_t(seq_len), uint64_t(c.head_dim), "llama2.c RoPE table size") : 0;
    n_floats = weight_floats(c, rope_tables, shared);
    expected = checked_add(uint64_t{header}, checked_mul(n_floats, uint64_t{4}, "llama2.c checkpoint size"),
                           "llama2.c checkpoint size");
  } catch (const std::runtime_error& e) {
    throw not_llama2c(e.what());
  }
  if (file_size != expected)
    throw not_llama2c("the file has " + std::to_string(file_size) + " bytes, the header implies " +
                      std::to_string(expected));
  if (tokenizer_path.empty())
    throw ModelError(path + ": llama2.c checkpoint needs a tokenizer file (--tokenizer, e.g. tok512.bin)");

  // The size check bounds every allocation below by the file size.
  m->owned_.resize(n_floats);
  in.seekg(static_cast<std::streamoff>(header));
  if (!in.read(reinterpret_cast<char*>(m->owned_.data()), static_cast<std::streamsize>(n_floats * 4)))
    throw ModelError(path + ": read failed");
  const float* base = m->owned_.data();
  size_t off = 0;
  auto take = [&](uint64_t n) {
    const float* ptr = base + off;
    off += n;
    return ptr;
  };
  auto mat = [](const float* ptr, uint64_t n_in, uint64_t n_out) {
    return Weight{ptr, DType::F32, static_cast<int64_t>(n_in), static_cast<int64_t>(n_out)};
  };
  const uint64_t d = static_cast<uint64_t>(c.n_embd), L = static_cast<uint64_t>(c.n_layer);
  const uint64_t qd = static_cast<uint64_t>(c.q_dim()), kvd = static_cast<uint64_t>(c.kv_dim());
  const uint64_t ff = static_cast<uint64_t>(c.n_ff), V = static_cast<uint64_t>(c.n_vocab);
  ModelWeights& w = m->w_;
  w.layers.resize(L);
  const float *att_norm, *ffn_norm, *wq, *wk, *wv, *wo, *w1, *w2, *w3, *fin;
  if (version == 0) {
    w.tok_embd = mat(take(V * d), d, V);
    att_norm = take(L * d);
    wq = take(L * d * qd);
    wk = take(L * d * kvd);
    wv = take(L * d * kvd);
    wo = take(L * qd * d);
    ffn_norm = take(L * d);
    w1 = take(L * ff * d);
    w2 = take(L * ff * d);
    w3 = take(L * ff * d);
    fin = take(d);
    take(rope_tables);
  } else {
    att_norm = take(L * d);
    ffn_norm = take(L * d);
    fin = take(d);
    w.tok_embd = mat(take(V * d), d, V);
    wq = take(L * d * qd);
    wk = take(L * d * kvd);
    wv = take(L * d * kvd);
    wo = take(L * qd * d);
    w1 = take(L * ff * d);
    w2 = take(L * ff * d);
    w3 = take(L * ff * d);
  }
  w.out_norm = mat(fin, d, 1);
  w.output = shared ? w.tok_embd : mat(take(V * d), d, V);
  for (uint64_t l = 0; l < L; ++l) {
    LayerWeights& lw = w.layers[l];
    lw.attn_norm = mat(att_norm + l * d, d, 1);
    lw.ffn_norm = mat(ffn_norm + l * d, d, 1);
    lw.wq = mat(wq + l * d * qd, d, qd);
    lw.wk = mat(wk + l * d * kvd, d, kvd);
    lw.wv = mat(wv + l * d * kvd, d, kvd);
    lw.wo = mat(wo + l * qd * d, qd, d);
    lw.w_gate = mat(w1 + l * ff * d, d, ff);  // w1: gate (silu branch)
    lw.w_down = mat(w2 + l * ff * d, ff, d);
    lw.w_up = mat(w3 + l * ff * d, d, ff);
  }
  m->weight_bytes_ = (n_floats - rope_tables) * 4;
  m->tok_ = std::make_unique<Tokenizer>(Tokenizer::from_llama2c(tokenizer_path, c.n_vocab));
  m->validate();
  return m;
}

}  // namespace kvpack
