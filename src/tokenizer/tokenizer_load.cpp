// Tokenizer loaders: the tokenizer.ggml.* keys of a GGUF file, and llama2.c's tokenizer.bin. Both
// only fill a VocabData; the Tokenizer constructor (tokenizer.cpp) checks and indexes it.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer_impl.h"

namespace kvpack {

using tokenizer_detail::PreInfo;
using tokenizer_detail::parse_byte_token;


Tokenizer Tokenizer::from_gguf(const gguf::File& f) {
  const std::string where = f.name() + ": ";
  auto fail = [&](const std::string& msg) -> std::runtime_error { return std::runtime_error(where + msg); };
  VocabData v;
  std::optional<std::string> model;
  try {
    model = f.get_string("tokenizer.ggml.model");
  } catch (const std::exception& e) {
    throw fail(std::string("bad tokenizer.ggml.model: ") + e.what());
  }
  if (!model) throw fail("missing key tokenizer.ggml.model");
  if (*model == "llama") {
    v.kind = VocabData::Kind::SPM;
  } else if (*model == "gpt2") {
    v.kind = VocabData::Kind::BPE;
  } else {
    throw fail("unsupported tokenizer model '" + *model + "' (tokenizer.ggml.model; supported: llama, gpt2)");
  }

  try {
    if (auto pre = f.get_string("tokenizer.ggml.pre")) v.pre = *pre;
  } catch (const std::exception& e) {
    throw fail(std::string("bad tokenizer.ggml.pre: ") + e.what());
  }
  if (v.kind == VocabData::Kind::BPE) {
    if (v.pre.empty()) v.pre = "default";
    if (!tokenizer_detail::lookup_pre(v.pre, nullptr))
      throw fail("unsupported BPE pre-tokenizer '" + v.pre + "' (tokenizer.ggml.pre)");
  }

  auto array_of = [&](const char* key, gguf::ValueType want) -> const gguf::Value* {
    const gguf::Value* val = f.find(key);
    if (!val) return nullptr;
    if (val->type != gguf::ValueType::ARRAY) throw fail(std::string(key) + " is not an array");
    if (want == gguf::ValueType::STRING && val->elem_type != gguf::ValueType::STRING)
      throw fail(std::string(key) + " is not a string array");
    return val;
  };

  const gguf::Value* toks = array_of("tokenizer.ggml.tokens", gguf::ValueType::STRING);
  if (!toks) throw fail("missing key tokenizer.ggml.tokens");
  if (toks->strs.empty()) throw fail("tokenizer.ggml.tokens is empty");
  v.tokens = toks->strs;
  const size_t n = v.tokens.size();

  if (const gguf::Value* sc = array_of("tokenizer.ggml.scores", gguf::ValueType::FLOAT32)) {
    if (!sc->floats.empty()) {
      for (double d : sc->floats) v.scores.push_back(static_cast<float>(d));
    } else {
      for (int64_t d : sc->ints) v.scores.push_back(static_cast<float>(d));
    }
    if (v.scores.size() < n)
      throw fail("tokenizer.ggml.scores has " + std::to_string(v.scores.size()) + " entries for " +
                 std::to_string(n) + " tokens");
  }
  if (const gguf::Value* tt = array_of("tokenizer.ggml.token_type", gguf::ValueType::INT32)) {
    if (tt->ints.size() < n)
      throw fail("tokenizer.ggml.token_type has " + std::to_string(tt->ints.size()) + " entries for " +
                 std::to_string(n) + " tokens");
    v.token_types.reserve(n);
    for (size_t i = 0; i < n; ++i)
      v.token_types.push_back(static_cast<int32_t>(std::clamp<int64_t>(tt->ints[i], -1, 255)));
  }
  if (v.kind == VocabData::Kind::BPE) {
    const gguf::Value* mg = array_of("tokenizer.ggml.merges", gguf::ValueType::STRING);
    if (!mg) throw fail("missing key tokenizer.ggml.merges (required for gpt2 tokenizers)");
    v.merges = mg->strs;
  }

  auto get_id = [&](const char* key, int32_t def) -> int32_t {
    std::optional<int64_t> x;
    try {
      x = f.get_int(key);
    } catch (const std::exception& e) {
      throw fail(std::string("bad ") + key + ": " + e.what());
    }
    if (!x) return def;
    if (*x < 0 || *x >= static_cast<int64_t>(n)) return -1;  // e.g. 0xFFFFFFFF = "none"
    return static_cast<int32_t>(*x);
  };
  auto get_flag = [&](const char* key, bool def) -> bool {
    try {
      if (auto b = f.get_bool(key)) return *b;
    } catch (const std::exception& e) {
      throw fail(std::string("bad ") + key + ": " + e.what());
    }
    return def;
  };
  const bool spm = v.kind == VocabData::Kind::SPM;
  // llama.cpp defaults: SPM bos=1 eos=2 unk=0; BPE has no sensible defaults
  v.bos = get_id("tokenizer.ggml.bos_token_id", spm && n > 1 ? 1 : -1);
  v.eos = get_id("tokenizer.ggml.eos_token_id", spm && n > 2 ? 2 : -1);
  v.unk = get_id("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
  v.pad = get_id("tokenizer.ggml.padding_token_id", -1);
  PreInfo info{};
  if (!spm) tokenizer_detail::lookup_pre(v.pre, &info);
  v.add_bos = get_flag("tokenizer.ggml.add_bos_token", spm ? true : info.add_bos_default);
  v.add_space_prefix = get_flag("tokenizer.ggml.add_space_prefix", spm);
  return Tokenizer(std::move(v));
}

Tokenizer Tokenizer::from_llama2c_bytes(std::string_view data, int32_t vocab_size, const std::string& name) {
  auto fail = [&](const std::string& msg) -> std::runtime_error {
    return std::runtime_error(name + ": malformed llama2.c tokenizer: " + msg);
  };
  if (vocab_size <= 0) throw fail("vocab_size must be positive (got " + std::to_string(vocab_size) + ")");
  size_t pos = 0;
  auto read_i32 = [&](const char* what, size_t idx) -> int32_t {
    if (data.size() - pos < 4)
      throw fail(std::string("truncated while reading ") + what + " of token " + std::to_string(idx));
    int32_t x;
    std::memcpy(&x, data.data() + pos, 4);
    pos += 4;
    return x;
  };
  auto read_f32 = [&](size_t idx) -> float {
    if (data.size() - pos < 4) throw fail("truncated while reading score of token " + std::to_string(idx));
    float x;
    std::memcpy(&x, data.data() + pos, 4);
    pos += 4;
    return x;
  };
  if (data.size() < 4) throw fail("file too short for the header (" + std::to_string(data.size()) + " bytes)");
  const int32_t max_len = read_i32("max_token_length", 0);
  if (max_len < 0) throw fail("negative max_token_length " + std::to_string(max_len));
  // Each token takes at least 8 bytes (score + length), so a vocab size the file cannot hold is an
  // error before anything is reserved for it.
  if (static_cast<uint64_t>(vocab_size) > (data.size() - 4) / 8)
    throw fail("vocab_size " + std::to_string(vocab_size) + " cannot fit in " + std::to_string(data.size() - 4) +
               " bytes (each token needs at least 8)");

  VocabData v;
  v.kind = VocabData::Kind::SPM;
  v.llama2c = true;
  v.add_space_prefix = true;  // llama2.c's encode always adds the dummy prefix " "
  v.add_bos = true;
  const size_t n = static_cast<size_t>(vocab_size);
  v.tokens.reserve(n);
  v.scores.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const float score = read_f32(i);
    const int32_t len = read_i32("length", i);
    if (len < 0) throw fail("negative length " + std::to_string(len) + " for token " + std::to_string(i));
    if (data.size() - pos < static_cast<size_t>(len))
      throw fail("truncated in the text of token " + std::to_string(i) + " (length " + std::to_string(len) +
                 ", " + std::to_string(data.size() - pos) + " bytes left)");
    v.tokens.emplace_back(data.substr(pos, static_cast<size_t>(len)));
    v.scores.push_back(score);
    pos += static_cast<size_t>(len);
  }
  v.token_types.resize(n, kTypeNormal);
  for (size_t i = 0; i < n; ++i)
    if (parse_byte_token(v.tokens[i]) >= 0) v.token_types[i] = kTypeByte;
  // run.c hard-codes <unk>=0, BOS=1, EOS=2
  v.unk = 0;
  v.token_types[0] = kTypeUnknown;
  if (n > 1) { v.bos = 1; v.token_types[1] = kTypeControl; }
  if (n > 2) { v.eos = 2; v.token_types[2] = kTypeControl; }
  return Tokenizer(std::move(v));
}

Tokenizer Tokenizer::from_llama2c(const std::string& path, int32_t vocab_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open llama2.c tokenizer file");
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error(path + ": read error");
  return from_llama2c_bytes(data, vocab_size, path);
}

}  // namespace kvpack
