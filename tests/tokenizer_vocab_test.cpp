// Tokenizer vs llama.cpp's reference vectors (shared/vocab/ggml-vocab-*.gguf + .inp/.out, and the other
// BPE vocabs in llama.cpp's source tree, models/), plus GGUF loading, special tokens, pre-tokenizer splits
// and loader errors.
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "shared_files.h"
#include "tokenizer/tokenizer.h"

namespace kvpack {
namespace {

using test::read_all;
using test::shared_path;

std::string escaped(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '\n') o += "\\n";
    else if (c == '\t') o += "\\t";
    else if (c == '\r') o += "\\r";
    else if (c == '"') o += "\\\"";
    else o.push_back(static_cast<char>(c));
  }
  return o + "\"";
}

std::string ids_str(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s.push_back(' ');
    s.append(std::to_string(v[i]));
  }
  return s + "]";
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// .inp: every input is followed by "\n__ggml_vocab_test__\n" (llama.cpp's test-tokenizer-0 writes
// `text + "\n__ggml_vocab_test__\n"` per test), so the newline before the marker is not part of the
// input, inputs may themselves be empty or consist of newlines, and nothing follows the last marker.
// .out: one line per input, each id preceded by a space (an empty input gives an empty line).
std::vector<Case> load_cases(const std::string& base) {
  const std::string inp = read_all(base + ".inp");
  const std::string out = read_all(base + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<Case> cases;
  size_t pos = 0;
  while (pos < inp.size()) {
    const size_t k = inp.find(sep, pos);
    if (k == std::string::npos) throw std::runtime_error(base + ".inp: trailing data after the last marker");
    cases.push_back({inp.substr(pos, k - pos), {}});
    pos = k + sep.size();
  }
  std::vector<std::string> lines;
  std::string line;
  std::istringstream os(out);
  while (std::getline(os, line)) lines.push_back(line);
  if (lines.size() != cases.size())
    throw std::runtime_error(base + ": " + std::to_string(cases.size()) + " inputs but " +
                             std::to_string(lines.size()) + " output lines");
  for (size_t i = 0; i < cases.size(); ++i) {
    std::istringstream ls(lines[i]);
    int64_t id;
    while (ls >> id) cases[i].ids.push_back(static_cast<int32_t>(id));
  }
  return cases;
}

// Loaded once per test binary (tokenizers are immutable and cheap to copy).
Tokenizer load_vocab_file(const std::string& path) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(path);
  if (it == cache.end()) {
    auto f = gguf::File::open(path);
    it = cache.emplace(path, Tokenizer::from_gguf(*f)).first;
  }
  return it->second;
}

Tokenizer load_vocab(const std::string& name) {
  return load_vocab_file(shared_path("vocab/ggml-vocab-" + name + ".gguf"));
}

// Tokenizes every input without BOS and compares with the reference ids; checks the round trip.
// `path` is the .gguf; its vectors are next to it.
void check_vectors_at(const std::string& path, const std::string& name) {
  const Tokenizer tok = load_vocab_file(path);
  const auto cases = load_cases(path);
  ASSERT_GT(cases.size(), 40u);
  size_t pass = 0, roundtrip = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::vector<int32_t> got = tok.encode(c.text, false);
    if (got == c.ids) {
      ++pass;
    } else {
      ADD_FAILURE() << name << " input #" << i << " " << escaped(c.text) << "\n  expected " << ids_str(c.ids)
                    << "\n  got      " << ids_str(got);
    }
    // decode(encode(x)) == x for every vector: both tokenizers are lossless on valid UTF-8 (byte
    // fallback for SPM, byte-level BPE), and SPM's space prefix is removed again by decode's leading-space
    // rule. (llama.cpp's own round-trip tests, test-tokenizer-1-*, only skip unpaired surrogate /
    // out-of-range code points, which cannot occur in these UTF-8 inputs.)
    const std::string back = tok.decode(got);
    if (back == c.text) ++roundtrip;
    else ADD_FAILURE() << name << " round trip #" << i << ": " << escaped(c.text) << " -> " << escaped(back);
    // with BOS: the BOS piece is empty and the SPM leading-space rule applies after it
    if (tok.bos() >= 0) {
      const auto with_bos = tok.encode(c.text, true);
      ASSERT_FALSE(with_bos.empty());
      EXPECT_EQ(with_bos[0], tok.bos());
      EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()), got);
      EXPECT_EQ(tok.decode(with_bos), c.text) << name << " #" << i;
    }
  }
  std::printf("[ %s ] %zu/%zu vectors match, %zu/%zu round trips\n", name.c_str(), pass, cases.size(), roundtrip,
              cases.size());
  EXPECT_EQ(pass, cases.size());
}

void check_vectors(const std::string& name) {
  check_vectors_at(shared_path("vocab/ggml-vocab-" + name + ".gguf"), name);
}

// llama.cpp's source tree: KVPACK_LLAMA_SRC, else the copy scripts/peer/build_llama_tools.sh unpacks.
std::string llama_models_dir() {
  const char* env = std::getenv("KVPACK_LLAMA_SRC");
  const std::string root = (env && *env) ? env : KVPACK_SOURCE_DIR "/build-llama/llama.cpp";
  return root + "/models";
}

std::string llama_vocab_path(const std::string& name) { return llama_models_dir() + "/ggml-vocab-" + name + ".gguf"; }

// The vectors of a vocab that only llama.cpp's source tree has. A missing tree skips; a tree without
// this vocab fails (the vocab is one llama.cpp has shipped for years).
#define CHECK_LLAMA_VECTORS(name)                                                                          \
  do {                                                                                                       \
    if (!std::filesystem::is_directory(llama_models_dir()))                                                 \
      GTEST_SKIP() << "no llama.cpp source tree at " << llama_models_dir()                                   \
                   << " (run scripts/peer/build_llama_tools.sh, or set KVPACK_LLAMA_SRC)";                   \
    ASSERT_TRUE(std::filesystem::exists(llama_vocab_path(name))) << llama_vocab_path(name);                  \
    check_vectors_at(llama_vocab_path(name), name);                                                          \
  } while (0)

TEST(TokenizerVocab, LlamaSpmVectors) { check_vectors("llama-spm"); }
TEST(TokenizerVocab, LlamaBpeVectors) { check_vectors("llama-bpe"); }
TEST(TokenizerVocab, Gpt2Vectors) { check_vectors("gpt-2"); }
TEST(TokenizerVocab, Qwen2Vectors) { check_vectors("qwen2"); }

// The other BPE pre-tokenizers, on the vocabs in llama.cpp's source tree.
TEST(TokenizerVocab, MptVectors) { CHECK_LLAMA_VECTORS("mpt"); }
TEST(TokenizerVocab, Qwen35Vectors) { CHECK_LLAMA_VECTORS("qwen35"); }
TEST(TokenizerVocab, FalconVectors) { CHECK_LLAMA_VECTORS("falcon"); }
TEST(TokenizerVocab, StarcoderVectors) { CHECK_LLAMA_VECTORS("starcoder"); }
TEST(TokenizerVocab, RefactVectors) { CHECK_LLAMA_VECTORS("refact"); }
TEST(TokenizerVocab, CommandRVectors) { CHECK_LLAMA_VECTORS("command-r"); }
TEST(TokenizerVocab, DeepseekLlmVectors) { CHECK_LLAMA_VECTORS("deepseek-llm"); }
TEST(TokenizerVocab, DeepseekCoderVectors) { CHECK_LLAMA_VECTORS("deepseek-coder"); }

TEST(TokenizerVocab, InputFileFormat) {
  const auto cases = load_cases(shared_path("vocab/ggml-vocab-llama-spm.gguf"));
  ASSERT_EQ(cases.size(), 46u);
  EXPECT_EQ(cases[0].text, "ied 4 \xC2\xBD months");
  EXPECT_EQ(cases[2].text, "");
  EXPECT_TRUE(cases[2].ids.empty());
  EXPECT_EQ(cases[7].text, "\n");
  EXPECT_EQ(cases[9].text, "\n\n\n");
  EXPECT_EQ(cases[11].text, "Hello world");
  EXPECT_EQ(cases[11].ids, (std::vector<int32_t>{15043, 3186}));
}

TEST(TokenizerVocab, Properties) {
  {
    const Tokenizer t = load_vocab("llama-spm");
    EXPECT_EQ(t.kind(), VocabData::Kind::SPM);
    EXPECT_EQ(t.n_vocab(), 32000);
    EXPECT_EQ(t.bos(), 1);
    EXPECT_EQ(t.eos(), 2);
    EXPECT_EQ(t.unk(), 0);
    EXPECT_TRUE(t.add_bos_default());
    EXPECT_TRUE(t.is_control(1));
    EXPECT_TRUE(t.is_eog(2));
    EXPECT_FALSE(t.is_eog(1));
    EXPECT_EQ(t.piece(1), "");            // control
    EXPECT_EQ(t.piece(0), "");            // unknown
    EXPECT_EQ(t.piece(13), "\n");         // <0x0A>
    EXPECT_EQ(t.piece(15043), " Hello");  // ▁Hello
    EXPECT_EQ(t.piece(-1), "");
    EXPECT_EQ(t.piece(32000), "");
    const std::vector<int32_t> hello{15043, 3186};
    EXPECT_EQ(t.decode(hello), "Hello world");
    const std::vector<int32_t> hello_bos{1, 15043, 3186};
    EXPECT_EQ(t.decode(hello_bos), "Hello world");
    EXPECT_EQ(t.piece_after(1, 15043), "Hello");
    EXPECT_EQ(t.piece_after(3186, 15043), " Hello");
    // the leading space is dropped only at the start / after BOS, not in the middle
    const std::vector<int32_t> two{15043, 15043};
    EXPECT_EQ(t.decode(two), "Hello Hello");
    // byte fallback: U+0F00 is not in the vocab -> 3 byte tokens (after the "▁" token)
    const auto ids = t.encode("\xE0\xBC\x80", false);
    ASSERT_EQ(ids.size(), 4u);
    EXPECT_EQ(ids[1], 3 + 0xE0);
    EXPECT_EQ(ids[2], 3 + 0xBC);
    EXPECT_EQ(ids[3], 3 + 0x80);
    EXPECT_EQ(t.decode(ids), "\xE0\xBC\x80");
  }
  {
    const Tokenizer t = load_vocab("llama-bpe");
    EXPECT_EQ(t.kind(), VocabData::Kind::BPE);
    EXPECT_EQ(t.pre(), "llama-bpe");
    EXPECT_EQ(t.n_vocab(), 128256);
    EXPECT_EQ(t.bos(), 128000);
    EXPECT_EQ(t.eos(), 128001);
    EXPECT_TRUE(t.add_bos_default());  // llama.cpp default for llama3 pre-tokenizers
    EXPECT_TRUE(t.is_eog(128001));
    EXPECT_TRUE(t.is_eog(128009));  // <|eot_id|>
    EXPECT_FALSE(t.is_eog(128006));
    EXPECT_TRUE(t.is_control(128006));
    EXPECT_EQ(t.piece(128009), "");
    const std::vector<int32_t> hello{9906, 1917};
    EXPECT_EQ(t.decode(hello), "Hello world");
  }
  {
    const Tokenizer t = load_vocab("gpt-2");
    EXPECT_EQ(t.bos(), 50256);
    EXPECT_EQ(t.eos(), 50256);
    EXPECT_FALSE(t.add_bos_default());
    EXPECT_TRUE(t.is_eog(50256));
    EXPECT_EQ(t.find_token("\xC4\xA0the"), 262);  // "Ġthe"
    EXPECT_EQ(t.piece(262), " the");
  }
  {
    const Tokenizer t = load_vocab("qwen2");
    EXPECT_EQ(t.pre(), "qwen2");
    EXPECT_FALSE(t.add_bos_default());
    EXPECT_EQ(t.eos(), 151643);
    EXPECT_EQ(t.pad(), 151643);
    EXPECT_TRUE(t.is_eog(151643));  // <|endoftext|>
    EXPECT_TRUE(t.is_eog(151645));  // <|im_end|>
    EXPECT_FALSE(t.is_eog(151644));
    EXPECT_TRUE(t.is_control(151644));
    EXPECT_EQ(t.token_type(151646), Tokenizer::kTypeUserDefined);
    EXPECT_EQ(t.piece(151646), "[PAD151646]");  // user-defined tokens render as their text
  }
}

TEST(TokenizerVocab, SpecialTokens) {
  const Tokenizer t = load_vocab("qwen2");
  const std::string chat = "<|im_start|>user\nHi<|im_end|>\n";
  const auto plain = t.encode(chat, false);
  for (int32_t id : plain) {
    EXPECT_NE(id, 151644);
    EXPECT_NE(id, 151645);
  }
  EXPECT_EQ(t.decode(plain), chat);  // control-token text is ordinary text unless parse_special
  const auto parsed = t.encode(chat, false, /*parse_special=*/true);
  ASSERT_GE(parsed.size(), 4u);
  EXPECT_EQ(parsed.front(), 151644);
  EXPECT_EQ(parsed[parsed.size() - 2], 151645);
  EXPECT_EQ(t.decode(parsed), "user\nHi\n");  // control pieces are empty
  std::vector<int32_t> inner(parsed.begin() + 1, parsed.end() - 2);
  EXPECT_EQ(inner, t.encode("user\nHi", false));
  // user-defined tokens are matched even without parse_special
  const auto pad = t.encode("a[PAD151646]b", false);
  ASSERT_EQ(pad.size(), 3u);
  EXPECT_EQ(pad[1], 151646);
  EXPECT_EQ(t.decode(pad), "a[PAD151646]b");
  // SPM: a space prefix is added to text that follows a special token
  const Tokenizer s = load_vocab("llama-spm");
  const auto sp = s.encode("Hello</s>Hello", false, true);
  EXPECT_EQ(sp, (std::vector<int32_t>{15043, 2, 15043}));
}

// Long texts take the 4-gram filter over special tokens (tokenizer_encode.cpp): every special and
// user-defined token placed anywhere in a long text must still be found, exactly where it is, and a text
// without them must encode as its plain pieces do.
TEST(TokenizerVocab, SpecialTokensInLongTexts) {
  const Tokenizer t = load_vocab("qwen2");
  const std::string a(200, 'x'), filler = " the quick brown fox [PAD jumps] over <|im_st the lazy dog 151646]";
  std::string b;
  while (b.size() < 300) b += filler;
  const auto ea = t.encode(a, false), eb = t.encode(b, false);
  for (int32_t id : {151644, 151645, 151646, 151700, 151900}) {
    const std::string tok = t.token_text(id);
    const auto got = t.encode(a + tok + b, false, /*parse_special=*/true);
    std::vector<int32_t> want = ea;
    want.push_back(id);
    want.insert(want.end(), eb.begin(), eb.end());
    EXPECT_EQ(got, want) << tok;
    // Twice, at both ends of a long text.
    const auto ends = t.encode(tok + b + tok, false, true);
    ASSERT_GE(ends.size(), 2u);
    EXPECT_EQ(ends.front(), id);
    EXPECT_EQ(ends.back(), id);
  }
  // Near misses of the tokens' last four bytes are text.
  EXPECT_EQ(t.decode(t.encode(b, false, true)), b);
  EXPECT_EQ(t.encode(b, false, true), eb);
}

TEST(TokenizerVocab, PreTokenizerSplits) {
  using V = std::vector<std::string>;
  using tokenizer_detail::pretokenize;
  EXPECT_EQ(pretokenize("gpt-2", "Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pretokenize("gpt-2", "a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(pretokenize("gpt-2", "a  "), (V{"a", "  "}));
  EXPECT_EQ(pretokenize("gpt-2", "I'll 12345"), (V{"I", "'ll", " 12345"}));
  EXPECT_EQ(pretokenize("gpt-2", "we'RE"), (V{"we", "'", "RE"}));  // case-sensitive contractions
  EXPECT_EQ(pretokenize("gpt-2", "\t\tb"), (V{"\t", "\t", "b"}));
  EXPECT_EQ(pretokenize("llama-bpe", "we'RE 12345"), (V{"we", "'RE", " ", "123", "45"}));
  EXPECT_EQ(pretokenize("llama-bpe", "Hello\n\n  world!!\n"), (V{"Hello", "\n\n", " ", " world", "!!\n"}));
  EXPECT_EQ(pretokenize("llama-bpe", "a \n b"), (V{"a", " \n", " b"}));
  EXPECT_EQ(pretokenize("qwen2", "x=123"), (V{"x", "=", "1", "2", "3"}));
  EXPECT_EQ(pretokenize("qwen2", "\xC3\x84pfel"), (V{"\xC3\x84pfel"}));
  EXPECT_EQ(pretokenize("default", "a+b 1234"), (V{"a", "+", "b", " ", "123", "4"}));
  // invalid UTF-8 bytes survive as their own characters
  EXPECT_EQ(pretokenize("llama-bpe", std::string("a\xFF" "b")), (V{"a", "\xFF" "b"}));
  EXPECT_THROW(pretokenize("nope", "x"), std::runtime_error);
}

// The regex-chain pre-tokenizers: each pattern re-splits every piece the previous one left, matches and gaps
// alike (expected pieces agree with std::regex run the way llama.cpp runs these patterns).
TEST(TokenizerVocab, ChainPreTokenizerSplits) {
  using V = std::vector<std::string>;
  using tokenizer_detail::pretokenize;
  // falcon: '`' joins the punctuation run; no \p{N}+ pass, so a number is cut only into ASCII triples
  EXPECT_EQ(pretokenize("falcon", "x`=y 12345"), (V{"x", "`=", "y", " ", "123", "45"}));
  EXPECT_EQ(pretokenize("default", "x`=y"), (V{"x", "`", "=", "y"}));
  // starcoder family: every digit alone, before the GPT-2 pattern
  EXPECT_EQ(pretokenize("starcoder", "x12 345"), (V{"x", "1", "2", " ", "3", "4", "5"}));
  EXPECT_EQ(pretokenize("command-r", "we'll 7a"), (V{"we", "'ll", " ", "7", "a"}));
  // deepseek-llm: the punctuation pass after the letter pass has ASCII letters in its range, so it re-splits a
  // word that mixes ASCII and other letters ("Ωmega", "héllo"); trailing whitespace; CJK runs; \p{N}+
  EXPECT_EQ(pretokenize("deepseek-llm", "\xCE\xA9mega \xCE\xB1\xCE\xB2"), (V{"\xCE\xA9", "mega", " \xCE\xB1\xCE\xB2"}));
  EXPECT_EQ(pretokenize("deepseek-llm", "  h\xC3\xA9llo, \xE4\xB8\x96\xE7\x95\x8C" "123\xEF\xBC\x81"),
            (V{" ", " h", "\xC3\xA9", "llo", ",", " ", "\xE4\xB8\x96\xE7\x95\x8C", "123", "\xEF\xBC\x81"}));
  EXPECT_EQ(pretokenize("deepseek-llm", "Hello world\n\n  "), (V{"Hello", " world", "\n", "\n", "  "}));
  // deepseek-coder: \p{L} runs, \p{P} runs, single digits
  EXPECT_EQ(pretokenize("deepseek-coder", "  h\xC3\xA9llo, \xE4\xB8\x96\xE7\x95\x8C" "123\xEF\xBC\x81"),
            (V{" ", " h\xC3\xA9llo", ",", " ", "\xE4\xB8\x96\xE7\x95\x8C", "1", "2", "3", "\xEF\xBC\x81"}));
  EXPECT_EQ(pretokenize("deepseek-coder", "x=1"), (V{"x", "=", "1"}));
  // deepseek-v3 (no llama.cpp vectors): digit triples, CJK + kana runs, ASCII punctuation glued to a word
  EXPECT_EQ(pretokenize("deepseek-v3", "Hello world's 12345"), (V{"Hello", " world", "'s", " ", "123", "45"}));
  EXPECT_EQ(pretokenize("deepseek-v3", ".NET +x"), (V{".NET", " +", "x"}));
  EXPECT_EQ(pretokenize("deepseek-v3", "a,\n\n b"), (V{"a", ",\n\n", " b"}));
  EXPECT_EQ(pretokenize("deepseek-v3", "\xE4\xB8\x96\xE7\x95\x8C\xE3\x81\xB2\xE3\x82\xAB 1234"),
            (V{"\xE4\xB8\x96\xE7\x95\x8C\xE3\x81\xB2\xE3\x82\xAB", " ", "123", "4"}));
  EXPECT_EQ(pretokenize("hunyuan-dense", " \xCC\x81x"), (V{" \xCC\x81x"}));
  // qwen35: combining marks stay in the letter run (qwen2 splits them off)
  EXPECT_EQ(pretokenize("qwen35", "e\xCC\x81t"), (V{"e\xCC\x81t"}));
  EXPECT_EQ(pretokenize("qwen2", "e\xCC\x81t"), (V{"e", "\xCC\x81t"}));
  // tekken / gpt-4o (no llama.cpp vectors): only ASCII letters have a case, so "éA" splits and "aéB" too
  EXPECT_EQ(pretokenize("tekken", "HeLLo wORLD's 12 \xC3\xA9" "A a\xC3\xA9" "B"),
            (V{"He", "LLo", " w", "ORLD", "'s", " ", "1", "2", " \xC3\xA9", "A", " a\xC3\xA9", "B"}));
  EXPECT_EQ(pretokenize("tekken", "x/\n/ ab"), (V{"x", "/\n/", " ab"}));
  EXPECT_EQ(pretokenize("llama4", "HeLLo wORLD's 1234 IT'S"), (V{"He", "LLo", " w", "ORLD's", " ", "123", "4", " IT'S"}));
  // bloom family: runs up to whitespace and . , ! ? ( | ) and a few non-ASCII stops; viking splits digits after
  EXPECT_EQ(pretokenize("bloom", "Hello, world! (a|b) x\xE2\x80\xA6y  z"),
            (V{"Hello", ",", " world", "! (", "a", "|", "b", ")", " x", "\xE2\x80\xA6", "y", " ", " z"}));
  EXPECT_EQ(pretokenize("viking", "ab12 cd"), (V{"ab", "1", "2", " cd"}));
  // pieces cover the text, invalid bytes included
  for (const char* pre : {"falcon", "starcoder", "deepseek-llm", "deepseek-coder", "deepseek-v3", "qwen35", "tekken",
                          "gpt-4o", "bloom", "viking"}) {
    const std::string s = std::string("a\xFF\xE4\xB8 1\n\xC3");
    std::string joined;
    for (const auto& p : pretokenize(pre, s)) {
      EXPECT_FALSE(p.empty()) << pre;
      joined += p;
    }
    EXPECT_EQ(joined, s) << pre;
  }
  // names llama.cpp knows whose patterns kvpack does not implement are refused like unknown ones
  for (const char* pre : {"chatglm-bpe", "roberta-bpe", "kimi-k2", "jais-2", "seed-coder", "granite-embed-multi-97m"})
    EXPECT_THROW(pretokenize(pre, "x"), std::runtime_error) << pre;
}

TEST(TokenizerVocab, InvalidUtf8RoundTrips) {
  for (const char* name : {"llama-spm", "llama-bpe", "gpt-2", "qwen2"}) {
    const Tokenizer t = load_vocab(name);
    const std::string s = std::string("ok \xFF\xC3 \x80x \xE2\x82");
    EXPECT_EQ(t.decode(t.encode(s, false)), s) << name;
  }
}

// Which bytes a byte-level BPE vocab has an ordinary token for (GPT-2's byte-to-unicode mapping: the
// printable Latin-1 bytes stand for themselves, the others for U+0100 + their rank).
std::array<bool, 256> bpe_bytes_with_tokens(const Tokenizer& t) {
  std::array<bool, 256> ok{};
  uint32_t next = 0x100;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const int32_t id = t.find_token(tokenizer_detail::cpt_to_utf8(self ? b : next++));
    ok[b] = id >= 0 && t.token_type(id) == Tokenizer::kTypeNormal;
  }
  return ok;
}

// Random byte strings and random code-point strings round-trip through `t`. With `bytes`, only bytes /
// characters whose every byte has a token are drawn.
void random_round_trips(const Tokenizer& t, const std::string& name, const std::array<bool, 256>* bytes = nullptr) {
  std::mt19937 rng(1234);
  auto rnd = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
  const char* alphabet[] = {" ", "  ", "\n", "\t", "\r\n", "'s", "'LL", "a", "Z", "7", "123", "!", "\xC3\xA9",
                            "\xE2\x96\x81", "\xF0\x9F\x98\x81", "\xE4\xB8\xAD", "\xE2\x80\x8D", "<|im_end|>",
                            "\xCC\x81", "\xE3\x80\x80", "\xEF\xBC\x81", "\xE3\x81\x82", "`"};
  for (int iter = 0; iter < 150; ++iter) {
    std::string s;
    const uint32_t len = rnd(40);
    const uint32_t mode = iter % 3;
    for (uint32_t k = 0; k < len; ++k) {
      if (mode == 0) {
        uint32_t b = rnd(256);
        while (bytes && !(*bytes)[b]) b = rnd(256);
        s.push_back(static_cast<char>(b));  // arbitrary bytes (mostly invalid UTF-8)
      } else if (mode == 1) {
        uint32_t c = rnd(4) == 0 ? rnd(0x110000) : rnd(0x800);
        if (c >= 0xD800 && c <= 0xDFFF) c = 'x';
        const std::string u = tokenizer_detail::cpt_to_utf8(c);
        bool ok = true;
        for (unsigned char b : u) ok = ok && (!bytes || (*bytes)[b]);
        if (ok) s += u;
        else s.push_back('x');
      } else {
        s += alphabet[rnd(sizeof(alphabet) / sizeof(alphabet[0]))];
      }
    }
    // SPM escapes ' ' as U+2581, so a literal U+2581 in the input decodes as ' ' (as in sentencepiece and
    // llama.cpp); that is the one input SPM cannot round-trip.
    if (t.kind() == VocabData::Kind::SPM) {
      std::string r;
      for (size_t k = 0; k < s.size(); ++k) {
        if (s.compare(k, 3, "\xE2\x96\x81") == 0) {
          r.push_back('_');
          k += 2;
        } else {
          r.push_back(s[k]);
        }
      }
      s.swap(r);
    }
    const auto ids = t.encode(s, false);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t.n_vocab());
    ASSERT_EQ(t.decode(ids), s) << name << " iter " << iter;
    ASSERT_EQ(t.decode(t.encode(s, true)), s) << name << " iter " << iter;
  }
}

TEST(TokenizerVocab, RandomRoundTrips) {
  for (const char* name : {"llama-spm", "llama-bpe", "gpt-2", "qwen2"}) random_round_trips(load_vocab(name), name);
}

TEST(TokenizerVocab, LlamaSrcRandomRoundTrips) {
  if (!std::filesystem::is_directory(llama_models_dir()))
    GTEST_SKIP() << "no llama.cpp source tree at " << llama_models_dir()
                 << " (run scripts/peer/build_llama_tools.sh, or set KVPACK_LLAMA_SRC)";
  // Only bytes the vocab has tokens for: several of these vocabs lack a token for bytes that rarely
  // or never occur in UTF-8 (e.g. falcon 0xF2, starcoder 0xF1; deepseek's 0xFF token is an added token whose
  // text is "\xC3\xBF"), and text with such a byte cannot round-trip, in llama.cpp either.
  for (const char* name : {"falcon", "starcoder", "refact", "command-r", "deepseek-llm", "deepseek-coder", "qwen35"}) {
    const Tokenizer t = load_vocab_file(llama_vocab_path(name));
    const auto bytes = bpe_bytes_with_tokens(t);
    std::string missing;
    for (uint32_t b = 0; b < 256; ++b) {
      if (bytes[b]) continue;
      missing.push_back(' ');
      missing += std::to_string(b);
    }
    std::printf("[ %s ] bytes without a token:%s\n", name, missing.empty() ? " none" : missing.c_str());
    random_round_trips(t, name, &bytes);
  }
}

// --- loader errors -----------------------------------------------------------------------------------

struct MemGguf {
  std::vector<uint8_t> bytes;
  std::unique_ptr<gguf::File> file;
  explicit MemGguf(const gguf::Writer& w) : bytes(w.to_bytes()), file(gguf::File::parse(bytes.data(), bytes.size(), "mem.gguf")) {}
};

gguf::Writer base_writer(const std::string& model, const std::string& pre) {
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  if (!model.empty()) w.set_string("tokenizer.ggml.model", model);
  if (!pre.empty()) w.set_string("tokenizer.ggml.pre", pre);
  w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "ab"});
  return w;
}

void expect_error_mentions(const gguf::Writer& w, const std::string& what) {
  MemGguf g(w);
  try {
    (void)Tokenizer::from_gguf(*g.file);
    ADD_FAILURE() << "no error, expected one mentioning '" << what << "'";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(TokenizerVocab, GgufErrors) {
  expect_error_mentions(base_writer("", ""), "tokenizer.ggml.model");
  expect_error_mentions(base_writer("bert", ""), "'bert'");
  {
    auto w = base_writer("gpt2", "made-up-pre");
    w.set_string_array("tokenizer.ggml.merges", {"a b"});
    expect_error_mentions(w, "'made-up-pre'");
  }
  {
    auto w = base_writer("gpt2", "kimi-k2");  // a llama.cpp pre-tokenizer kvpack does not have
    w.set_string_array("tokenizer.ggml.merges", {"a b"});
    expect_error_mentions(w, "unsupported BPE pre-tokenizer 'kimi-k2'");
  }
  expect_error_mentions(base_writer("gpt2", "gpt-2"), "tokenizer.ggml.merges");
  {
    gguf::Writer w;
    w.set_string("tokenizer.ggml.model", "llama");
    expect_error_mentions(w, "tokenizer.ggml.tokens");
  }
  {
    auto w = base_writer("llama", "");
    w.set_f32_array("tokenizer.ggml.scores", {0.0f});
    expect_error_mentions(w, "tokenizer.ggml.scores");
  }
  {
    auto w = base_writer("llama", "");
    w.set_i32_array("tokenizer.ggml.token_type", {1, 1});
    expect_error_mentions(w, "tokenizer.ggml.token_type");
  }
}

TEST(TokenizerVocab, MinimalGgufVocabs) {
  {
    // tiny SPM vocab: out-of-range BOS id (0xFFFFFFFF) is treated as "none"
    gguf::Writer w = base_writer("llama", "");
    w.set_f32_array("tokenizer.ggml.scores", {0.f, 0.f, 1.f});
    w.set_u32("tokenizer.ggml.bos_token_id", 0xFFFFFFFFu);
    w.set_bool("tokenizer.ggml.add_space_prefix", false);
    MemGguf g(w);
    const Tokenizer t = Tokenizer::from_gguf(*g.file);
    EXPECT_EQ(t.bos(), -1);
    EXPECT_FALSE(t.add_bos_default());
    EXPECT_EQ(t.encode("abab", true), (std::vector<int32_t>{2, 2}));
    EXPECT_EQ(t.decode(std::vector<int32_t>{2, 0}), "aba");
  }
  {
    // tiny BPE vocab
    gguf::Writer w = base_writer("gpt2", "gpt-2");
    w.set_string_array("tokenizer.ggml.merges", {"a b"});
    MemGguf g(w);
    const Tokenizer t = Tokenizer::from_gguf(*g.file);
    EXPECT_EQ(t.encode("abab", false), (std::vector<int32_t>{2, 2}));  // one pre-token, merged pairwise
    EXPECT_EQ(t.encode("ba", false), (std::vector<int32_t>{1, 0}));
  }
}

}  // namespace
}  // namespace kvpack
