// GGUF v2/v3 reader (mmap, fully validated) and writer.
//
// Reader guarantees: every count, length, type, shape, offset and size in the file is checked against
// the file size before it is used, so a malformed or truncated file throws gguf::Error with a message
// naming the problem (and the key/tensor involved) instead of crashing or reading out of bounds.
// Thread-safety: a File is immutable after open(); concurrent const access is safe.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "util/dtype.h"

namespace kvpack::gguf {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

// One metadata value. Scalars use exactly one of i/u/f/b/s according to `type`; arrays keep their
// elements in the vector matching `elem_type` (integers and bools in `ints`, floats in `floats`,
// strings in `strs`). Nested arrays are validated and skipped (elem_type == ARRAY, count kept).
struct Value {
  ValueType type = ValueType::UINT8;
  ValueType elem_type = ValueType::UINT8;  // only for ARRAY
  int64_t i = 0;      // signed integer scalars, and bool
  uint64_t u = 0;     // unsigned integer scalars
  double f = 0;       // FLOAT32/FLOAT64
  std::string s;      // STRING
  uint64_t count = 0; // ARRAY element count
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strs;
};

// "UINT32", "STRING", ... ("?" for numbers outside the enum); used in error messages.
std::string_view value_type_name(ValueType t);

// Limits enforced by the reader (and the writer, so everything we write can be read back).
inline constexpr uint32_t kMaxDims = 4;             // GGML_MAX_DIMS
inline constexpr size_t kMaxTensorNameLen = 63;     // GGML_MAX_NAME - 1 (ggml stores names NUL-terminated)
inline constexpr uint64_t kDefaultAlignment = 32;   // GGUF_DEFAULT_ALIGNMENT
inline constexpr int kMaxArrayNesting = 8;          // arrays of arrays deeper than this are rejected

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> shape;  // ggml order: shape[0] is the contiguous (fastest) dimension
  DType type = DType::F32;
  uint64_t offset = 0;          // relative to the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const void* data = nullptr;   // points into the mapping (valid while the File lives)
};

class File {
 public:
  // Maps and validates the whole file. Throws gguf::Error ("path: problem").
  static std::unique_ptr<File> open(const std::string& path);
  // Parses an in-memory image (used by fuzz/malformed-input tests); the buffer must outlive the File.
  static std::unique_ptr<File> parse(const void* data, size_t size, std::string name = "<memory>");
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& name() const { return name_; }

  const std::vector<KeyValue>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;

  // Typed getters: nullopt when absent; throw Error when present with an incompatible type.
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;    // any integer type (u64 > INT64_MAX throws)
  std::optional<double> get_float(std::string_view key) const;   // float or integer types
  std::optional<bool> get_bool(std::string_view key) const;
  const std::vector<std::string>* get_string_array(std::string_view key) const;  // nullptr if absent
  const std::vector<double>* get_float_array(std::string_view key) const;         // FLOAT32/64 arrays
  const std::vector<int64_t>* get_int_array(std::string_view key) const;          // integer/bool arrays

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* tensor(std::string_view name) const;  // nullptr if absent

  // Absolute file offset of the tensor data section, and the size of the file/buffer.
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return size_; }
  // Tells the OS the resident pages of [data, data + bytes) (a range inside this file's mapping) are not
  // needed now: the whole pages inside the range are dropped and read again from the file if touched
  // (the mapping is private and read-only, so nothing is lost). A no-op for parsed in-memory images and for
  // ranges outside the mapping. For weights the loader has copied into another layout.
  void drop_resident(const void* data, size_t bytes) const;

 private:
  File() = default;
  struct Mapping;
  std::unique_ptr<Mapping> map_;
  uint64_t data_offset_ = 0;
  uint64_t size_ = 0;
  // Name -> index; the views point into kv_/tensors_, which never change after parsing.
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<KeyValue> kv_;
  std::vector<TensorInfo> tensors_;
  friend class Parser;
};

// Builds a GGUF v3 file. Tensors are written in insertion order, each aligned to `alignment`.
// Setting a key that already exists replaces its value in place (insertion order is kept).
// Invalid input (bad shape, duplicate tensor name, value out of range for its type) throws Error.
class Writer {
 public:
  // Produces rows [first_row, first_row + n_rows) of a tensor into `out` (n_rows * row_bytes(type,
  // shape[0]) bytes); a row is shape[0] elements. Called in increasing row order, in chunks, each time
  // the file is serialised (write()/to_bytes()), so it must be repeatable. Lets a caller stream
  // tensors far larger than memory without the Writer keeping a copy.
  using RowSource = std::function<void(uint64_t first_row, uint64_t n_rows, uint8_t* out)>;

  void set_string(std::string key, std::string v);
  void set_u32(std::string key, uint32_t v);
  void set_i32(std::string key, int32_t v);
  void set_u64(std::string key, uint64_t v);
  void set_f32(std::string key, float v);
  void set_bool(std::string key, bool v);
  void set_string_array(std::string key, std::vector<std::string> v);
  void set_f32_array(std::string key, std::vector<float> v);
  void set_i32_array(std::string key, std::vector<int32_t> v);
  void set_value(std::string key, Value v);  // generic (any type, incl. arrays; not nested arrays)
  // Sets general.alignment (u32, power of two) and uses it for the data section.
  void set_alignment(uint32_t alignment);

  // `data` must hold row_bytes(type, shape[0]) * (product of the other dims) bytes; copied.
  void add_tensor(std::string name, std::vector<uint64_t> shape, DType type, const void* data, size_t n_bytes);
  // Streaming variant: data is produced by `source` at write time (see RowSource).
  void add_tensor_stream(std::string name, std::vector<uint64_t> shape, DType type, RowSource source);

  size_t n_tensors() const { return tensors_.size(); }
  const std::vector<KeyValue>& metadata() const { return kv_; }

  void write(const std::string& path) const;  // throws Error on I/O failure
  std::vector<uint8_t> to_bytes() const;

  class Sink;  // byte sink (memory or file); defined in gguf_writer.cpp

 private:
  void serialize(Sink& out) const;
  void check_new_tensor(const std::string& name, const std::vector<uint64_t>& shape, DType type) const;
  uint64_t alignment_ = 32;
  std::vector<KeyValue> kv_;
  struct PendingTensor {
    std::string name;
    std::vector<uint64_t> shape;
    DType type;
    std::vector<uint8_t> bytes;  // used when source is empty
    RowSource source;
  };
  std::vector<PendingTensor> tensors_;
};

}  // namespace kvpack::gguf
