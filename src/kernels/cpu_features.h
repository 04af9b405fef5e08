// Run-time CPU feature detection and the instruction-set choice for the kernels.
//
// The choice is made once (first call of selected_isa()): the best path this CPU and OS support, or the
// one named by the environment variable KVPACK_ISA=scalar|avx2|avx512 (for tests and benchmarks). A
// request the CPU cannot run falls back to the best supported path, with a one-time note on stderr.
// Thread-safety: all functions are safe to call concurrently (function-local static initialisation).
#pragma once

namespace kvpack::kernels {

enum class Isa : int {
  Scalar = 0,  // portable C++ (baseline x86-64 / any architecture)
  Avx2 = 1,    // AVX2 + FMA + F16C
  Avx512 = 2,  // AVX-512 F/BW/VL/DQ + VNNI (+ F16C, FMA)
};
constexpr int kNumIsas = 3;

const char* isa_name(Isa isa);
// Parses "scalar" / "avx2" / "avx512" (case-sensitive); returns false for anything else.
bool parse_isa(const char* name, Isa* out);
// True if this CPU and OS can execute `isa`'s kernels.
bool cpu_supports(Isa isa);
// Highest supported path.
Isa best_isa();
// The path the dispatcher uses: KVPACK_ISA if set and supported, else best_isa(). Chosen once.
Isa selected_isa();

}  // namespace kvpack::kernels
