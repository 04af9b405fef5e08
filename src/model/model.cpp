// Model::load (file kind by content) and the hyper-parameter checks shared by both loaders.
#include <cmath>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <iostream>

#include "model/model.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <new>
#include <vector>

#include "kernels/matmul_packed.h"
#include "util/huge_alloc.h"

namespace kvpack {
namespace {

void check_range(const std::string& where, const char* field, int64_t v, int64_t max) {
  if (v <= 0 || v > max)
    throw ModelError(where + ": " + field + " = " + std::to_string(v) + " is out of range (must be in [1, " +
                     std::to_string(max) + "])");
}

void check_positive_finite(const std::string& where, const char* field, double v) {
  if (!std::isfinite(v) || v <= 0)
    throw ModelError(where + ": " + field + " = " + std::to_string(v) + " must be a positive finite number");
}

// The parts' packed forms (`member`: Weight::packed or ::packed_k) as one matrix (kernels::packed_concat),
// kept in `store` (reserved: the pointer stays valid); nullptr when they do not lie back to back.
template <class P>
const P* concat_packed(std::initializer_list<const Weight*> parts, const P* Weight::*member, std::vector<P>& store) {
  std::vector<const P*> v;
  for (const Weight* p : parts) v.push_back(p->*member);
  P c = kernels::packed_concat(v);
  if (!c) return nullptr;
  store.push_back(std::move(c));
  return &store.back();
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, const std::string& tokenizer_path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError(path + ": cannot open model file");
  char magic[4] = {};
  in.read(magic, 4);
  std::unique_ptr<Model> m;
  if (in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0) {
    if (!tokenizer_path.empty()) throw ModelError("--tokenizer is only for llama2.c checkpoints; GGUF files carry their vocab");
    m = load_gguf(path);
  } else {
    m = load_llama2c(path, tokenizer_path);  // says "not a GGUF file ... and not a llama2.c checkpoint" if neither
  }
  m->path_ = path;
  m->trained_ctx_ = m->cfg_.n_ctx;
  return m;
}

void Model::set_context_length(int32_t n_ctx) {
  if (n_ctx < 1 || n_ctx > model_limits::kMaxContext)
    throw std::invalid_argument("context length " + std::to_string(n_ctx) + " must be in [1, " +
                                std::to_string(model_limits::kMaxContext) + "]");
  cfg_.n_ctx = n_ctx;
}

Model::~Model() = default;

void Model::pack_weights() {
  if (!kernels::packed_q8_preferred()) return;
  if (const char* e = std::getenv("KVPACK_REPACK"); e != nullptr && std::strcmp(e, "0") == 0) return;
  std::vector<Weight*> todo;
  for (LayerWeights& l : w_.layers)
    for (Weight* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) todo.push_back(w);
  todo.push_back(&w_.output);
  std::erase_if(todo, [](const Weight* w) {
    return !*w || !(w->type == DType::Q8_0 || (w->type == DType::Q4_K && w->n_in % 256 == 0));
  });
  if (todo.empty()) return;
  // One arena for every packed matrix: a 2 MiB rounding per matrix would leave up to 2 MiB resident per
  // matrix (~200 MB for a 28-layer model), one arena at most 2 MiB in all.
  auto slot = [](const Weight* w) {
    const size_t b = w->type == DType::Q8_0 ? kernels::PackedQ8::bytes_for(w->n_out, w->n_in)
                                            : kernels::PackedQ4K::bytes_for(w->n_out, w->n_in);
    return (b + 63) / 64 * 64;
  };
  size_t total = 0;
  for (const Weight* w : todo) total += slot(w);
  uint8_t* arena = huge_alloc(total);
  if (arena == nullptr) throw std::bad_alloc();
  packed_arena_.reset(arena);
  // Every matrix's place is fixed first (arena offset, index in its vector), then the matrices are packed on
  // up to 8 threads, largest first (the output head is a quarter of a small model), each dropping its file
  // pages as soon as it is done so resident memory stays near one copy. One thread took 0.5-1.1 s beside
  // a 0.1-0.6 s load for the Qwen3-0.6B shape; a 7B model has ten times the bytes.
  struct Job {
    Weight* w;
    uint8_t* at;
    size_t index;  // in packed_ (Q8_0) or packed_k_ (Q4_K)
  };
  std::vector<Job> jobs;
  size_t n_q8 = 0, n_k = 0;
  for (Weight* w : todo) {
    jobs.push_back({w, arena, w->type == DType::Q8_0 ? n_q8++ : n_k++});
    arena += slot(w);
  }
  packed_.resize(n_q8);
  packed_k_.resize(n_k);
  std::sort(jobs.begin(), jobs.end(), [&](const Job& x, const Job& y) { return slot(x.w) > slot(y.w); });
  std::atomic<size_t> next{0};
  std::exception_ptr failed;
  std::mutex failed_mu;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < jobs.size();) {
      const Job& j = jobs[i];
      try {
        if (j.w->type == DType::Q8_0) packed_[j.index] = kernels::pack_q8_0_into(j.at, j.w->data, j.w->n_out, j.w->n_in);
        else packed_k_[j.index] = kernels::pack_q4_k_into(j.at, j.w->data, j.w->n_out, j.w->n_in);
      } catch (...) {
        const std::lock_guard lock(failed_mu);
        if (!failed) failed = std::current_exception();
        continue;
      }
      if (gguf_) gguf_->drop_resident(j.w->data, row_bytes(j.w->type, static_cast<uint64_t>(j.w->n_in)) * static_cast<uint64_t>(j.w->n_out));
    }
  };
  const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  {
    std::vector<std::jthread> helpers;
    for (unsigned t = 1; t < n_threads; ++t) helpers.emplace_back(work);
    work();
  }
  if (failed) std::rethrow_exception(failed);
  for (const Job& j : jobs) {
    if (j.w->type == DType::Q8_0) j.w->packed = &packed_[j.index];
    else j.w->packed_k = &packed_k_[j.index];
  }
  // Q|K|V and gate|up packed back to back (todo's order) become one matrix each where the layout allows.
  fused_.reserve(2 * w_.layers.size());
  fused_k_.reserve(2 * w_.layers.size());
  auto fuse = [&](std::initializer_list<const Weight*> parts, Weight& into) {
    const Weight& first = **parts.begin();
    int64_t n_out = 0;
    for (const Weight* p : parts) {
      if (p->type != first.type || (p->packed == nullptr && p->packed_k == nullptr)) return;
      n_out += p->n_out;
    }
    if (first.packed != nullptr) into.packed = concat_packed(parts, &Weight::packed, fused_);
    else into.packed_k = concat_packed(parts, &Weight::packed_k, fused_k_);
    if (into.packed == nullptr && into.packed_k == nullptr) return;
    into.data = first.data;
    into.type = first.type;
    into.n_in = first.n_in;
    into.n_out = n_out;
  };
  for (LayerWeights& l : w_.layers) {
    fuse({&l.wq, &l.wk, &l.wv}, l.wqkv);
    fuse({&l.w_gate, &l.w_up}, l.w_gate_up);
  }
}

void Model::check_hparams(const std::string& where) {
  namespace lim = model_limits;
  ModelConfig& c = cfg_;
  check_range(where, "n_layer", c.n_layer, lim::kMaxLayers);
  check_range(where, "n_embd", c.n_embd, lim::kMaxEmbd);
  check_range(where, "n_head", c.n_head, lim::kMaxHeads);
  check_range(where, "n_head_kv", c.n_head_kv, lim::kMaxHeads);
  check_range(where, "head_dim", c.head_dim, lim::kMaxHeadDim);
  check_range(where, "n_ff", c.n_ff, lim::kMaxFeedForward);
  check_range(where, "n_vocab", c.n_vocab, lim::kMaxVocab);
  check_range(where, "n_ctx", c.n_ctx, INT32_MAX);
  if (c.n_head % c.n_head_kv != 0)
    throw ModelError(where + ": head_count (" + std::to_string(c.n_head) + ") is not a multiple of head_count_kv (" +
                     std::to_string(c.n_head_kv) + ")");
  if (c.rope_dims <= 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0)
    throw ModelError(where + ": rope dimension count " + std::to_string(c.rope_dims) + " is invalid for head_dim " +
                     std::to_string(c.head_dim));
  check_positive_finite(where, "rope_theta", c.rope_theta);
  check_positive_finite(where, "rope_freq_scale", c.rope_freq_scale);
  check_positive_finite(where, "rms_eps", c.rms_eps);
  if (c.n_ctx > lim::kMaxContext) {
    std::cerr << "warning: " << where << ": context length " << c.n_ctx << " clipped to " << lim::kMaxContext << "\n";
    c.n_ctx = static_cast<int32_t>(lim::kMaxContext);
  }
}

void Model::validate() const {
  const ModelConfig& c = cfg_;
  if (tok_ && tok_->n_vocab() != c.n_vocab)
    throw ModelError(c.name + ": tokenizer has " + std::to_string(tok_->n_vocab()) + " tokens but the model has " +
                     std::to_string(c.n_vocab));
}

}  // namespace kvpack
