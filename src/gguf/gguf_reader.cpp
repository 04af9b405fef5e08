// GGUF parser. The file is untrusted input: every field is checked against the bytes that remain
// before it is used, counts are bounded by what could possibly fit in the file (so a forged header
// cannot make us allocate gigabytes), all reads go through memcpy (the format has no alignment
// guarantees before the data section), and all size arithmetic is overflow-checked.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>

#include "gguf/gguf.h"

namespace kvpack::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747u;  // "GGUF" read as a little-endian u32

// Smallest possible encodings, used to reject counts that cannot fit in the remaining bytes.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // key length, value type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name length, n_dims, 1 dim, type, offset

constexpr uint64_t kMaxI64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

std::string num(uint64_t v) { return std::to_string(v); }

using u128 = unsigned __int128;
std::string num128(u128 v) {
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v);
  return s;
}

// Size of one array element on disk; for strings and arrays the smallest possible encoding.
uint64_t min_elem_bytes(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    case ValueType::STRING: return 8;       // length prefix
    case ValueType::ARRAY: return 4 + 8;    // element type + count
  }
  return 1;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::FLOAT64); }

bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Counts are bounded by the bytes left, but our in-memory forms are larger than the on-disk ones
// (a 1-byte array element becomes an int64, an empty string a std::string), so reserving a forged
// count up front could still ask for many times the file size. Reserve at most this many and let
// vectors grow as elements are actually parsed.
size_t capped_reserve(uint64_t count) { return static_cast<size_t>(std::min<uint64_t>(count, 1u << 16)); }

}  // namespace

struct File::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  Mapping(void* a, size_t s) : addr(a), size(s) {}
  ~Mapping() {
    if (addr) ::munmap(addr, size);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

File::~File() = default;

void File::drop_resident(const void* data, size_t bytes) const {
  if (!map_ || data == nullptr || bytes == 0) return;
  const auto base = reinterpret_cast<uintptr_t>(map_->addr), p = reinterpret_cast<uintptr_t>(data);
  if (p < base || p - base > map_->size || bytes > map_->size - (p - base)) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (p + page - 1) / page * page, hi = (p + bytes) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);  // advice: failure changes nothing
}

// Fills a File from a byte image. Errors read "<name>: <context>: <problem>" where the context names
// the metadata key or tensor being parsed.
class Parser {
 public:
  Parser(File& f, const uint8_t* data, size_t size) : f_(f), data_(data), size_(size) {}

  void run() {
    f_.size_ = size_;
    parse_header();
    parse_metadata();
    parse_alignment();
    parse_tensor_infos();
    place_tensor_data();
  }

 private:
  File& f_;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string ctx_;  // what is being parsed, for error messages
  uint64_t n_tensors_ = 0, n_kv_ = 0;

  [[noreturn]] void fail(const std::string& msg) const {
    throw Error(f_.name_ + ": " + (ctx_.empty() ? std::string() : ctx_ + ": ") + msg);
  }
  uint64_t remaining() const { return size_ - pos_; }
  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      fail(std::string("truncated ") + what + " at offset " + num(pos_) + " (need " + num(n) +
           " bytes, " + num(remaining()) + " left)");
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const uint64_t len = read<uint64_t>(what);
    if (len > remaining())
      fail(std::string(what) + ": string length " + num(len) + " exceeds the " + num(remaining()) +
           " bytes left in the file");
    std::string s;
    if (len) s.assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }

  void parse_header() {
    if (size_ < 4) fail("file too small (" + num(size_) + " bytes) to hold the GGUF magic");
    const uint32_t magic = read<uint32_t>("magic");
    if (magic != kMagic) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "bad magic 0x%08x (expected \"GGUF\"); not a GGUF file", magic);
      fail(buf);
    }
    const uint32_t version = read<uint32_t>("version");
    if (version == 1) fail("unsupported GGUF version 1 (only versions 2 and 3 are supported)");
    if (version == 0x02000000u || version == 0x03000000u)
      fail("unsupported version: big-endian GGUF files are not supported");
    if (version != 2 && version != 3) fail("unsupported GGUF version " + num(version));
    f_.version_ = version;
    n_tensors_ = read<uint64_t>("tensor count");
    n_kv_ = read<uint64_t>("metadata count");
    // Each count alone, then both together (no overflow: each bounded by the file size).
    if (n_tensors_ > remaining() / kMinTensorInfoBytes)
      fail("tensor count " + num(n_tensors_) + " cannot fit in the " + num(remaining()) + " bytes left");
    if (n_kv_ > remaining() / kMinKvBytes)
      fail("metadata kv count " + num(n_kv_) + " cannot fit in the " + num(remaining()) + " bytes left");
    if (n_tensors_ * kMinTensorInfoBytes + n_kv_ * kMinKvBytes > remaining())
      fail("tensor count " + num(n_tensors_) + " and metadata kv count " + num(n_kv_) +
           " cannot fit in the " + num(remaining()) + " bytes left");
  }

  void parse_metadata() {
    f_.kv_.reserve(capped_reserve(n_kv_));
    for (uint64_t i = 0; i < n_kv_; ++i) {
      ctx_ = "metadata entry #" + num(i);
      KeyValue kv;
      kv.key = read_string("key");
      ctx_ = "metadata key '" + kv.key + "'";
      const uint32_t t = read<uint32_t>("value type");
      if (!valid_value_type(t)) fail("invalid value type " + num(t));
      read_value(static_cast<ValueType>(t), kv.value, 0);
      f_.kv_.push_back(std::move(kv));
    }
    ctx_.clear();
    // Index after the vector is complete so the string_views stay valid.
    for (size_t i = 0; i < f_.kv_.size(); ++i)
      if (!f_.kv_index_.emplace(f_.kv_[i].key, i).second)
        fail("duplicate metadata key '" + f_.kv_[i].key + "'");
  }

  void read_value(ValueType t, Value& v, int depth) {
    v.type = t;
    switch (t) {
      case ValueType::UINT8: v.u = read<uint8_t>("value"); break;
      case ValueType::INT8: v.i = read<int8_t>("value"); break;
      case ValueType::UINT16: v.u = read<uint16_t>("value"); break;
      case ValueType::INT16: v.i = read<int16_t>("value"); break;
      case ValueType::UINT32: v.u = read<uint32_t>("value"); break;
      case ValueType::INT32: v.i = read<int32_t>("value"); break;
      case ValueType::UINT64: v.u = read<uint64_t>("value"); break;
      case ValueType::INT64: v.i = read<int64_t>("value"); break;
      case ValueType::FLOAT32: v.f = read<float>("value"); break;
      case ValueType::FLOAT64: v.f = read<double>("value"); break;
      case ValueType::BOOL: v.i = read_bool(); break;
      case ValueType::STRING: v.s = read_string("value"); break;
      case ValueType::ARRAY: read_array(v, depth); break;
    }
  }

  int64_t read_bool() {
    const uint8_t b = read<uint8_t>("bool value");
    if (b > 1) fail("invalid bool value " + num(b));
    return b;
  }

  // Reads the element type and count, checking the count against the remaining bytes.
  std::pair<ValueType, uint64_t> read_array_header(int depth) {
    if (depth >= kMaxArrayNesting) fail("arrays nested deeper than " + num(kMaxArrayNesting) + " levels");
    const uint32_t et = read<uint32_t>("array element type");
    if (!valid_value_type(et)) fail("invalid array element type " + num(et));
    const auto elem = static_cast<ValueType>(et);
    const uint64_t count = read<uint64_t>("array count");
    if (count > remaining() / min_elem_bytes(elem))
      fail("array count " + num(count) + " of " + std::string(value_type_name(elem)) +
           " cannot fit in the " + num(remaining()) + " bytes left");
    return {elem, count};
  }

  void read_array(Value& v, int depth) {
    const auto [elem, count] = read_array_header(depth);
    v.elem_type = elem;
    v.count = count;
    switch (elem) {
      case ValueType::STRING:
        v.strs.reserve(capped_reserve(count));
        for (uint64_t k = 0; k < count; ++k) v.strs.push_back(read_string("array element"));
        break;
      case ValueType::FLOAT32:
        v.floats.reserve(capped_reserve(count));
        for (uint64_t k = 0; k < count; ++k) v.floats.push_back(read<float>("array element"));
        break;
      case ValueType::FLOAT64:
        v.floats.reserve(capped_reserve(count));
        for (uint64_t k = 0; k < count; ++k) v.floats.push_back(read<double>("array element"));
        break;
      case ValueType::ARRAY:
        // Kept only as a count; the contents are validated and skipped.
        for (uint64_t k = 0; k < count; ++k) skip_array(depth + 1);
        break;
      default:
        v.ints.reserve(capped_reserve(count));
        for (uint64_t k = 0; k < count; ++k) v.ints.push_back(read_int_elem(elem));
        break;
    }
  }

  // Integer/bool array element as int64 (UINT64 keeps its bit pattern; getters check the range).
  int64_t read_int_elem(ValueType t) {
    switch (t) {
      case ValueType::UINT8: return read<uint8_t>("array element");
      case ValueType::INT8: return read<int8_t>("array element");
      case ValueType::UINT16: return read<uint16_t>("array element");
      case ValueType::INT16: return read<int16_t>("array element");
      case ValueType::UINT32: return read<uint32_t>("array element");
      case ValueType::INT32: return read<int32_t>("array element");
      case ValueType::UINT64: return static_cast<int64_t>(read<uint64_t>("array element"));
      case ValueType::INT64: return read<int64_t>("array element");
      case ValueType::BOOL: return read_bool();
      default: fail("internal: not an integer type");
    }
  }

  void skip_array(int depth) {
    const auto [elem, count] = read_array_header(depth);
    if (elem == ValueType::ARRAY) {
      for (uint64_t k = 0; k < count; ++k) skip_array(depth + 1);
    } else if (elem == ValueType::STRING) {
      for (uint64_t k = 0; k < count; ++k) {
        const uint64_t len = read<uint64_t>("array element");
        if (len > remaining()) fail("array element: string length " + num(len) + " exceeds the " +
                                    num(remaining()) + " bytes left in the file");
        pos_ += len;
      }
    } else if (elem == ValueType::BOOL) {
      for (uint64_t k = 0; k < count; ++k) read_bool();
    } else {
      pos_ += count * min_elem_bytes(elem);  // checked by read_array_header
    }
  }

  void parse_alignment() {
    f_.alignment_ = kDefaultAlignment;
    const Value* a = f_.find("general.alignment");
    if (!a) return;
    ctx_ = "metadata key 'general.alignment'";
    if (a->type != ValueType::UINT32)
      fail("must be UINT32, found " + std::string(value_type_name(a->type)));
    if (!is_pow2(a->u)) fail("alignment " + num(a->u) + " is not a power of two");
    f_.alignment_ = a->u;
    ctx_.clear();
  }

  void parse_tensor_infos() {
    f_.tensors_.reserve(capped_reserve(n_tensors_));
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      ctx_ = "tensor #" + num(i);
      TensorInfo t;
      t.name = read_string("tensor name");
      if (t.name.empty()) fail("empty tensor name");
      if (t.name.size() > kMaxTensorNameLen)
        fail("tensor name '" + t.name.substr(0, 80) + "' too long (" + num(t.name.size()) +
             " bytes, max " + num(kMaxTensorNameLen) + ")");
      ctx_ = "tensor '" + t.name + "'";
      const uint32_t n_dims = read<uint32_t>("n_dims");
      if (n_dims < 1 || n_dims > kMaxDims)
        fail("n_dims " + num(n_dims) + " out of range [1, " + num(kMaxDims) + "]");
      t.shape.resize(n_dims);
      uint64_t n_elem = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const uint64_t ne = read<uint64_t>("dimension");
        if (ne == 0) fail("dimension " + num(d) + " is zero");
        if (ne > kMaxI64) fail("dimension " + num(d) + " = " + num(ne) + " is too large");
        if (__builtin_mul_overflow(n_elem, ne, &n_elem) || n_elem > kMaxI64)
          fail("element count overflows (shape too large)");
        t.shape[d] = ne;
      }
      t.n_elements = n_elem;
      const uint32_t raw_type = read<uint32_t>("tensor type");
      const DTypeTraits* tr = dtype_traits(raw_type);
      if (!tr) fail("unknown tensor type " + num(raw_type));
      t.type = static_cast<DType>(raw_type);
      if (t.shape[0] % tr->block_elems != 0)
        fail("shape[0] = " + num(t.shape[0]) + " is not a multiple of the block size " +
             num(tr->block_elems) + " of type " + std::string(tr->name));
      // bytes = (shape[0] / block) * block_bytes * rows
      uint64_t bytes = t.shape[0] / tr->block_elems;
      bool overflow = __builtin_mul_overflow(bytes, uint64_t{tr->block_bytes}, &bytes);
      for (uint32_t d = 1; d < n_dims && !overflow; ++d) overflow = __builtin_mul_overflow(bytes, t.shape[d], &bytes);
      if (overflow) fail("data size overflows");
      t.n_bytes = bytes;
      t.offset = read<uint64_t>("tensor data offset");
      if (t.offset % f_.alignment_ != 0)
        fail("data offset " + num(t.offset) + " is not a multiple of the alignment " + num(f_.alignment_));
      f_.tensors_.push_back(std::move(t));
    }
    ctx_.clear();
    for (size_t i = 0; i < f_.tensors_.size(); ++i)
      if (!f_.tensor_index_.emplace(f_.tensors_[i].name, i).second)
        fail("duplicate tensor name '" + f_.tensors_[i].name + "'");
  }

  void place_tensor_data() {
    // pos_ <= size_ and alignment <= 2^31, so this cannot overflow.
    const uint64_t a = f_.alignment_;
    const uint64_t data_start = (pos_ + a - 1) / a * a;
    f_.data_offset_ = data_start;
    if (f_.tensors_.empty()) return;  // vocab-only files may end right after the header
    if (data_start > size_)
      fail("tensor data section starts at " + num(data_start) + ", past end of file (" + num(size_) + " bytes)");
    for (auto& t : f_.tensors_) {
      ctx_ = "tensor '" + t.name + "'";
      // 128-bit arithmetic: offset and size are each < 2^64, so begin/end cannot wrap.
      const u128 begin = u128{data_start} + t.offset;
      const u128 end = begin + t.n_bytes;
      if (end > size_)
        fail("data [" + num128(begin) + ", " + num128(end) + ") past end of file (" + num(size_) + " bytes)");
      t.data = data_ + data_start + t.offset;
    }
    ctx_.clear();
    // Overlap check: sort by offset, each tensor must end before the next begins.
    std::vector<const TensorInfo*> by_off;
    by_off.reserve(f_.tensors_.size());
    for (const auto& t : f_.tensors_) by_off.push_back(&t);
    std::sort(by_off.begin(), by_off.end(),
              [](const TensorInfo* x, const TensorInfo* y) { return x->offset < y->offset; });
    for (size_t i = 1; i < by_off.size(); ++i) {
      const TensorInfo& p = *by_off[i - 1];
      const TensorInfo& c = *by_off[i];
      if (p.offset + p.n_bytes > c.offset)
        fail("tensor '" + c.name + "' data [" + num(data_start + c.offset) + ", " +
             num(data_start + c.offset + c.n_bytes) + ") overlaps tensor '" + p.name + "' data [" +
             num(data_start + p.offset) + ", " + num(data_start + p.offset + p.n_bytes) + ")");
    }
  }
};

std::unique_ptr<File> File::parse(const void* data, size_t size, std::string name) {
  std::unique_ptr<File> f(new File());
  f->name_ = std::move(name);
  Parser(*f, static_cast<const uint8_t*>(data), data ? size : 0).run();
  return f;
}

std::unique_ptr<File> File::open(const std::string& path) {
  auto sys_error = [&](const char* what) {
    return Error(path + ": " + what + ": " + std::generic_category().message(errno));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw sys_error("cannot open");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const Error e = sys_error("cannot stat");
    ::close(fd);
    throw e;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  std::unique_ptr<File> f(new File());
  f->name_ = path;
  if (size == 0) {  // mmap rejects length 0; the parser reports the empty file
    ::close(fd);
    Parser(*f, nullptr, 0).run();
    return f;
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps its own reference to the file
  if (addr == MAP_FAILED) {
    errno = map_errno;
    throw sys_error("mmap failed");
  }
  f->map_ = std::make_unique<Mapping>(addr, size);
  Parser(*f, static_cast<const uint8_t*>(addr), size).run();
  return f;
}

}  // namespace kvpack::gguf
