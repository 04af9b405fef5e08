// Run-time CPU feature detection and the instruction-set choice for every kernel family (matmul,
// attention, key scoring): the one dispatch mechanism of src/kernels.
//
// Paths: scalar (portable), avx2 (AVX2 + FMA + F16C), avx512 (AVX-512 F/BW/VL/DQ on top of avx2). A
// family's avx512 path may need more: the int8 matmul needs VNNI, attention and key scoring do not, so
// a CPU with AVX-512 but without VNNI still runs their avx512 paths. `IsaFamily` says what a family's
// paths need; the plain functions (no family) are matmul's, as before.
//
// The choice is made once per family (first call of selected_isa): the best path this CPU and OS
// support, or the one named by the environment variable KVPACK_ISA=scalar|avx2|avx512 (tests,
// benchmarks). A request the CPU cannot run falls back to the best supported path, with a one-time
// note on stderr. A family without code for a path (key scoring has no avx2 kernels) runs the next
// lower one it has; that is the family's business, the choice here is only what the CPU can run.
// Thread-safety: all functions are safe to call concurrently (function-local static initialisation).
#pragma once

namespace kvpack::kernels {

enum class Isa : int {
  Scalar = 0,  // portable C++ (baseline x86-64 / any architecture)
  Avx2 = 1,    // AVX2 + FMA + F16C
  Avx512 = 2,  // AVX-512 F/BW/VL/DQ (+ F16C, FMA); + VNNI where the family needs it
};
constexpr int kNumIsas = 3;

// Individual CPU features (each also requires the OS to save the vector state).
enum class CpuFeature : int {
  Avx2Fma,     // AVX2 + FMA + F16C
  Avx512,      // AVX-512 F/BW/VL/DQ
  Avx512Vnni,  // AVX-512 VNNI
};
bool cpu_has(CpuFeature f);

// What a kernel family's avx512 path needs beyond AVX-512 F/BW/VL/DQ.
struct IsaFamily {
  const char* name;  // for messages
  bool avx512_needs_vnni;
};
inline constexpr IsaFamily kMatmulIsa{"matmul", true};
inline constexpr IsaFamily kAttentionIsa{"attention", false};
inline constexpr IsaFamily kKeyScoringIsa{"key scoring", false};

const char* isa_name(Isa isa);
// Parses "scalar" / "avx2" / "avx512" (case-sensitive); returns false for anything else.
bool parse_isa(const char* name, Isa* out);
// True if this CPU and OS can execute `family`'s kernels for `isa`.
bool cpu_supports(Isa isa, const IsaFamily& family);
// Highest path `family` can run here.
Isa best_isa(const IsaFamily& family);
// The path `family`'s dispatcher uses: KVPACK_ISA if set and supported, else best_isa(family). Chosen
// once per family.
Isa selected_isa(const IsaFamily& family);

// Matmul's answers (kMatmulIsa: avx512 includes VNNI).
inline bool cpu_supports(Isa isa) { return cpu_supports(isa, kMatmulIsa); }
inline Isa best_isa() { return best_isa(kMatmulIsa); }
inline Isa selected_isa() { return selected_isa(kMatmulIsa); }

}  // namespace kvpack::kernels
