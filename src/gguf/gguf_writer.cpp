// GGUF v3 writer. Everything is validated when it is added (so a bad call fails at the call site, not
// at write time), and the writer enforces the same limits as the reader, so any file it produces
// reads back. Tensor data is either copied in (add_tensor) or produced row-chunk by row-chunk at
// write time (add_tensor_stream), which keeps peak memory at one chunk for multi-GB models.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "gguf/gguf.h"

namespace kvpack::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747u;  // "GGUF"
constexpr uint32_t kVersion = 3;
constexpr size_t kChunkBytes = 4u << 20;  // streaming chunk target

bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

[[noreturn]] void bad(const std::string& msg) { throw Error("gguf writer: " + msg); }

// Checks a scalar/array-element integer against the range of its on-disk type.
void check_int_range(const std::string& key, ValueType t, int64_t i, uint64_t u, bool is_unsigned_field) {
  auto in = [&](long double lo, long double hi) {
    const long double x = is_unsigned_field ? static_cast<long double>(u) : static_cast<long double>(i);
    if (x < lo || x > hi)
      bad("key '" + key + "': value " + (is_unsigned_field ? std::to_string(u) : std::to_string(i)) +
          " out of range for " + std::string(value_type_name(t)));
  };
  switch (t) {
    case ValueType::UINT8: in(0, 255); break;
    case ValueType::INT8: in(-128, 127); break;
    case ValueType::UINT16: in(0, 65535); break;
    case ValueType::INT16: in(-32768, 32767); break;
    case ValueType::UINT32: in(0, 4294967295.0L); break;
    case ValueType::INT32: in(-2147483648.0L, 2147483647.0L); break;
    default: break;  // 64-bit: any value (UINT64 array elements are stored as bit patterns)
    case ValueType::BOOL: in(0, 1); break;
  }
}

bool is_unsigned_type(ValueType t) {
  return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64;
}
bool is_int_like(ValueType t) {
  return t != ValueType::FLOAT32 && t != ValueType::FLOAT64 && t != ValueType::STRING && t != ValueType::ARRAY;
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Bytes of a tensor; the shape must already be validated.
uint64_t tensor_bytes(const std::vector<uint64_t>& shape, DType type) {
  uint64_t b = row_bytes(type, shape[0]);
  for (size_t d = 1; d < shape.size(); ++d) b *= shape[d];
  return b;
}
uint64_t tensor_rows(const std::vector<uint64_t>& shape) {
  uint64_t r = 1;
  for (size_t d = 1; d < shape.size(); ++d) r *= shape[d];
  return r;
}

}  // namespace

// Byte sink with a running position (used to compute padding).
class Writer::Sink {
 public:
  virtual ~Sink() = default;
  virtual void put(const void* p, size_t n) = 0;
  uint64_t pos() const { return pos_; }
  void bytes(const void* p, size_t n) {
    put(p, n);
    pos_ += n;
  }
  template <class T>
  void scalar(T v) {
    bytes(&v, sizeof v);  // host is little-endian (x86-64/aarch64), as GGUF requires
  }
  void str(const std::string& s) {
    scalar<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const uint8_t zeros[256] = {};
    uint64_t n = align_up(pos_, alignment) - pos_;
    while (n) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, sizeof zeros));
      bytes(zeros, k);
      n -= k;
    }
  }

 private:
  uint64_t pos_ = 0;
};

namespace {

class VectorSink : public Writer::Sink {
 public:
  std::vector<uint8_t> out;
  void put(const void* p, size_t n) override {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
};

// Buffered writes to a file descriptor; throws Error naming `path` on failure.
class FdSink : public Writer::Sink {
 public:
  FdSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) { buf_.reserve(kBuf); }
  void put(const void* p, size_t n) override {
    const auto* b = static_cast<const uint8_t*>(p);
    if (buf_.size() + n > kBuf) flush();
    if (n >= kBuf) {
      raw_write(b, n);
      return;
    }
    buf_.insert(buf_.end(), b, b + n);
  }
  void flush() {
    raw_write(buf_.data(), buf_.size());
    buf_.clear();
  }

 private:
  static constexpr size_t kBuf = 1u << 20;
  int fd_;
  std::string path_;
  std::vector<uint8_t> buf_;
  void raw_write(const uint8_t* p, size_t n) {
    while (n) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw Error(path_ + ": write failed: " + std::generic_category().message(errno));
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
};

}  // namespace

void Writer::set_value(std::string key, Value v) {
  if (static_cast<uint32_t>(v.type) > static_cast<uint32_t>(ValueType::FLOAT64))
    bad("key '" + key + "': invalid value type " + std::to_string(static_cast<uint32_t>(v.type)));
  if (v.type == ValueType::ARRAY) {
    const ValueType et = v.elem_type;
    if (static_cast<uint32_t>(et) > static_cast<uint32_t>(ValueType::FLOAT64))
      bad("key '" + key + "': invalid array element type");
    if (et == ValueType::ARRAY) bad("key '" + key + "': nested arrays cannot be written");
    if (is_int_like(et))
      for (int64_t x : v.ints) check_int_range(key, et, x, 0, false);
    v.count = et == ValueType::STRING ? v.strs.size() : is_int_like(et) ? v.ints.size() : v.floats.size();
  } else if (is_int_like(v.type)) {
    check_int_range(key, v.type, v.i, v.u, is_unsigned_type(v.type));
  }
  if (key == "general.alignment") {
    if (v.type != ValueType::UINT32 || !is_pow2(v.u)) bad("general.alignment must be a UINT32 power of two");
    alignment_ = v.u;
  }
  for (auto& kv : kv_)
    if (kv.key == key) {
      kv.value = std::move(v);
      return;
    }
  kv_.push_back({std::move(key), std::move(v)});
}

namespace {

// The setters below differ only in the value type and the field of Value that holds the payload.
template <class Field, class T>
Value scalar_value(ValueType type, Field Value::*field, T v) {
  Value x;
  x.type = type;
  x.*field = std::move(v);
  return x;
}

template <class Elem, class T>
Value array_value(ValueType elem_type, std::vector<Elem> Value::*field, std::vector<T> v) {
  Value x;
  x.type = ValueType::ARRAY;
  x.elem_type = elem_type;
  if constexpr (std::is_same_v<Elem, T>)
    x.*field = std::move(v);
  else
    (x.*field).assign(v.begin(), v.end());  // widened to the reader's element representation
  return x;
}

}  // namespace

void Writer::set_string(std::string key, std::string v) {
  set_value(std::move(key), scalar_value(ValueType::STRING, &Value::s, std::move(v)));
}
void Writer::set_u32(std::string key, uint32_t v) {
  set_value(std::move(key), scalar_value(ValueType::UINT32, &Value::u, v));
}
void Writer::set_i32(std::string key, int32_t v) {
  set_value(std::move(key), scalar_value(ValueType::INT32, &Value::i, v));
}
void Writer::set_u64(std::string key, uint64_t v) {
  set_value(std::move(key), scalar_value(ValueType::UINT64, &Value::u, v));
}
void Writer::set_f32(std::string key, float v) {
  set_value(std::move(key), scalar_value(ValueType::FLOAT32, &Value::f, v));
}
void Writer::set_bool(std::string key, bool v) {
  set_value(std::move(key), scalar_value(ValueType::BOOL, &Value::i, v ? 1 : 0));
}
void Writer::set_string_array(std::string key, std::vector<std::string> v) {
  set_value(std::move(key), array_value(ValueType::STRING, &Value::strs, std::move(v)));
}
void Writer::set_f32_array(std::string key, std::vector<float> v) {
  set_value(std::move(key), array_value(ValueType::FLOAT32, &Value::floats, std::move(v)));
}
void Writer::set_i32_array(std::string key, std::vector<int32_t> v) {
  set_value(std::move(key), array_value(ValueType::INT32, &Value::ints, std::move(v)));
}
void Writer::set_alignment(uint32_t alignment) { set_u32("general.alignment", alignment); }

void Writer::check_new_tensor(const std::string& name, const std::vector<uint64_t>& shape, DType type) const {
  const std::string where = "tensor '" + name + "': ";
  if (name.empty()) bad("empty tensor name");
  if (name.size() > kMaxTensorNameLen)
    bad(where + "name longer than " + std::to_string(kMaxTensorNameLen) + " bytes");
  for (const auto& t : tensors_)
    if (t.name == name) bad(where + "duplicate tensor name");
  const DTypeTraits* tr = dtype_traits(static_cast<uint32_t>(type));
  if (!tr) bad(where + "unknown type " + std::to_string(static_cast<uint32_t>(type)));
  if (shape.empty() || shape.size() > kMaxDims) bad(where + "n_dims must be in [1, 4]");
  // Same bound the reader applies: element count and byte size must fit in int64.
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (d == 0) bad(where + "zero dimension");
    if (__builtin_mul_overflow(n, d, &n) || n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad(where + "element count overflows");
  }
  if (shape[0] % tr->block_elems != 0)
    bad(where + "shape[0] = " + std::to_string(shape[0]) + " is not a multiple of the block size " +
        std::to_string(tr->block_elems) + " of " + std::string(tr->name));
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(shape[0] / tr->block_elems, uint64_t{tr->block_bytes}, &bytes) ||
      __builtin_mul_overflow(bytes, tensor_rows(shape), &bytes))
    bad(where + "data size overflows");
}

void Writer::add_tensor(std::string name, std::vector<uint64_t> shape, DType type, const void* data,
                        size_t n_bytes) {
  check_new_tensor(name, shape, type);
  const uint64_t expect = tensor_bytes(shape, type);
  if (n_bytes != expect)
    bad("tensor '" + name + "': got " + std::to_string(n_bytes) + " bytes, shape and type need " +
        std::to_string(expect));
  if (n_bytes && !data) bad("tensor '" + name + "': null data");
  PendingTensor t{std::move(name), std::move(shape), type, {}, {}};
  const auto* b = static_cast<const uint8_t*>(data);
  t.bytes.assign(b, b + n_bytes);
  tensors_.push_back(std::move(t));
}

void Writer::add_tensor_stream(std::string name, std::vector<uint64_t> shape, DType type, RowSource source) {
  check_new_tensor(name, shape, type);
  if (!source) bad("tensor '" + name + "': empty source");
  tensors_.push_back(PendingTensor{std::move(name), std::move(shape), type, {}, std::move(source)});
}

void Writer::serialize(Sink& out) const {
  const uint64_t a = alignment_;
  out.scalar<uint32_t>(kMagic);
  out.scalar<uint32_t>(kVersion);
  out.scalar<uint64_t>(tensors_.size());
  out.scalar<uint64_t>(kv_.size());

  for (const auto& kv : kv_) {
    out.str(kv.key);
    const Value& v = kv.value;
    out.scalar<uint32_t>(static_cast<uint32_t>(v.type));
    auto scalar = [&](ValueType t, int64_t i, uint64_t u, double f, const std::string& s) {
      switch (t) {
        case ValueType::UINT8: out.scalar<uint8_t>(static_cast<uint8_t>(u)); break;
        case ValueType::INT8: out.scalar<int8_t>(static_cast<int8_t>(i)); break;
        case ValueType::UINT16: out.scalar<uint16_t>(static_cast<uint16_t>(u)); break;
        case ValueType::INT16: out.scalar<int16_t>(static_cast<int16_t>(i)); break;
        case ValueType::UINT32: out.scalar<uint32_t>(static_cast<uint32_t>(u)); break;
        case ValueType::INT32: out.scalar<int32_t>(static_cast<int32_t>(i)); break;
        case ValueType::UINT64: out.scalar<uint64_t>(u); break;
        case ValueType::INT64: out.scalar<int64_t>(i); break;
        case ValueType::FLOAT32: out.scalar<float>(static_cast<float>(f)); break;
        case ValueType::FLOAT64: out.scalar<double>(f); break;
        case ValueType::BOOL: out.scalar<uint8_t>(i ? 1 : 0); break;
        case ValueType::STRING: out.str(s); break;
        case ValueType::ARRAY: break;  // rejected by set_value
      }
    };
    static const std::string kEmpty;
    if (v.type != ValueType::ARRAY) {
      scalar(v.type, v.i, v.u, v.f, v.s);
      continue;
    }
    out.scalar<uint32_t>(static_cast<uint32_t>(v.elem_type));
    out.scalar<uint64_t>(v.count);
    if (v.elem_type == ValueType::STRING) {
      for (const auto& s : v.strs) out.str(s);
    } else if (v.elem_type == ValueType::FLOAT32 || v.elem_type == ValueType::FLOAT64) {
      for (double f : v.floats) scalar(v.elem_type, 0, 0, f, kEmpty);
    } else {
      // Integer elements live in `ints`; unsigned ones are reinterpreted as their bit pattern.
      for (int64_t x : v.ints) scalar(v.elem_type, x, static_cast<uint64_t>(x), 0, kEmpty);
    }
  }

  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    out.str(t.name);
    out.scalar<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (uint64_t d : t.shape) out.scalar<uint64_t>(d);
    out.scalar<uint32_t>(static_cast<uint32_t>(t.type));
    out.scalar<uint64_t>(offset);
    offset += align_up(tensor_bytes(t.shape, t.type), a);
  }
  out.pad_to(a);

  std::vector<uint8_t> chunk;
  for (const auto& t : tensors_) {
    if (!t.source) {
      out.bytes(t.bytes.data(), t.bytes.size());
    } else {
      const uint64_t rb = row_bytes(t.type, t.shape[0]);
      const uint64_t rows = tensor_rows(t.shape);
      const uint64_t per_chunk = std::max<uint64_t>(1, kChunkBytes / rb);
      for (uint64_t r = 0; r < rows; r += per_chunk) {
        const uint64_t n = std::min(per_chunk, rows - r);
        chunk.assign(static_cast<size_t>(n * rb), 0);
        t.source(r, n, chunk.data());
        out.bytes(chunk.data(), chunk.size());
      }
    }
    out.pad_to(a);
  }
}

std::vector<uint8_t> Writer::to_bytes() const {
  VectorSink s;
  serialize(s);
  return std::move(s.out);
}

void Writer::write(const std::string& path) const {
  // Write next to the target and rename over it, so readers never see a half-written model.
  // (No fsync: this guards against concurrent readers and failed writes, not power loss.)
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw Error(path + ": cannot create temporary file: " + std::generic_category().message(errno));
  auto fail_cleanup = [&](bool close_fd) {
    if (close_fd) ::close(fd);
    ::unlink(tmp.c_str());
  };
  try {
    FdSink sink(fd, path);
    serialize(sink);
    sink.flush();
  } catch (...) {
    fail_cleanup(true);
    throw;
  }
  ::fchmod(fd, 0644);  // mkstemp creates 0600; a model file is normally world-readable
  if (::close(fd) != 0) {
    const int e = errno;
    fail_cleanup(false);
    throw Error(path + ": close failed: " + std::generic_category().message(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    fail_cleanup(false);
    throw Error(path + ": rename failed: " + std::generic_category().message(e));
  }
}

}  // namespace kvpack::gguf
