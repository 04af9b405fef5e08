// Memory placed on 2 MiB boundaries and offered to the kernel as transparent huge pages (madvise
// MADV_HUGEPAGE). For buffers read through scattered addresses (the KV page pool, its benchmark): with
// 4 KiB OS pages nearly every KV page costs a TLB miss and a page walk on top of its DRAM latency.
// madvise is advice: where THP is off the memory is plain, and nothing depends on it.
// Thread-safety: free functions, no shared state.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvpack {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// bytes rounded up to a multiple of kHugePageBytes: what huge_alloc(bytes) takes from the system.
constexpr size_t huge_alloc_bytes(size_t bytes) { return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes; }

// huge_alloc_bytes(bytes) bytes aligned to kHugePageBytes, or nullptr; release with std::free.
uint8_t* huge_alloc(size_t bytes);

// Deleter for memory from huge_alloc / std::aligned_alloc (std::unique_ptr<uint8_t, FreeBytes>).
struct FreeBytes {
  void operator()(uint8_t* p) const;
};

}  // namespace kvpack
