// GGUF reader on the real reference files in shared/: the stories260K model, every llama.cpp vocab-only
// file, and opening paths that are not GGUF files. The hand-built malformed images are in
// gguf_reader_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gguf/gguf.h"

using namespace kvpack;
using namespace kvpack::gguf;

namespace {

const std::string kShared = KVPACK_SHARED_DIR;

}  // namespace

TEST(GgufReal, Stories260K) {
  auto f = File::open(kShared + "/models/stories260K.gguf");
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 5);
  EXPECT_EQ(f->get_int("llama.embedding_length"), 64);
  EXPECT_EQ(f->get_int("llama.attention.head_count"), 8);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(f->get_int("llama.context_length"), 512);
  EXPECT_EQ(f->get_int("llama.feed_forward_length"), 172);
  EXPECT_EQ(f->get_int("llama.rope.dimension_count"), 8);
  EXPECT_NEAR(*f->get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f->get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f->get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(f->get_int("tokenizer.ggml.seperator_token_id"), 4294967295);
  EXPECT_EQ(f->metadata().size(), 19u);
  EXPECT_EQ(f->metadata()[0].key, "tokenizer.ggml.tokens");  // file order kept
  EXPECT_FALSE(f->get_int("llama.no_such_key").has_value());

  const auto* toks = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_NE(toks, nullptr);
  ASSERT_EQ(toks->size(), 512u);
  EXPECT_EQ((*toks)[0], "<unk>");
  EXPECT_EQ((*toks)[1], "<s>");
  EXPECT_EQ((*toks)[3], "<0x00>");
  const auto* scores = f->get_float_array("tokenizer.ggml.scores");
  ASSERT_NE(scores, nullptr);
  EXPECT_EQ(scores->size(), 512u);
  const auto* types = f->get_int_array("tokenizer.ggml.token_type");
  ASSERT_NE(types, nullptr);
  ASSERT_EQ(types->size(), 512u);
  EXPECT_EQ((*types)[0], 2);
  EXPECT_EQ((*types)[1], 3);
  EXPECT_EQ((*types)[3], 6);

  ASSERT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->data_offset(), 14176u);  // header ends at 14152, aligned up to 32
  EXPECT_EQ(f->file_size(), 1185376u);
  const auto* emb = f->tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (std::vector<uint64_t>{64, 512}));
  EXPECT_EQ(emb->type, DType::F32);
  EXPECT_EQ(emb->n_elements, 64u * 512u);
  EXPECT_EQ(emb->n_bytes, 64u * 512u * 4u);
  EXPECT_EQ(emb->offset, 0u);
  const auto* down = f->tensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->shape, (std::vector<uint64_t>{172, 64}));
  EXPECT_EQ(f->tensor("blk.4.attn_k.weight")->shape, (std::vector<uint64_t>{64, 32}));
  EXPECT_EQ(f->tensor("output_norm.weight")->shape, (std::vector<uint64_t>{64}));
  EXPECT_EQ(f->tensor("output.weight")->offset, 131328u);
  EXPECT_EQ(f->tensor("blk.5.attn_q.weight"), nullptr);
  // Data pointers are consecutive in the mapping: output.weight follows output_norm.weight.
  const auto* on = f->tensor("output_norm.weight");
  const auto* out = f->tensor("output.weight");
  EXPECT_EQ(static_cast<const uint8_t*>(out->data) - static_cast<const uint8_t*>(on->data), 256);
  // Norm weights of a trained model are finite and mostly positive.
  float w0;
  std::memcpy(&w0, on->data, 4);
  EXPECT_TRUE(std::isfinite(w0));

  // Typed getters refuse the wrong type.
  EXPECT_THROW(f->get_string("llama.block_count"), Error);
  EXPECT_THROW(f->get_int("general.architecture"), Error);
  EXPECT_THROW(f->get_bool("llama.block_count"), Error);
  EXPECT_THROW(f->get_string_array("tokenizer.ggml.scores"), Error);
  EXPECT_THROW(f->get_int_array("tokenizer.ggml.tokens"), Error);
  EXPECT_THROW(f->get_float_array("tokenizer.ggml.token_type"), Error);
  EXPECT_EQ(f->get_float("llama.block_count"), 5.0);  // integers widen to float
  try {
    f->get_int("general.architecture");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("general.architecture"), std::string::npos) << e.what();
  }
}

struct VocabCase {
  const char* file;
  const char* model;
  size_t n_tokens;
  size_t n_merges;  // 0: no merges key
};

class GgufVocab : public ::testing::TestWithParam<VocabCase> {};

TEST_P(GgufVocab, Opens) {
  const auto& c = GetParam();
  auto f = File::open(kShared + "/vocab/" + c.file);
  EXPECT_EQ(f->tensors().size(), 0u);
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), c.model);
  const auto* toks = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_NE(toks, nullptr);
  EXPECT_EQ(toks->size(), c.n_tokens);
  const auto* types = f->get_int_array("tokenizer.ggml.token_type");
  ASSERT_NE(types, nullptr);
  EXPECT_EQ(types->size(), c.n_tokens);
  const auto* merges = f->get_string_array("tokenizer.ggml.merges");
  if (c.n_merges) {
    ASSERT_NE(merges, nullptr);
    EXPECT_EQ(merges->size(), c.n_merges);
  } else {
    EXPECT_EQ(merges, nullptr);
  }
  EXPECT_TRUE(f->get_int("tokenizer.ggml.bos_token_id").has_value());
}

INSTANTIATE_TEST_SUITE_P(All, GgufVocab,
                         ::testing::Values(VocabCase{"ggml-vocab-gpt-2.gguf", "gpt2", 50257, 50000},
                                           VocabCase{"ggml-vocab-llama-bpe.gguf", "gpt2", 128256, 280147},
                                           VocabCase{"ggml-vocab-llama-spm.gguf", "llama", 32000, 0},
                                           VocabCase{"ggml-vocab-qwen2.gguf", "gpt2", 151936, 151387}));

TEST(GgufReal, SpmVocabBools) {
  auto f = File::open(kShared + "/vocab/ggml-vocab-llama-spm.gguf");
  EXPECT_EQ(f->get_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(f->get_bool("tokenizer.ggml.add_eos_token"), false);
}

TEST(GgufOpen, MissingFileAndDirectory) {
  try {
    File::open("/nonexistent/dir/model.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/model.gguf"), std::string::npos);
  }
  EXPECT_THROW(File::open(kShared + "/models"), Error);
  // Not a GGUF at all (llama2.c checkpoint).
  try {
    File::open(kShared + "/models/stories260K.bin");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("magic"), std::string::npos) << e.what();
  }
}
