// GGUF writer: round trips through the reader, streaming tensors, atomic file writes, and the
// writer's own input validation.
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "util/half.h"

using namespace kvpack;
using namespace kvpack::gguf;

namespace {

// Scratch directory removed at the end of the test.
struct TempDir {
  std::string path;
  TempDir() {
    std::string t = ::testing::TempDir() + "gguf_writer_XXXXXX";
    path = ::mkdtemp(t.data());
  }
  ~TempDir() {
    for (const auto& f : list()) ::unlink((path + "/" + f).c_str());
    ::rmdir(path.c_str());
  }
  std::vector<std::string> list() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path.c_str())) {
      while (dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) out.push_back(e->d_name);
      ::closedir(d);
    }
    return out;
  }
};

Value scalar(ValueType t, int64_t i = 0, uint64_t u = 0, double f = 0) {
  Value v;
  v.type = t;
  v.i = i;
  v.u = u;
  v.f = f;
  return v;
}

Value int_array(ValueType et, std::vector<int64_t> xs) {
  Value v;
  v.type = ValueType::ARRAY;
  v.elem_type = et;
  v.ints = std::move(xs);
  return v;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 13);
  return v;
}

}  // namespace

TEST(GgufWriter, MetadataRoundTrip) {
  Writer w;
  w.set_string("general.architecture", "llama");
  w.set_u32("u32", 4000000000u);
  w.set_i32("i32", -123456);
  w.set_u64("u64", ~uint64_t{0});
  w.set_f32("f32", 0.1f);
  w.set_bool("yes", true);
  w.set_bool("no", false);
  w.set_value("u8", scalar(ValueType::UINT8, 0, 255));
  w.set_value("i8", scalar(ValueType::INT8, -128));
  w.set_value("u16", scalar(ValueType::UINT16, 0, 65535));
  w.set_value("i16", scalar(ValueType::INT16, -32768));
  w.set_value("i64", scalar(ValueType::INT64, std::numeric_limits<int64_t>::min()));
  w.set_value("f64", scalar(ValueType::FLOAT64, 0, 0, 1e-300));
  w.set_string("empty", "");
  w.set_string("utf8", "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c");
  w.set_string_array("strs", {"a", "", "\xc4\xa0the", std::string(1000, 'z')});
  w.set_f32_array("floats", {1.5f, -2.25f, 0.0f});
  w.set_i32_array("ints", {1, -2, 2147483647});
  w.set_string_array("empty_arr", {});
  w.set_value("u8s", int_array(ValueType::UINT8, {0, 255, 7}));
  w.set_value("i16s", int_array(ValueType::INT16, {-32768, 32767}));
  w.set_value("bools", int_array(ValueType::BOOL, {1, 0}));
  Value f64s;
  f64s.type = ValueType::ARRAY;
  f64s.elem_type = ValueType::FLOAT64;
  f64s.floats = {1e300, -1e-300};
  w.set_value("f64s", f64s);
  w.set_u32("u32", 7);  // replacing keeps the original position

  const auto bytes = w.to_bytes();
  auto f = File::parse(bytes.data(), bytes.size(), "rt.gguf");
  EXPECT_EQ(f->version(), 3u);
  ASSERT_EQ(f->metadata().size(), w.metadata().size());
  for (size_t i = 0; i < w.metadata().size(); ++i) EXPECT_EQ(f->metadata()[i].key, w.metadata()[i].key);
  EXPECT_EQ(f->metadata()[1].key, "u32");
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("u32"), 7);
  EXPECT_EQ(f->find("u32")->type, ValueType::UINT32);
  EXPECT_EQ(f->get_int("i32"), -123456);
  EXPECT_EQ(f->find("u64")->u, ~uint64_t{0});
  EXPECT_THROW(f->get_int("u64"), Error);
  EXPECT_FLOAT_EQ(static_cast<float>(*f->get_float("f32")), 0.1f);
  EXPECT_EQ(f->get_bool("yes"), true);
  EXPECT_EQ(f->get_bool("no"), false);
  EXPECT_EQ(f->get_int("u8"), 255);
  EXPECT_EQ(f->find("u8")->type, ValueType::UINT8);
  EXPECT_EQ(f->get_int("i8"), -128);
  EXPECT_EQ(f->get_int("u16"), 65535);
  EXPECT_EQ(f->get_int("i16"), -32768);
  EXPECT_EQ(f->get_int("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f->get_float("f64"), 1e-300);
  EXPECT_EQ(f->get_string("empty"), "");
  EXPECT_EQ(f->get_string("utf8"), "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c");
  EXPECT_EQ(*f->get_string_array("strs"), (std::vector<std::string>{"a", "", "\xc4\xa0the", std::string(1000, 'z')}));
  EXPECT_EQ(*f->get_float_array("floats"), (std::vector<double>{1.5, -2.25, 0.0}));
  EXPECT_EQ(f->find("floats")->elem_type, ValueType::FLOAT32);
  EXPECT_EQ(*f->get_int_array("ints"), (std::vector<int64_t>{1, -2, 2147483647}));
  EXPECT_EQ(f->get_string_array("empty_arr")->size(), 0u);
  EXPECT_EQ(*f->get_int_array("u8s"), (std::vector<int64_t>{0, 255, 7}));
  EXPECT_EQ(*f->get_int_array("i16s"), (std::vector<int64_t>{-32768, 32767}));
  EXPECT_EQ(*f->get_int_array("bools"), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(*f->get_float_array("f64s"), (std::vector<double>{1e300, -1e-300}));
  EXPECT_EQ(f->tensors().size(), 0u);
}

TEST(GgufWriter, TensorRoundTripAndAlignment) {
  for (uint32_t align : {32u, 64u, 4096u}) {
    Writer w;
    w.set_string("general.architecture", "test");
    if (align != 32) w.set_alignment(align);
    const auto a = pattern(3 * 4, 1);             // F32 [3]: size not a multiple of the alignment
    const auto b = pattern(64 / 32 * 34 * 5, 2);  // Q8_0 [64, 5]
    const auto c = pattern(2 * 3 * 4 * 5 * 2, 3); // F16 [2,3,4,5]
    const auto d = pattern(7 * 2, 4);             // BF16 [7, 1, 1]
    w.add_tensor("a", {3}, DType::F32, a.data(), a.size());
    w.add_tensor("blk.0.b", {64, 5}, DType::Q8_0, b.data(), b.size());
    w.add_tensor("c", {2, 3, 4, 5}, DType::F16, c.data(), c.size());
    w.add_tensor("d", {7, 1, 1}, DType::BF16, d.data(), d.size());
    const auto bytes = w.to_bytes();
    EXPECT_EQ(bytes.size() % align, 0u);
    auto f = File::parse(bytes.data(), bytes.size());
    EXPECT_EQ(f->alignment(), align);
    EXPECT_EQ(f->data_offset() % align, 0u);
    ASSERT_EQ(f->tensors().size(), 4u);
    const std::vector<std::pair<const char*, const std::vector<uint8_t>*>> want = {
        {"a", &a}, {"blk.0.b", &b}, {"c", &c}, {"d", &d}};
    for (size_t i = 0; i < want.size(); ++i) {
      const TensorInfo* t = f->tensor(want[i].first);
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(&f->tensors()[i], t);  // insertion order
      EXPECT_EQ(t->offset % align, 0u);
      EXPECT_EQ((static_cast<const uint8_t*>(t->data) - bytes.data()) % align, 0);
      ASSERT_EQ(t->n_bytes, want[i].second->size());
      EXPECT_EQ(std::memcmp(t->data, want[i].second->data(), t->n_bytes), 0) << t->name;
    }
    EXPECT_EQ(f->tensor("c")->shape, (std::vector<uint64_t>{2, 3, 4, 5}));
    EXPECT_EQ(f->tensor("c")->type, DType::F16);
    EXPECT_EQ(f->tensor("blk.0.b")->type, DType::Q8_0);
    EXPECT_EQ(f->tensor("d")->type, DType::BF16);
  }
}

TEST(GgufWriter, StreamingTensor) {
  // 3 MiB rows x 3 -> the writer must call the source in several chunks, in row order.
  const uint64_t cols = 3u << 18, rows = 3;  // F32: 3 MiB per row
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  auto fill = [&](uint64_t r0, uint64_t n, uint8_t* out) {
    calls.emplace_back(r0, n);
    for (uint64_t r = 0; r < n; ++r)
      for (uint64_t c = 0; c < cols; c += 4096) {
        const float x = static_cast<float>((r0 + r) * 1000 + c / 4096);
        std::memcpy(out + (r * cols + c) * 4, &x, 4);
      }
  };
  Writer w;
  w.add_tensor_stream("big", {cols, rows}, DType::F32, fill);
  const float small[4] = {1, 2, 3, 4};
  w.add_tensor("small", {4}, DType::F32, small, sizeof small);
  const auto bytes = w.to_bytes();
  EXPECT_GE(calls.size(), 2u);
  uint64_t next = 0;
  for (auto [r0, n] : calls) {
    EXPECT_EQ(r0, next);
    next += n;
  }
  EXPECT_EQ(next, rows);
  auto f = File::parse(bytes.data(), bytes.size());
  const TensorInfo* t = f->tensor("big");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->n_bytes, cols * rows * 4);
  const auto* p = static_cast<const uint8_t*>(t->data);
  float x;
  std::memcpy(&x, p + (2 * cols + 4096 * 5) * 4, 4);
  EXPECT_EQ(x, 2005.0f);
  EXPECT_EQ(std::memcmp(f->tensor("small")->data, small, sizeof small), 0);
}

TEST(GgufWriter, WriteFileAtomically) {
  TempDir dir;
  Writer w;
  w.set_string("general.architecture", "llama");
  const auto a = pattern(32 * 34, 9);
  w.add_tensor("q", {32 * 32}, DType::Q8_0, a.data(), a.size());
  const std::string path = dir.path + "/m.gguf";
  w.write(path);
  w.set_string("general.name", "second");
  w.write(path);  // overwrite an existing file
  EXPECT_EQ(dir.list(), std::vector<std::string>{"m.gguf"});  // no temp files left behind
  auto f = File::open(path);
  EXPECT_EQ(f->name(), path);
  EXPECT_EQ(f->get_string("general.name"), "second");
  const auto bytes = w.to_bytes();
  EXPECT_EQ(f->file_size(), bytes.size());
  EXPECT_EQ(std::memcmp(f->tensor("q")->data, a.data(), a.size()), 0);

  EXPECT_THROW(w.write(dir.path + "/no/such/dir/m.gguf"), Error);
  // A failing source leaves neither a partial file nor a temp file.
  Writer bad;
  bad.add_tensor_stream("x", {8}, DType::F32, [](uint64_t, uint64_t, uint8_t*) { throw Error("boom"); });
  EXPECT_THROW(bad.write(dir.path + "/bad.gguf"), Error);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"m.gguf"});
}

TEST(GgufWriter, RejectsInvalidInput) {
  Writer w;
  const std::vector<uint8_t> buf(4096);
  w.add_tensor("t", {4}, DType::F32, buf.data(), 16);
  EXPECT_THROW(w.add_tensor("t", {4}, DType::F32, buf.data(), 16), Error);   // duplicate
  EXPECT_THROW(w.add_tensor("u", {4}, DType::F32, buf.data(), 12), Error);   // wrong size
  EXPECT_THROW(w.add_tensor("u", {}, DType::F32, buf.data(), 0), Error);     // no dims
  EXPECT_THROW(w.add_tensor("u", {1, 1, 1, 1, 1}, DType::F32, buf.data(), 4), Error);
  EXPECT_THROW(w.add_tensor("u", {4, 0}, DType::F32, buf.data(), 0), Error);  // zero dim
  EXPECT_THROW(w.add_tensor("u", {33}, DType::Q8_0, buf.data(), 34), Error);  // not a block multiple
  EXPECT_THROW(w.add_tensor("u", {4}, static_cast<DType>(5), buf.data(), 16), Error);
  EXPECT_THROW(w.add_tensor(std::string(64, 'n'), {4}, DType::F32, buf.data(), 16), Error);
  EXPECT_THROW(w.add_tensor("", {4}, DType::F32, buf.data(), 16), Error);
  EXPECT_THROW(w.add_tensor_stream("u", {4}, DType::F32, nullptr), Error);
  EXPECT_THROW(w.set_value("x", scalar(ValueType::UINT8, 0, 256)), Error);
  EXPECT_THROW(w.set_value("x", scalar(ValueType::INT8, 128)), Error);
  EXPECT_THROW(w.set_value("x", scalar(ValueType::BOOL, 2)), Error);
  EXPECT_THROW(w.set_value("x", int_array(ValueType::UINT16, {-1})), Error);
  EXPECT_THROW(w.set_value("x", int_array(ValueType::ARRAY, {})), Error);    // nested
  EXPECT_THROW(w.set_value("x", scalar(static_cast<ValueType>(13))), Error);
  EXPECT_THROW(w.set_alignment(48), Error);
  EXPECT_THROW(w.set_alignment(0), Error);
  EXPECT_THROW(w.set_u64("general.alignment", 64), Error);
  EXPECT_EQ(w.n_tensors(), 1u);
  // The writer is still usable and produces a valid file.
  const auto bytes = w.to_bytes();
  EXPECT_NO_THROW(File::parse(bytes.data(), bytes.size()));
}

TEST(GgufWriter, Version2PatchedStillParses) {
  Writer w;
  w.set_u32("k", 1);
  auto bytes = w.to_bytes();
  bytes[4] = 2;
  EXPECT_EQ(File::parse(bytes.data(), bytes.size())->version(), 2u);
}
