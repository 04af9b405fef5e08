#include "util/dtype.h"

#include <array>

namespace kvpack {
namespace {
struct Entry {
  uint32_t id;
  DTypeTraits t;
};
// Sizes as defined by ggml (block layouts: Q8_0 = f16 scale + 32 int8; Q4_0 = f16 scale + 16 bytes;
// K-quants use 256-element super-blocks).
constexpr std::array<Entry, 20> kTypes = {{
    {0, {"F32", 1, 4}},      {1, {"F16", 1, 2}},      {2, {"Q4_0", 32, 18}},
    {3, {"Q4_1", 32, 20}},   {6, {"Q5_0", 32, 22}},   {7, {"Q5_1", 32, 24}},
    {8, {"Q8_0", 32, 34}},   {9, {"Q8_1", 32, 36}},   {10, {"Q2_K", 256, 84}},
    {11, {"Q3_K", 256, 110}}, {12, {"Q4_K", 256, 144}}, {13, {"Q5_K", 256, 176}},
    {14, {"Q6_K", 256, 210}}, {15, {"Q8_K", 256, 292}}, {24, {"I8", 1, 1}},
    {25, {"I16", 1, 2}},     {26, {"I32", 1, 4}},     {27, {"I64", 1, 8}},
    {28, {"F64", 1, 8}},     {30, {"BF16", 1, 2}},
}};
}  // namespace

const DTypeTraits* dtype_traits(uint32_t raw_type) {
  for (const auto& e : kTypes)
    if (e.id == raw_type) return &e.t;
  return nullptr;
}

std::string_view dtype_name(DType t) {
  const auto* tr = dtype_traits(static_cast<uint32_t>(t));
  return tr ? tr->name : std::string_view("?");
}

}  // namespace kvpack
