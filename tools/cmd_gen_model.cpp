// `kvpack gen-model`: write a random-weight GGUF of a given architecture and shape; and the default
// model: the trained testbed model embedded at build time (CMakeLists.txt, models/testbed.gguf), or,
// in a build without it, a small deterministic random model.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

#include "commands.h"
#include "gguf/model_writer.h"
#include "util/progress.h"

namespace kvpack::cli {
namespace {

[[maybe_unused]] gguf::RandomModelSpec default_spec() {  // unused when a trained model is embedded
  gguf::RandomModelSpec s;
  s.arch = "llama";
  s.n_vocab = 512;
  s.n_embd = 256;
  s.n_layer = 4;
  s.n_head = 8;
  s.n_head_kv = 2;
  s.head_dim = 32;
  s.n_ff = 768;
  s.n_ctx = 2048;
  s.weight_type = DType::F16;
  s.seed = 20261129;
  return s;
}

constexpr const char* kTypeList = "f32, f16, bf16, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, q5_0, q5_1, iq4_nl, iq4_xs, q4_k_m, q5_k_m";

// Sets spec.weight_type (and spec.mix for the llama.cpp-style mixes q4_k_m / q5_k_m).
void parse_type(const std::string& t, gguf::RandomModelSpec& spec) {
  static const struct {
    const char* name;
    DType type;
    const char* mix;
  } kTypes[] = {{"f32", DType::F32, ""},       {"f16", DType::F16, ""},         {"bf16", DType::BF16, ""},
                {"q8_0", DType::Q8_0, ""},     {"q2_k", DType::Q2_K, ""},       {"q3_k", DType::Q3_K, ""},
                {"q4_k", DType::Q4_K, ""},     {"q5_k", DType::Q5_K, ""},       {"q6_k", DType::Q6_K, ""},
                {"q5_0", DType::Q5_0, ""},     {"q5_1", DType::Q5_1, ""},       {"iq4_nl", DType::IQ4_NL, ""},
                {"iq4_xs", DType::IQ4_XS, ""}, {"q4_k_m", DType::Q4_K, "q4_k_m"}, {"q5_k_m", DType::Q5_K, "q5_k_m"}};
  for (const auto& e : kTypes)
    if (t == e.name) {
      spec.weight_type = e.type;
      spec.mix = e.mix;
      return;
    }
  throw std::invalid_argument("unknown weight type '" + t + "' (" + kTypeList + ")");
}

}  // namespace

#ifdef KVPACK_EMBEDDED_MODEL
extern "C" const unsigned char kvpack_default_model_begin[];
extern "C" const unsigned char kvpack_default_model_end[];
#endif

namespace {

std::filesystem::path default_model_dir() {
  // Next to the executable (the build directory), else the temp directory.
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec || access(dir.c_str(), W_OK) != 0) dir = std::filesystem::temp_directory_path();
  return dir;
}

#ifdef KVPACK_EMBEDDED_MODEL
// The loader maps files, so the embedded bytes are written out once (and rewritten if the file differs,
// e.g. after a rebuild with a new model) to a path named after their size.
std::string embedded_model_path() {
  const size_t n = static_cast<size_t>(kvpack_default_model_end - kvpack_default_model_begin);
  const std::filesystem::path path = default_model_dir() / ("kvpack-default-model-" + std::to_string(n) + ".gguf");
  bool same = false;
  if (std::ifstream in(path, std::ios::binary); in) {
    std::vector<char> buf(n + 1);
    in.read(buf.data(), static_cast<std::streamsize>(n + 1));
    same = static_cast<size_t>(in.gcount()) == n && std::memcmp(buf.data(), kvpack_default_model_begin, n) == 0;
  }
  if (!same) {
    const std::filesystem::path tmp = path.string() + ".tmp" + std::to_string(getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(kvpack_default_model_begin), static_cast<std::streamsize>(n));
      if (!out) throw std::runtime_error("cannot write the embedded default model to " + tmp.string());
    }
    std::filesystem::rename(tmp, path);  // atomic: concurrent first runs never see a partial file
  }
  return path.string();
}
#endif

}  // namespace

std::string default_model_path() {
#ifdef KVPACK_EMBEDDED_MODEL
  const std::string p = embedded_model_path();
  std::fprintf(stderr, "[kvpack] no -m given: using the embedded default model (the kvpack testbed model, docs/testbed.md)\n");
  return p;
#else
  // Deterministic, so a stale copy is fine.
  const std::filesystem::path path = default_model_dir() / "kvpack-default-random-model.gguf";
  if (!std::filesystem::exists(path)) {
    gguf::RandomModelSpec s = default_spec();
    gguf::write_random_model(s, path.string());
  }
  std::fprintf(stderr, "[kvpack] no -m given: using the embedded default model (RANDOM weights, seed %llu; not trained)\n",
               static_cast<unsigned long long>(default_spec().seed));
  return path.string();
#endif
}

void add_gen_model(CLI::App& app) {
  auto* cmd = app.add_subcommand("gen-model", "Write a random-weight GGUF model of a given architecture and shape");
  auto s = std::make_shared<gguf::RandomModelSpec>();
  auto preset = std::make_shared<std::string>();
  auto type = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("--preset", *preset, "Start from a preset: qwen3-0.6b, llama-3.2-1b, gemma3-1b, tiny-llama, tiny-llama3, tiny-mistral, tiny-qwen2, tiny-qwen3, tiny-phi3, tiny-gemma3");
  cmd->add_option("--arch", s->arch, "Architecture: llama, qwen2, qwen3, phi3, gemma3")
      ->check(CLI::IsMember({"llama", "qwen2", "qwen3", "phi3", "gemma3"}));
  cmd->add_option("--sliding-window", s->sliding_window, "phi3 / gemma3: attention.sliding_window (0: none)");
  cmd->add_option("--softcap", s->final_logit_softcapping, "gemma3: final_logit_softcapping (0: none)");
  cmd->add_option("--vocab", s->n_vocab, "Vocabulary size");
  cmd->add_option("--embd", s->n_embd, "Embedding width");
  cmd->add_option("--layers", s->n_layer, "Layers");
  cmd->add_option("--heads", s->n_head, "Attention heads");
  cmd->add_option("--kv-heads", s->n_head_kv, "KV heads");
  cmd->add_option("--head-dim", s->head_dim, "Head dimension");
  cmd->add_option("--ff", s->n_ff, "Feed-forward width");
  cmd->add_option("--ctx", s->n_ctx, "Context length");
  cmd->add_option("--rope-theta", s->rope_theta, "RoPE base");
  cmd->add_flag("--tied", s->tied_embeddings, "Tie output and token embeddings");
  cmd->add_option("--type", *type,
                  std::string("Weight type: ") + kTypeList +
                      ". Block-quantised types are used for every 2-D weight but token_embd/output, which stay Q8_0; "
                      "q4_k_m / q5_k_m follow llama.cpp's mixes (Q6_K output, attn_v and ffn_down on some layers). "
                      "K-quants and iq4_xs need dims that are multiples of 256");
  cmd->add_option("--seed", s->seed, "Seed");
  cmd->add_option("-o,--output", *out, "Output GGUF path")->required();
  cmd->callback([=] {
    gguf::RandomModelSpec spec = *s;
    if (!preset->empty()) {
      // Preset first, then explicitly given flags on top of it.
      spec = gguf::RandomModelSpec::preset(*preset);
      if (cmd->count("--arch")) spec.arch = s->arch;
      if (cmd->count("--vocab")) spec.n_vocab = s->n_vocab;
      if (cmd->count("--embd")) spec.n_embd = s->n_embd;
      if (cmd->count("--layers")) spec.n_layer = s->n_layer;
      if (cmd->count("--heads")) spec.n_head = s->n_head;
      if (cmd->count("--kv-heads")) spec.n_head_kv = s->n_head_kv;
      if (cmd->count("--head-dim")) spec.head_dim = s->head_dim;
      if (cmd->count("--ff")) spec.n_ff = s->n_ff;
      if (cmd->count("--ctx")) spec.n_ctx = s->n_ctx;
      if (cmd->count("--rope-theta")) spec.rope_theta = s->rope_theta;
      if (cmd->count("--tied")) spec.tied_embeddings = true;
      if (cmd->count("--seed")) spec.seed = s->seed;
      if (cmd->count("--sliding-window")) spec.sliding_window = s->sliding_window;
      if (cmd->count("--softcap")) spec.final_logit_softcapping = s->final_logit_softcapping;
    }
    if (!type->empty()) parse_type(*type, spec);
    spec.validate();
    {
      // The writer cannot report progress: watch the bytes of its temporary file (OUT.tmp.XXXXXX) grow.
      Progress progress("gen-model: writing " + *out, 0, "MiB");
      const std::filesystem::path target(*out);
      const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
      const std::string prefix = target.filename().string() + ".tmp.";
      ProgressProbe probe(progress, [dir, prefix] {
        std::error_code ec;
        int64_t bytes = 0;
        for (const auto& e : std::filesystem::directory_iterator(dir, ec))
          if (e.path().filename().string().rfind(prefix, 0) == 0) bytes += static_cast<int64_t>(e.file_size(ec));
        return bytes >> 20;
      });
      gguf::write_random_model(spec, *out);
    }
    std::fprintf(stderr, "[kvpack] wrote %s: random-weight %s, %u layers, embd %u, heads %u/%u, head_dim %u, ff %u, vocab %u, ctx %u, %s\n",
                 out->c_str(), spec.arch.c_str(), spec.n_layer, spec.n_embd, spec.n_head, spec.n_head_kv, spec.head_dim, spec.n_ff,
                 spec.n_vocab, spec.n_ctx, spec.mix.empty() ? std::string(dtype_name(spec.weight_type)).c_str() : spec.mix.c_str());
  });
}

}  // namespace kvpack::cli
