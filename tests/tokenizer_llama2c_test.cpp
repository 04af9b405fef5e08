// llama2.c tokenizer.bin (tok512.bin) vs an independent transcription of run.c's encode/decode, vs the
// same vocabulary in stories260K.gguf; BOS handling, byte fallback, decode rules, malformed files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "shared_files.h"
#include "tokenizer/tokenizer.h"

namespace kvpack {
namespace {

using test::read_all;
using test::shared_path;

// Literal transcription of llama2.c run.c's Tokenizer (build_tokenizer / encode / decode), used as the
// oracle. Quadratic merging, no cleverness.
struct RunC {
  std::vector<std::string> vocab;
  std::vector<float> scores;
  std::map<std::string, int> sorted;  // str_lookup

  explicit RunC(const std::string& file, int vocab_size) {
    size_t pos = 4;  // skip max_token_length
    for (int i = 0; i < vocab_size; ++i) {
      float s;
      int32_t len;
      std::memcpy(&s, file.data() + pos, 4);
      std::memcpy(&len, file.data() + pos + 4, 4);
      pos += 8;
      vocab.push_back(file.substr(pos, static_cast<size_t>(len)));
      scores.push_back(s);
      pos += static_cast<size_t>(len);
    }
    for (int i = 0; i < vocab_size; ++i) sorted.emplace(vocab[static_cast<size_t>(i)], i);
  }
  int lookup(const std::string& s) const {
    auto it = sorted.find(s);
    return it == sorted.end() ? -1 : it->second;
  }
  std::vector<int> encode(const std::string& text, bool bos, bool eos) const {
    std::vector<int> t;
    if (bos) t.push_back(1);
    if (!text.empty()) t.push_back(lookup(" "));
    std::string buf;
    for (size_t c = 0; c < text.size(); ++c) {
      if ((static_cast<unsigned char>(text[c]) & 0xC0) != 0x80) buf.clear();
      buf.push_back(text[c]);
      if (c + 1 < text.size() && (static_cast<unsigned char>(text[c + 1]) & 0xC0) == 0x80 && buf.size() < 4)
        continue;
      const int id = lookup(buf);
      if (id != -1) {
        t.push_back(id);
      } else {
        for (unsigned char b : buf) t.push_back(b + 3);
      }
      buf.clear();
    }
    while (true) {
      float best_score = -1e10f;
      int best_id = -1, best_idx = -1;
      for (size_t i = 0; i + 1 < t.size(); ++i) {
        const int id = lookup(vocab[static_cast<size_t>(t[i])] + vocab[static_cast<size_t>(t[i + 1])]);
        if (id != -1 && scores[static_cast<size_t>(id)] > best_score) {
          best_score = scores[static_cast<size_t>(id)];
          best_id = id;
          best_idx = static_cast<int>(i);
        }
      }
      if (best_idx == -1) break;
      t[static_cast<size_t>(best_idx)] = best_id;
      t.erase(t.begin() + best_idx + 1);
    }
    if (eos) t.push_back(2);
    return t;
  }
  std::string decode(int prev, int token) const {
    std::string piece = vocab[static_cast<size_t>(token)];
    if (prev == 1 && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    unsigned int byte;
    char close;
    if (std::sscanf(piece.c_str(), "<0x%02X%c", &byte, &close) == 2 && close == '>') return std::string(1, char(byte));
    return piece;
  }
};

const std::string& tok512_bytes() {
  static const std::string b = read_all(shared_path("models/tok512.bin"));
  return b;
}

const Tokenizer& tok512() {
  static const Tokenizer t = Tokenizer::from_llama2c(shared_path("models/tok512.bin"), 512);
  return t;
}

const Tokenizer& stories_gguf() {
  static const Tokenizer t = [] {
    auto f = gguf::File::open(shared_path("models/stories260K.gguf"));
    return Tokenizer::from_gguf(*f);
  }();
  return t;
}

std::vector<std::string> sample_texts() {
  std::vector<std::string> v = {
      "",
      "a",
      " ",
      "Once upon a time",
      "Hello world",
      "  double  spaces  ",
      "Lily's mom said, \"Lily, let's go to the park.\"",
      "line one\nline two\n\n",
      "tabs\tand\r\nCRLF",
      "\xC3\xA9t\xC3\xA9 \xC3\xBC \xE2\x84\xA2 \xF0\x9F\x99\x82 \xE4\xB8\xAD\xE6\x96\x87",  // été ü ™ 🙂 中文
      "\xE2\x80\x8A",                                                                      // hair space (a token)
      "<0x41> <s> </s>",
      "1234567890 !?.,;:",
  };
  v.push_back(read_all(shared_path("models/stories260K.greedy.txt")));
  // a slice of the corpus, line by line
  const std::string corpus = read_all(shared_path("corpora/austen.txt"));
  size_t pos = 0;
  for (int lines = 0; lines < 300 && pos < corpus.size(); ++lines) {
    size_t e = corpus.find('\n', pos);
    if (e == std::string::npos) e = corpus.size();
    v.push_back(corpus.substr(pos, e - pos));
    pos = e + 1;
  }
  v.push_back(corpus.substr(100000, 3000));
  return v;
}

TEST(TokenizerLlama2c, LoadsTok512) {
  const Tokenizer& t = tok512();
  EXPECT_EQ(t.n_vocab(), 512);
  EXPECT_EQ(t.bos(), 1);
  EXPECT_EQ(t.eos(), 2);
  EXPECT_EQ(t.kind(), VocabData::Kind::SPM);
  EXPECT_TRUE(t.add_bos_default());
  EXPECT_TRUE(t.is_control(1));
  EXPECT_TRUE(t.is_eog(2));
  EXPECT_FALSE(t.is_eog(1));
  EXPECT_EQ(t.token_text(1), "\n<s>\n");
  EXPECT_EQ(t.piece(1), "");
  EXPECT_EQ(t.piece(2), "");
  EXPECT_EQ(t.piece(3 + 'A'), "A");  // <0x41>
  EXPECT_EQ(t.token_type(3 + 0x0A), Tokenizer::kTypeByte);
  EXPECT_EQ(t.piece(259), " t");
}

TEST(TokenizerLlama2c, EncodeMatchesRunC) {
  const RunC oracle(tok512_bytes(), 512);
  const Tokenizer& t = tok512();
  size_t n = 0;
  for (const std::string& s : sample_texts()) {
    for (bool bos : {false, true}) {
      const auto want = oracle.encode(s, bos, false);
      const auto got = t.encode(s, bos);
      ASSERT_EQ(std::vector<int32_t>(want.begin(), want.end()), got) << "text: " << s << " bos=" << bos;
      ++n;
    }
  }
  EXPECT_GT(n, 600u);
}

TEST(TokenizerLlama2c, DecodeMatchesRunC) {
  const RunC oracle(tok512_bytes(), 512);
  const Tokenizer& t = tok512();
  // per-token decode (run.c's decode(prev, token)) for every non-special token, after BOS and not
  for (int32_t tok = 3; tok < 512; ++tok) {
    EXPECT_EQ(t.piece_after(1, tok), oracle.decode(1, tok)) << tok;
    EXPECT_EQ(t.piece_after(300, tok), oracle.decode(300, tok)) << tok;
    EXPECT_EQ(t.piece(tok), oracle.decode(0, tok)) << tok;
  }
  // whole-sequence decode == concatenation of run.c's per-token decode after BOS
  for (const std::string& s : sample_texts()) {
    const auto ids = t.encode(s, true);
    std::string want;
    for (size_t i = 1; i < ids.size(); ++i) want += oracle.decode(ids[i - 1], ids[i]);
    EXPECT_EQ(t.decode(ids), want);
    EXPECT_EQ(t.decode(ids), s);  // and it round-trips
  }
}

TEST(TokenizerLlama2c, SameAsStoriesGguf) {
  const Tokenizer& a = tok512();
  const Tokenizer& b = stories_gguf();
  EXPECT_EQ(b.n_vocab(), 512);
  EXPECT_EQ(b.bos(), 1);
  EXPECT_EQ(b.eos(), 2);
  EXPECT_TRUE(b.add_bos_default());
  for (const std::string& s : sample_texts()) {
    EXPECT_EQ(a.encode(s, true), b.encode(s, true)) << s;
    EXPECT_EQ(a.encode(s, false), b.encode(s, false)) << s;
    EXPECT_EQ(b.decode(b.encode(s, true)), s);
  }
  for (int32_t tok = 3; tok < 512; ++tok) EXPECT_EQ(a.piece(tok), b.piece(tok)) << tok;
}

TEST(TokenizerLlama2c, BosAndDecodeRules) {
  for (const Tokenizer* t : {&tok512(), &stories_gguf()}) {
    EXPECT_EQ(t->encode("", true), (std::vector<int32_t>{1}));
    EXPECT_TRUE(t->encode("", false).empty());
    const auto once = t->encode("Once upon a time", true);
    ASSERT_GE(once.size(), 3u);
    EXPECT_EQ(once[0], 1);
    EXPECT_EQ(t->piece(once[1]).substr(0, 2), " O");  // the dummy prefix makes it " Once..."
    EXPECT_EQ(t->decode(once), "Once upon a time");   // leading space dropped after BOS
    const std::vector<int32_t> no_bos(once.begin() + 1, once.end());
    EXPECT_EQ(t->decode(no_bos), "Once upon a time");  // ... and at the very start
    EXPECT_EQ(t->piece_after(1, once[1])[0], 'O');
    EXPECT_EQ(t->piece_after(once[1], once[2])[0], ' ');
    // a BOS in the middle of a sequence starts a new document
    std::vector<int32_t> two = once;
    two.insert(two.end(), once.begin(), once.end());
    EXPECT_EQ(t->decode(two), "Once upon a timeOnce upon a time");
    // generated text as in the greedy reference: BOS followed by sampled tokens
    const std::string ref = read_all(shared_path("models/stories260K.greedy.txt"));
    const auto ids = t->encode(ref, true);
    EXPECT_EQ(t->decode(ids), ref);
    std::string streamed;
    for (size_t i = 1; i < ids.size(); ++i) streamed += t->piece_after(ids[i - 1], ids[i]);
    EXPECT_EQ(streamed, ref);
    EXPECT_EQ(streamed.substr(0, 4), "Once");
  }
}

TEST(TokenizerLlama2c, ByteFallback) {
  const Tokenizer& t = tok512();
  // U+1F642 is not in the vocab: 4 byte tokens (byte + 3), after the dummy-prefix " " token
  const auto ids = t.encode("\xF0\x9F\x99\x82", false);
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(ids[0], t.find_token(" "));
  EXPECT_EQ(ids[1], 0xF0 + 3);
  EXPECT_EQ(ids[2], 0x9F + 3);
  EXPECT_EQ(ids[3], 0x99 + 3);
  EXPECT_EQ(ids[4], 0x82 + 3);
  EXPECT_EQ(t.decode(ids), "\xF0\x9F\x99\x82");
  EXPECT_EQ(t.piece(0xF0 + 3), "\xF0");  // a partial UTF-8 sequence
  // newline is not a vocab token either
  const auto nl = t.encode("a\nb", false);
  EXPECT_NE(std::find(nl.begin(), nl.end(), 0x0A + 3), nl.end());
  // invalid UTF-8 survives
  const std::string bad = "x\xFF\x80y\xC3";
  EXPECT_EQ(t.decode(t.encode(bad, true)), bad);
}

// --- malformed files ---------------------------------------------------------------------------------

void expect_malformed(std::string_view data, int32_t vocab, const std::string& what) {
  try {
    (void)Tokenizer::from_llama2c_bytes(data, vocab, "tok.bin");
    ADD_FAILURE() << "no error for " << data.size() << " bytes, vocab " << vocab;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(TokenizerLlama2c, MalformedFiles) {
  const std::string& good = tok512_bytes();
  ASSERT_EQ(good.size(), 6227u);
  EXPECT_NO_THROW((void)Tokenizer::from_llama2c_bytes(good, 512));
  // every truncation is an error, never a crash
  for (size_t cut = 0; cut < good.size(); cut += (cut < 64 ? 1 : 7))
    expect_malformed(std::string_view(good).substr(0, cut), 512, "tok.bin");
  expect_malformed(std::string_view(good).substr(0, good.size() - 1), 512, "truncated");
  expect_malformed("", 512, "too short");
  // more tokens than the file holds
  expect_malformed(good, 513, "truncated");
  // fewer is fine (run.c reads only vocab_size tokens)
  EXPECT_EQ(Tokenizer::from_llama2c_bytes(good, 300).n_vocab(), 300);
  expect_malformed(good, 0, "vocab_size");
  expect_malformed(good, -4, "vocab_size");
  {
    std::string bad = good;
    const int32_t neg = -1;
    std::memcpy(bad.data() + 8, &neg, 4);  // length of token 0
    expect_malformed(bad, 512, "negative length");
  }
  {
    std::string bad = good;
    const int32_t huge = 0x7FFFFFFF;
    std::memcpy(bad.data() + 8, &huge, 4);
    expect_malformed(bad, 512, "truncated");
  }
  {
    std::string bad = good;
    const int32_t neg = -7;
    std::memcpy(bad.data(), &neg, 4);
    expect_malformed(bad, 512, "max_token_length");
  }
  EXPECT_THROW((void)Tokenizer::from_llama2c("/nonexistent/tok512.bin", 512), std::runtime_error);
}

}  // namespace
}  // namespace kvpack
