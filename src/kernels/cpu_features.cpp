#include "kernels/cpu_features.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvpack::kernels {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

bool parse_isa(const char* name, Isa* out) {
  if (name == nullptr) return false;
  for (int i = 0; i < kNumIsas; ++i) {
    if (std::strcmp(name, isa_name(static_cast<Isa>(i))) == 0) {
      *out = static_cast<Isa>(i);
      return true;
    }
  }
  return false;
}

namespace {
struct Features {
  bool avx2 = false, avx512 = false, vnni = false;
  Features() {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    // __builtin_cpu_supports also checks that the OS saves the ymm/zmm state (XGETBV).
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    vnni = avx512 && __builtin_cpu_supports("avx512vnni");
#endif
  }
};
const Features& features() {
  static const Features f;
  return f;
}

Isa choose(const IsaFamily& family) {
  const char* env = std::getenv("KVPACK_ISA");
  if (env == nullptr || *env == '\0') return best_isa(family);
  Isa want;
  if (!parse_isa(env, &want)) {
    std::fprintf(stderr, "kvpack: KVPACK_ISA=%s not recognised (scalar|avx2|avx512); using %s for %s\n", env,
                 isa_name(best_isa(family)), family.name);
    return best_isa(family);
  }
  if (!cpu_supports(want, family)) {
    std::fprintf(stderr, "kvpack: KVPACK_ISA=%s not supported by this CPU for %s; using %s\n", env, family.name,
                 isa_name(best_isa(family)));
    return best_isa(family);
  }
  return want;
}
}  // namespace

bool cpu_has(CpuFeature f) {
  switch (f) {
    case CpuFeature::Avx2Fma: return features().avx2;
    case CpuFeature::Avx512: return features().avx512;
    case CpuFeature::Avx512Vnni: return features().vnni;
  }
  return false;
}

bool cpu_supports(Isa isa, const IsaFamily& family) {
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return cpu_has(CpuFeature::Avx2Fma);
    case Isa::Avx512: return cpu_has(CpuFeature::Avx512) && (!family.avx512_needs_vnni || cpu_has(CpuFeature::Avx512Vnni));
  }
  return false;
}

Isa best_isa(const IsaFamily& family) {
  if (cpu_supports(Isa::Avx512, family)) return Isa::Avx512;
  if (cpu_supports(Isa::Avx2, family)) return Isa::Avx2;
  return Isa::Scalar;
}

Isa selected_isa(const IsaFamily& family) {
  // One cached choice per distinct requirement (the families differ only in the VNNI bit).
  if (family.avx512_needs_vnni) {
    static const Isa with_vnni = choose(family);
    return with_vnni;
  }
  static const Isa without_vnni = choose(family);
  return without_vnni;
}

}  // namespace kvpack::kernels
