// llama2.c checkpoints (Karpathy's run.c format): the legacy "version 0" layout (7 int32 header, f32
// weights, RoPE tables) and export.py's "version 1" (magic "ak42", 256-byte header, f32). Both are
// read into memory (they are small) and checked against the exact expected file size, so a truncated
// or mismatched file is an error rather than garbage weights.
#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/model.h"

namespace kvpack {
namespace {

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw ModelError(path + ": cannot open file");
  const std::streamoff n = in.tellg();
  if (n < 0) throw ModelError(path + ": cannot read file size");
  std::vector<uint8_t> buf(static_cast<size_t>(n));
  in.seekg(0);
  if (n > 0 && !in.read(reinterpret_cast<char*>(buf.data()), n)) throw ModelError(path + ": read failed");
  return buf;
}

int32_t rd_i32(const std::vector<uint8_t>& b, size_t off) {
  int32_t v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}

}  // namespace

std::unique_ptr<Model> Model::load_llama2c(const std::string& path, const std::string& tokenizer_path) {
  if (tokenizer_path.empty())
    throw ModelError(path + ": llama2.c checkpoint needs a tokenizer file (--tokenizer, e.g. tok512.bin)");
  const std::vector<uint8_t> buf = read_all(path);
  if (buf.size() < 28) throw ModelError(path + ": too small for a llama2.c checkpoint (" + std::to_string(buf.size()) + " bytes)");

  int version = 0;
  size_t header = 28, p = 0;
  uint32_t magic;
  std::memcpy(&magic, buf.data(), 4);
  if (magic == 0x616b3432u) {  // "ak42"
    if (buf.size() < 256) throw ModelError(path + ": truncated llama2.c v1 header");
    version = rd_i32(buf, 4);
    if (version != 1)
      throw ModelError(path + ": llama2.c export version " + std::to_string(version) + " is not supported (only 0 and 1)");
    p = 8;
    header = 256;
  }
  int32_t h[7];
  for (int i = 0; i < 7; ++i) h[i] = rd_i32(buf, p + 4 * static_cast<size_t>(i));
  std::unique_ptr<Model> m(new Model());
  ModelConfig& c = m->cfg_;
  c.arch = "llama";
  c.name = std::filesystem::path(path).filename().string();
  c.n_embd = h[0];
  c.n_ff = h[1];
  c.n_layer = h[2];
  c.n_head = h[3];
  c.n_head_kv = h[4];
  bool shared = h[5] > 0;
  c.n_vocab = h[5] < 0 ? -h[5] : h[5];
  c.n_ctx = h[6];
  if (version == 1) shared = buf[p + 28] != 0;
  for (int i = 0; i < 7; ++i)
    if ((i != 5 && h[i] <= 0) || h[i] > (1 << 24) || h[i] < -(1 << 24))
      throw ModelError(path + ": implausible llama2.c header value " + std::to_string(h[i]) + " (field " + std::to_string(i) + ")");
  if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0 || c.n_embd % c.n_head != 0)
    throw ModelError(path + ": inconsistent head counts in llama2.c header");
  c.head_dim = c.n_embd / c.n_head;
  c.rope_dims = c.head_dim;
  c.rope_theta = 10000.0f;
  c.rms_eps = 1e-5f;
  c.tied_embeddings = shared;

  const uint64_t d = static_cast<uint64_t>(c.n_embd), L = static_cast<uint64_t>(c.n_layer);
  const uint64_t qd = static_cast<uint64_t>(c.q_dim()), kvd = static_cast<uint64_t>(c.kv_dim());
  const uint64_t ff = static_cast<uint64_t>(c.n_ff), V = static_cast<uint64_t>(c.n_vocab);
  const uint64_t rope_tables = version == 0 ? static_cast<uint64_t>(c.n_ctx) * c.head_dim : 0;  // real + imag halves
  const uint64_t n_floats = V * d + L * d * 2 + L * d * qd + L * d * kvd * 2 + L * qd * d + L * ff * d * 3 + d +
                            rope_tables + (shared ? 0 : V * d);
  if (buf.size() != header + n_floats * 4)
    throw ModelError(path + ": size " + std::to_string(buf.size()) + " does not match its header (expected " +
                     std::to_string(header + n_floats * 4) + " bytes)");

  m->owned_.resize(n_floats);
  std::memcpy(m->owned_.data(), buf.data() + header, n_floats * 4);
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
  m->weight_bytes_ = n_floats * 4 - rope_tables * 4;
  m->tok_ = std::make_unique<Tokenizer>(Tokenizer::from_llama2c(tokenizer_path, c.n_vocab));
  m->validate();
  return m;
}

std::unique_ptr<Model> Model::load(const std::string& path, const std::string& tokenizer_path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError(path + ": cannot open model file");
  char magic[4] = {};
  in.read(magic, 4);
  if (in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0) {
    if (!tokenizer_path.empty()) throw ModelError("--tokenizer is only for llama2.c checkpoints; GGUF files carry their vocab");
    return load_gguf(path);
  }
  return load_llama2c(path, tokenizer_path);
}

Model::~Model() = default;

void Model::validate() const {
  const ModelConfig& c = cfg_;
  if (c.n_vocab <= 0 || c.n_embd <= 0 || c.n_layer <= 0 || c.n_head <= 0 || c.head_dim <= 0 || c.n_ff <= 0 || c.n_ctx <= 0)
    throw ModelError(c.name + ": non-positive hyper-parameter");
  if (c.rope_dims <= 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0)
    throw ModelError(c.name + ": rope dimension count " + std::to_string(c.rope_dims) + " is invalid for head_dim " +
                     std::to_string(c.head_dim));
  if (tok_ && tok_->n_vocab() != c.n_vocab)
    throw ModelError(c.name + ": tokenizer has " + std::to_string(tok_->n_vocab()) + " tokens but the model has " +
                     std::to_string(c.n_vocab));
}

}  // namespace kvpack
