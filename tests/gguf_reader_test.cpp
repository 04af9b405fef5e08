// GGUF reader on hand-built malformed images (the real reference files are read in
// gguf_real_files_test.cpp). Malformed files are built byte by byte (not with gguf::Writer, which
// refuses to produce invalid files) so each test corrupts exactly one field of an otherwise valid file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gguf/gguf.h"

using namespace kvpack;
using namespace kvpack::gguf;

namespace {

// ---- byte-level builder --------------------------------------------------------------------

struct Bytes {
  std::vector<uint8_t> b;
  template <class T>
  Bytes& put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
    return *this;
  }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
};

struct RawTensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t offset;
};

// A file description that serialises exactly what it holds, valid or not.
struct RawFile {
  uint32_t magic = 0x46554747u;
  uint32_t version = 3;
  std::optional<uint64_t> n_tensors, n_kv;  // override the real counts
  std::vector<std::function<void(Bytes&)>> kvs;
  std::vector<RawTensor> tensors;
  uint64_t alignment = 32;
  uint64_t data_size = 0;  // bytes of data section (0: computed from the tensors)

  void kv_u32(const std::string& k, uint32_t v) {
    kvs.push_back([=](Bytes& b) { b.str(k).u32(4).u32(v); });
  }
  void kv_str(const std::string& k, const std::string& v) {
    kvs.push_back([=](Bytes& b) { b.str(k).u32(8).str(v); });
  }
  void kv_raw(std::function<void(Bytes&)> f) { kvs.push_back(std::move(f)); }

  std::vector<uint8_t> build() const {
    Bytes b;
    b.u32(magic).u32(version).u64(n_tensors.value_or(tensors.size())).u64(n_kv.value_or(kvs.size()));
    for (const auto& f : kvs) f(b);
    uint64_t end = 0;
    for (const auto& t : tensors) {
      b.str(t.name).u32(static_cast<uint32_t>(t.dims.size()));
      uint64_t bytes = 1;
      for (auto d : t.dims) b.u64(d);
      b.u32(t.type).u64(t.offset);
      const auto* tr = dtype_traits(t.type);
      if (tr && !t.dims.empty() && t.dims[0] % tr->block_elems == 0 && t.dims[0] < (1u << 20)) {
        bytes = row_bytes(static_cast<DType>(t.type), t.dims[0]);
        for (size_t d = 1; d < t.dims.size(); ++d) bytes *= t.dims[d];
        if (t.offset < (1u << 20)) end = std::max(end, t.offset + bytes);
      }
    }
    while (b.b.size() % alignment) b.b.push_back(0);
    const uint64_t n = data_size ? data_size : end;
    for (uint64_t i = 0; i < n; ++i) b.b.push_back(static_cast<uint8_t>(i * 7 + 1));
    return b.b;
  }
};

// Valid base: 3 kvs, F32 [32, 2] at 0 (256 bytes) and Q8_0 [64] at 256 (68 bytes); the file ends
// exactly at the last tensor byte, so every strict prefix is invalid.
RawFile base_file() {
  RawFile f;
  f.kv_str("general.architecture", "llama");
  f.kv_u32("llama.block_count", 2);
  f.kv_raw([](Bytes& b) { b.str("tokenizer.ggml.tokens").u32(9).u32(8).u64(3).str("a").str("bc").str(""); });
  f.tensors.push_back({"a.weight", {32, 2}, 0, 0});
  f.tensors.push_back({"b.weight", {64}, 8, 256});
  return f;
}

std::unique_ptr<File> parse_vec(const std::vector<uint8_t>& v) { return File::parse(v.data(), v.size(), "t.gguf"); }

// Parses and returns the error message ("" if it parsed).
std::string parse_error(const std::vector<uint8_t>& v) {
  // Copy into an exact-size heap buffer so AddressSanitizer catches any read past the end.
  std::vector<uint8_t> copy(v);
  copy.shrink_to_fit();
  try {
    File::parse(copy.data(), copy.size(), "t.gguf");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_PARSE_ERROR(bytes, ...)                                                  \
  do {                                                                                  \
    const std::string msg_ = parse_error(bytes);                                        \
    ASSERT_FALSE(msg_.empty()) << "parsed successfully";                                \
    EXPECT_EQ(msg_.rfind("t.gguf: ", 0), 0u) << msg_;                                   \
    for (const char* want_ : {__VA_ARGS__}) EXPECT_NE(msg_.find(want_), std::string::npos) << msg_; \
  } while (0)

}  // namespace

// ---- hand-built files ---------------------------------------------------------------------------

TEST(GgufParse, BaseFileIsValid) {
  const auto bytes = base_file().build();
  auto f = parse_vec(bytes);
  EXPECT_EQ(f->name(), "t.gguf");
  EXPECT_EQ(f->tensors().size(), 2u);
  const auto* a = f->tensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->n_bytes, 256u);
  const auto* b = f->tensor("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, DType::Q8_0);
  EXPECT_EQ(b->n_bytes, 68u);
  EXPECT_EQ(static_cast<const uint8_t*>(b->data) + b->n_bytes, bytes.data() + bytes.size());
  EXPECT_EQ(*static_cast<const uint8_t*>(a->data), 1);  // first data byte of the pattern
  const auto* toks = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_NE(toks, nullptr);
  EXPECT_EQ(*toks, (std::vector<std::string>{"a", "bc", ""}));
}

TEST(GgufParse, Version2Accepted) {
  auto rf = base_file();
  rf.version = 2;
  EXPECT_EQ(parse_vec(rf.build())->version(), 2u);
}

TEST(GgufParse, EveryTruncationThrows) {
  const auto bytes = base_file().build();
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    const std::string msg = parse_error(prefix);
    EXPECT_FALSE(msg.empty()) << "prefix of " << n << " bytes parsed";
  }
  EXPECT_EQ(parse_error(bytes), "");
}

TEST(GgufParse, EmptyAndNull) {
  EXPECT_THROW(File::parse(nullptr, 0), Error);
  EXPECT_THROW(File::parse(nullptr, 100), Error);
}

TEST(GgufParse, BadMagic) {
  auto rf = base_file();
  rf.magic = 0x46554746u;
  EXPECT_PARSE_ERROR(rf.build(), "magic");
}

TEST(GgufParse, UnsupportedVersions) {
  auto rf = base_file();
  rf.version = 1;
  EXPECT_PARSE_ERROR(rf.build(), "unsupported", "version 1");
  rf.version = 4;
  EXPECT_PARSE_ERROR(rf.build(), "unsupported", "version 4");
  rf.version = 0x03000000u;
  EXPECT_PARSE_ERROR(rf.build(), "big-endian");
}

TEST(GgufParse, HugeCounts) {
  auto rf = base_file();
  rf.n_tensors = uint64_t{1} << 60;
  EXPECT_PARSE_ERROR(rf.build(), "tensor count");
  rf = base_file();
  rf.n_tensors = ~uint64_t{0};
  EXPECT_PARSE_ERROR(rf.build(), "tensor count");
  rf = base_file();
  rf.n_kv = uint64_t{1} << 62;
  EXPECT_PARSE_ERROR(rf.build(), "kv count");
  rf = base_file();
  rf.n_kv = 1000;  // plausible-looking but still more than the file can hold
  EXPECT_PARSE_ERROR(rf.build(), "kv count");
}

TEST(GgufParse, HugeStringLength) {
  auto rf = base_file();
  rf.kv_raw([](Bytes& b) { b.u64(uint64_t{1} << 62).u32(4).u32(1); });  // key length
  EXPECT_PARSE_ERROR(rf.build(), "string length");
  rf = base_file();
  rf.kv_raw([](Bytes& b) { b.str("general.name").u32(8).u64(~uint64_t{0}); });  // value length
  EXPECT_PARSE_ERROR(rf.build(), "general.name", "string length");
  rf = base_file();
  rf.tensors[1].name = std::string(10, 'x');
  auto bytes = rf.build();
  // Patch the second tensor-name length field (find the 10 'x').
  const std::string needle(10, 'x');
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  ASSERT_NE(it, bytes.end());
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(&*(it - 8), &huge, 8);
  EXPECT_PARSE_ERROR(bytes, "string length");
}

TEST(GgufParse, HugeArrayCount) {
  auto rf = base_file();
  rf.kv_raw([](Bytes& b) { b.str("scores").u32(9).u32(6).u64(uint64_t{1} << 61); });
  EXPECT_PARSE_ERROR(rf.build(), "scores", "array count");
  rf = base_file();
  rf.kv_raw([](Bytes& b) { b.str("toks").u32(9).u32(8).u64(~uint64_t{0}); });
  EXPECT_PARSE_ERROR(rf.build(), "toks", "array count");
  // Array whose element strings each claim more than what is left.
  rf = base_file();
  rf.kv_raw([](Bytes& b) { b.str("toks").u32(9).u32(8).u64(2).u64(1).b.push_back('x'); b.u64(1u << 30); });
  EXPECT_PARSE_ERROR(rf.build(), "toks", "string length");
}

TEST(GgufParse, NestedArrays) {
  // Bomb: an array of 2^40 arrays cannot fit in the file.
  auto rf = base_file();
  rf.kv_raw([](Bytes& b) { b.str("bomb").u32(9).u32(9).u64(uint64_t{1} << 40); });
  EXPECT_PARSE_ERROR(rf.build(), "bomb", "array count");
  // Inner array count huge.
  rf = base_file();
  rf.kv_raw([](Bytes& b) { b.str("bomb").u32(9).u32(9).u64(2).u32(4).u64(uint64_t{1} << 50); });
  EXPECT_PARSE_ERROR(rf.build(), "bomb", "array count");
  // Deep nesting is bounded (no stack exhaustion).
  rf = base_file();
  rf.kv_raw([](Bytes& b) {
    b.str("deep").u32(9);
    for (int i = 0; i < 10000; ++i) b.u32(9).u64(1);
    b.u32(0).u64(0);
  });
  EXPECT_PARSE_ERROR(rf.build(), "deep", "nested");
  // Shallow nesting is accepted, kept as a count only.
  rf = base_file();
  rf.kv_raw([](Bytes& b) {
    b.str("nested").u32(9).u32(9).u64(3);
    b.u32(4).u64(2).u32(7).u32(8);
    b.u32(8).u64(1).str("hi");
    b.u32(9).u64(1).u32(7).u64(1).put<uint8_t>(1);
  });
  auto f = parse_vec(rf.build());
  const Value* v = f->find("nested");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->type, ValueType::ARRAY);
  EXPECT_EQ(v->elem_type, ValueType::ARRAY);
  EXPECT_EQ(v->count, 3u);
  EXPECT_EQ(f->tensors().size(), 2u);  // parsing continued correctly after the nested value
}

TEST(GgufParse, BadValueTypes) {
  auto rf = base_file();
  rf.kv_raw([](Bytes& b) { b.str("weird").u32(13).u32(0); });
  EXPECT_PARSE_ERROR(rf.build(), "weird", "value type 13");
  rf = base_file();
  rf.kv_raw([](Bytes& b) { b.str("weird_arr").u32(9).u32(77).u64(0); });
  EXPECT_PARSE_ERROR(rf.build(), "weird_arr", "element type 77");
  rf = base_file();
  rf.kv_raw([](Bytes& b) { b.str("flag").u32(7).put<uint8_t>(2); });
  EXPECT_PARSE_ERROR(rf.build(), "flag", "bool");
}

TEST(GgufParse, DuplicateKey) {
  auto rf = base_file();
  rf.kv_u32("llama.block_count", 3);
  EXPECT_PARSE_ERROR(rf.build(), "duplicate", "llama.block_count");
}

TEST(GgufParse, BadTensorType) {
  auto rf = base_file();
  rf.tensors[1].type = 99;
  EXPECT_PARSE_ERROR(rf.build(), "b.weight", "type 99");
  rf.tensors[1].type = 4;  // removed Q4_2
  EXPECT_PARSE_ERROR(rf.build(), "b.weight", "type 4");
}

TEST(GgufParse, BadDims) {
  auto rf = base_file();
  rf.tensors[0].dims = {};
  EXPECT_PARSE_ERROR(rf.build(), "a.weight", "n_dims 0");
  rf.tensors[0].dims = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_PARSE_ERROR(rf.build(), "a.weight", "n_dims 9");
  rf.tensors[0].dims = {1, 1, 1, 1, 1};
  EXPECT_PARSE_ERROR(rf.build(), "a.weight", "n_dims 5");
  rf.tensors[0].dims = {32, 0};
  EXPECT_PARSE_ERROR(rf.build(), "a.weight", "dimension 1 is zero");
  rf.tensors[0].dims = {uint64_t{1} << 32, uint64_t{1} << 32};
  EXPECT_PARSE_ERROR(rf.build(), "a.weight", "overflow");
  rf.tensors[0].dims = {~uint64_t{0}};
  EXPECT_PARSE_ERROR(rf.build(), "a.weight", "too large");
  // Element count fits in int64 but the F64 byte size would not fit in 64 bits.
  rf.tensors[0].dims = {uint64_t{1} << 31, uint64_t{1} << 31};
  rf.tensors[0].type = 28;
  EXPECT_PARSE_ERROR(rf.build(), "a.weight");
}

TEST(GgufParse, BlockSizeMultiple) {
  auto rf = base_file();
  rf.tensors[1].dims = {48};  // Q8_0 needs multiples of 32
  rf.data_size = 1024;
  EXPECT_PARSE_ERROR(rf.build(), "b.weight", "block size 32");
}

TEST(GgufParse, MisalignedOffset) {
  auto rf = base_file();
  rf.tensors[1].offset = 264;
  EXPECT_PARSE_ERROR(rf.build(), "b.weight", "alignment");
}

TEST(GgufParse, OffsetPastEnd) {
  auto rf = base_file();
  rf.tensors[1].offset = 4096;
  rf.data_size = 400;
  EXPECT_PARSE_ERROR(rf.build(), "tensor 'b.weight'", "past end of file");
  rf.tensors[1].offset = ~uint64_t{0} - 31;  // aligned, and offset + size wraps 64 bits
  EXPECT_PARSE_ERROR(rf.build(), "tensor 'b.weight'", "past end of file");
  // Data one byte short.
  rf = base_file();
  auto bytes = rf.build();
  bytes.pop_back();
  EXPECT_PARSE_ERROR(bytes, "b.weight", "past end of file");
}

TEST(GgufParse, DataSectionPastEnd) {
  // The header is complete but the file stops inside the padding before the data section.
  const auto bytes = base_file().build();
  const size_t data_start = bytes.size() - 324;  // 256 + 68 data bytes follow the padded header
  ASSERT_EQ(data_start % 32, 0u);
  ASSERT_EQ(bytes[data_start - 1], 0);  // there is padding to cut into
  std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(data_start - 1));
  EXPECT_PARSE_ERROR(cut, "data section", "past end of file");
}

TEST(GgufParse, OverlappingTensors) {
  auto rf = base_file();
  rf.tensors[1].offset = 224;  // a.weight is [0, 256)
  EXPECT_PARSE_ERROR(rf.build(), "overlaps", "a.weight", "b.weight");
  rf = base_file();
  rf.tensors[1].offset = 0;
  EXPECT_PARSE_ERROR(rf.build(), "overlaps");
}

TEST(GgufParse, DuplicateTensorNames) {
  auto rf = base_file();
  rf.tensors[1].name = "a.weight";
  EXPECT_PARSE_ERROR(rf.build(), "duplicate tensor name", "a.weight");
}

TEST(GgufParse, TensorNameLength) {
  auto rf = base_file();
  rf.tensors[1].name = std::string(64, 'n');
  EXPECT_PARSE_ERROR(rf.build(), "too long");
  rf.tensors[1].name = std::string(63, 'n');
  EXPECT_EQ(parse_error(rf.build()), "");
  rf.tensors[1].name = "";
  EXPECT_PARSE_ERROR(rf.build(), "empty tensor name");
}

TEST(GgufParse, Alignment) {
  auto rf = base_file();
  rf.kv_u32("general.alignment", 64);
  rf.alignment = 64;
  rf.tensors[1].offset = 256;
  auto f = parse_vec(rf.build());
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);

  rf = base_file();
  rf.kv_u32("general.alignment", 48);
  EXPECT_PARSE_ERROR(rf.build(), "general.alignment", "power of two");
  rf = base_file();
  rf.kv_u32("general.alignment", 0);
  EXPECT_PARSE_ERROR(rf.build(), "general.alignment", "power of two");
  rf = base_file();
  rf.kv_raw([](Bytes& b) { b.str("general.alignment").u32(10).u64(32); });
  EXPECT_PARSE_ERROR(rf.build(), "general.alignment", "UINT32");
  // With alignment 512, offset 256 is misaligned.
  rf = base_file();
  rf.kv_u32("general.alignment", 512);
  rf.alignment = 512;
  EXPECT_PARSE_ERROR(rf.build(), "b.weight", "alignment 512");
}

TEST(GgufParse, VocabOnlyFileMayEndAtHeader) {
  RawFile rf;
  rf.kv_str("general.architecture", "gpt2");  // header length not a multiple of 32
  auto bytes = rf.build();
  while (!bytes.empty() && bytes.back() == 0) bytes.pop_back();
  ASSERT_NE(bytes.size() % 32, 0u);
  auto f = parse_vec(bytes);
  EXPECT_EQ(f->tensors().size(), 0u);
  EXPECT_EQ(f->get_string("general.architecture"), "gpt2");
}

TEST(GgufParse, GetterRanges) {
  RawFile rf;
  rf.kv_raw([](Bytes& b) { b.str("big").u32(10).u64(~uint64_t{0}); });
  rf.kv_raw([](Bytes& b) { b.str("bigs").u32(9).u32(10).u64(2).u64(1).u64(~uint64_t{0}); });
  rf.kv_raw([](Bytes& b) { b.str("neg").u32(11).put<int64_t>(-5); });
  rf.kv_raw([](Bytes& b) { b.str("f64").u32(12).put<double>(0.25); });
  rf.kv_raw([](Bytes& b) { b.str("bools").u32(9).u32(7).u64(3).put<uint8_t>(1).put<uint8_t>(0).put<uint8_t>(1); });
  auto f = parse_vec(rf.build());
  EXPECT_THROW(f->get_int("big"), Error);
  EXPECT_EQ(f->get_float("big"), 18446744073709551615.0);
  EXPECT_THROW(f->get_int_array("bigs"), Error);
  EXPECT_EQ(f->get_int("neg"), -5);
  EXPECT_EQ(f->get_float("f64"), 0.25);
  EXPECT_EQ(*f->get_int_array("bools"), (std::vector<int64_t>{1, 0, 1}));
}

TEST(GgufParse, RandomCorruptionNeverCrashes) {
  // Deterministic mutation fuzzing of the header: each mutant must parse or throw gguf::Error, and
  // a mutant that parses must describe only in-bounds tensor data (ASan checks the reads below).
  auto rf = base_file();
  rf.kv_raw([](Bytes& b) { b.str("nested").u32(9).u32(9).u64(2).u32(4).u64(1).u32(5).u32(8).u64(1).str("x"); });
  rf.kv_raw([](Bytes& b) { b.str("general.alignment").u32(4).u32(32); });
  const auto good = rf.build();
  const size_t header = good.size() - 324;
  uint64_t s = 0x1234567;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return s >> 33;
  };
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::vector<uint8_t> m = good;
    const int n_mut = 1 + static_cast<int>(next() % 4);
    for (int k = 0; k < n_mut; ++k) {
      const size_t at = next() % header;
      switch (next() % 3) {
        case 0: m[at] ^= static_cast<uint8_t>(1u << (next() % 8)); break;
        case 1: m[at] = static_cast<uint8_t>(next()); break;
        default: m[at] = (next() & 1) ? 0xff : 0x00; break;
      }
    }
    if (next() % 4 == 0) m.resize(next() % m.size());
    m.shrink_to_fit();
    try {
      auto f = File::parse(m.data(), m.size(), "fuzz.gguf");
      ++parsed;
      unsigned sum = 0;
      for (const auto& t : f->tensors()) {
        const auto* p = static_cast<const uint8_t*>(t.data);
        sum += p[0] + p[t.n_bytes - 1];
      }
      for (const auto& kv : f->metadata()) sum += static_cast<unsigned>(kv.key.size());
      (void)sum;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rejected, 0);
}