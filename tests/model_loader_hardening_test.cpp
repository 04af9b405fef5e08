// Attacks on the model loaders, each reproduced as a crafted file: a llama2.c header whose expected
// size wraps around 2^64, GGUF metadata with huge context_length / block_count / key_length /
// head_count, a bad magic; plus every header field of the reference models set to extreme values.
// Every case must end in a clean exception with a clear message, or a successful load within the
// documented limits (model_limits) — never a crash (the ASan build of this test catches the rest).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>

#include "model/model.h"
#include "model_files.h"

namespace kvpack {
namespace {

using test::gguf_with;
using test::llama2c_with;
using test::shared_path;
using test::temp_file;

const std::string kTok = shared_path("models/tok512.bin");

// The message of the exception Model::load throws for `path` ("" if it loads).
std::string load_error(const std::string& path, const std::string& tok = "") {
  try {
    Model::load(path, tok);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(ModelLoaderHardening, Llama2cHeaderWhoseSizeProductWrapsIsRejected) {
  // The attacker's header: with the old unchecked u64 arithmetic, 28 + 4 * n_floats wrapped around
  // 2^64 to exactly 16 MiB, so this file passed the exact-size check and `generate` crashed.
  const int32_t h[7] = {1 << 20, 10485758, 1 << 19, 1 << 20, 2, 2, 1048569};
  std::string bytes(16u << 20, '\0');
  std::memcpy(bytes.data(), h, sizeof h);
  const std::string path = temp_file("wrapping_llama2c.bin");
  test::write_bytes(path, bytes);
  const std::string err = load_error(path, kTok);
  std::filesystem::remove(path);  // 16 MiB
  EXPECT_NE(err.find("not a llama2.c checkpoint (header says dim=1048576, hidden_dim=10485758, n_layers=524288"),
            std::string::npos) << err;
  EXPECT_NE(err.find("n_layer = 524288 is out of range"), std::string::npos) << err;
}

TEST(ModelLoaderHardening, BadMagicNamesWhatItSaw) {
  const std::string path = temp_file("bad_magic.bin");
  test::write_bytes(path, std::string("XYZW") + std::string(60, '\x07'));
  const std::string err = load_error(path);
  EXPECT_NE(err.find("not a GGUF file (magic 'XYZW') and not a llama2.c checkpoint (header says dim=1465538904, hidden_dim=117901063"),
            std::string::npos) << err;
  EXPECT_EQ(err.find("needs a tokenizer"), std::string::npos) << err;
}

TEST(ModelLoaderHardening, TinyFileIsNeitherKind) {
  const std::string path = temp_file("tiny.bin");
  test::write_bytes(path, "GGU");
  EXPECT_NE(load_error(path).find("not a GGUF file (magic 'GGU') and too small"), std::string::npos);
}

TEST(ModelLoaderHardening, ValidLlama2cHeaderWithoutTokenizerAsksForOne) {
  EXPECT_NE(load_error(shared_path("models/stories260K.bin")).find("needs a tokenizer file"), std::string::npos);
}

TEST(ModelLoaderHardening, HugeContextLengthIsClippedNotAllocated) {
  const std::string path = gguf_with("ctx.gguf", [](gguf::Writer& w) { w.set_u32("llama.context_length", 1u << 25); });
  const auto m = Model::load(path);
  EXPECT_EQ(m->config().n_ctx, model_limits::kMaxContext);
}

TEST(ModelLoaderHardening, HugeBlockCountIsRejectedBeforeAllocating) {
  const std::string path = gguf_with("blocks.gguf", [](gguf::Writer& w) { w.set_u32("llama.block_count", 1u << 22); });
  EXPECT_NE(load_error(path).find("n_layer = 4194304 is out of range (must be in [1, 4096])"), std::string::npos);
}

TEST(ModelLoaderHardening, HeadCountTimesKeyLengthCannotOverflowInt32) {
  // 65536 * 65536 = 2^32: q_dim() would overflow int32.
  const std::string path = gguf_with("heads.gguf", [](gguf::Writer& w) {
    w.set_u32("llama.attention.head_count", 65536);
    w.set_u32("llama.attention.head_count_kv", 65536);
    w.set_u32("llama.attention.key_length", 65536);
    w.set_u32("llama.attention.value_length", 65536);
  });
  EXPECT_NE(load_error(path).find("n_head = 65536 is out of range"), std::string::npos);
  const std::string kl = gguf_with("keylen.gguf", [](gguf::Writer& w) {
    w.set_u32("llama.attention.key_length", 1u << 28);
    w.set_u32("llama.attention.value_length", 1u << 28);
  });
  EXPECT_NE(load_error(kl).find("head_dim = 268435456 is out of range"), std::string::npos);
}

TEST(ModelLoaderHardening, KeyLengthBeyondInt32IsAnErrorNotTruncated) {
  const uint64_t v = (uint64_t{1} << 32) + 8;  // truncates to 8, stories260K's real head_dim
  const std::string path = gguf_with("keylen64.gguf", [&](gguf::Writer& w) {
    w.set_u64("llama.attention.key_length", v);
    w.set_u64("llama.attention.value_length", v);
  });
  EXPECT_NE(load_error(path).find("llama.attention.key_length = 4294967304 does not fit in a 32-bit signed integer"),
            std::string::npos) << load_error(path);
}

TEST(ModelLoaderHardening, NonFiniteFloatParametersAreRejected) {
  const std::string path = gguf_with("theta.gguf", [](gguf::Writer& w) {
    gguf::Value v;
    v.type = gguf::ValueType::FLOAT64;
    v.f = 1e300;  // outside float's range: the cast would be undefined behaviour
    w.set_value("llama.rope.freq_base", v);
  });
  EXPECT_NE(load_error(path).find("llama.rope.freq_base"), std::string::npos);
  const std::string eps = gguf_with("eps.gguf", [](gguf::Writer& w) { w.set_f32("llama.attention.layer_norm_rms_epsilon", -1); });
  EXPECT_NE(load_error(eps).find("rms_eps"), std::string::npos);
}

// A successful load must stay within the limits; a failure must say something.
void expect_clean_outcome(const std::string& path, const std::string& tok, const std::string& what, int& loaded,
                          int& rejected) {
  try {
    const auto m = Model::load(path, tok);
    const ModelConfig& c = m->config();
    EXPECT_LE(c.n_layer, model_limits::kMaxLayers) << what;
    EXPECT_LE(c.n_ctx, model_limits::kMaxContext) << what;
    EXPECT_GT(c.head_dim, 0) << what;
    ++loaded;
  } catch (const std::exception& e) {
    EXPECT_GT(std::strlen(e.what()), 10u) << what;
    ++rejected;
  }
}

TEST(ModelLoaderHardening, EveryLlama2cHeaderFieldAtExtremeValues) {
  const int32_t extremes[] = {0, -1, 1, INT32_MAX, INT32_MIN, 1 << 24, -(1 << 24)};
  int loaded = 0, rejected = 0;
  for (int field = 0; field < 7; ++field)
    for (int32_t v : extremes)
      expect_clean_outcome(llama2c_with("l2c_field.bin", field, v), kTok,
                           "field " + std::to_string(field) + " = " + std::to_string(v), loaded, rejected);
  EXPECT_EQ(loaded + rejected, 7 * 7);
  // Every change alters the size the header implies (version 0 even stores RoPE tables sized by seq_len).
  EXPECT_EQ(rejected, 7 * 7);
  std::printf("llama2.c header mutations: %d loaded, %d rejected\n", loaded, rejected);
}

TEST(ModelLoaderHardening, EveryGgufScalarKeyAtExtremeValues) {
  const auto src = gguf::File::open(shared_path("models/stories260K.gguf"));
  struct Extreme {
    const char* name;
    std::function<void(gguf::Writer&, const std::string&)> set;
  };
  const Extreme extremes[] = {
      {"0", [](gguf::Writer& w, const std::string& k) { w.set_u32(k, 0); }},
      {"-1", [](gguf::Writer& w, const std::string& k) { w.set_i32(k, -1); }},
      {"INT32_MAX", [](gguf::Writer& w, const std::string& k) { w.set_i32(k, INT32_MAX); }},
      {"2^31", [](gguf::Writer& w, const std::string& k) { w.set_u32(k, 1u << 31); }},
      {"2^63", [](gguf::Writer& w, const std::string& k) { w.set_u64(k, uint64_t{1} << 63); }},
      {"-inf", [](gguf::Writer& w, const std::string& k) { w.set_f32(k, -std::numeric_limits<float>::infinity()); }},
      {"string", [](gguf::Writer& w, const std::string& k) { w.set_string(k, "x"); }},
  };
  int loaded = 0, rejected = 0, cases = 0;
  for (const auto& kv : src->metadata()) {
    if (kv.value.type == gguf::ValueType::ARRAY) continue;  // arrays: the fuzzer's job
    for (const Extreme& x : extremes) {
      const std::string path = gguf_with("gguf_field.gguf", [&](gguf::Writer& w) { x.set(w, kv.key); });
      expect_clean_outcome(path, "", kv.key + " = " + x.name, loaded, rejected);
      ++cases;
    }
  }
  EXPECT_EQ(cases, 16 * 7);
  EXPECT_GT(rejected, cases / 2);
  std::printf("GGUF scalar key mutations: %d cases, %d loaded, %d rejected\n", cases, loaded, rejected);
}

TEST(ModelLoaderHardening, Llama2cTokenizerFieldsAtExtremeValues) {
  const std::string tok = test::read_all(kTok);
  int loaded = 0, rejected = 0;
  // offset 0: max_token_length; 4: first score; 8: first token's length
  for (size_t off : {size_t{0}, size_t{4}, size_t{8}})
    for (int32_t v : {0, -1, INT32_MAX, INT32_MIN, 1 << 24}) {
      std::string bytes = tok;
      std::memcpy(bytes.data() + off, &v, 4);
      for (int32_t vocab : {512, 1, INT32_MAX}) {
        try {
          EXPECT_EQ(Tokenizer::from_llama2c_bytes(bytes, vocab).n_vocab(), vocab);
          ++loaded;
        } catch (const std::runtime_error& e) {
          EXPECT_NE(std::string(e.what()).find("malformed llama2.c tokenizer"), std::string::npos) << e.what();
          ++rejected;
        }
      }
    }
  EXPECT_EQ(loaded + rejected, 3 * 5 * 3);
  EXPECT_GE(rejected, 15);  // at least every INT32_MAX vocab
  std::printf("llama2.c tokenizer mutations: %d loaded, %d rejected\n", loaded, rejected);
}

}  // namespace
}  // namespace kvpack
