#include "util/huge_alloc.h"

#include <cstdlib>

#include <sys/mman.h>

namespace kvpack {

uint8_t* huge_alloc(size_t bytes) {
  const size_t n = huge_alloc_bytes(bytes);
  auto* mem = static_cast<uint8_t*>(std::aligned_alloc(kHugePageBytes, n));
  if (mem != nullptr) (void)::madvise(mem, n, MADV_HUGEPAGE);
  return mem;
}

void FreeBytes::operator()(uint8_t* p) const { std::free(p); }

}  // namespace kvpack
