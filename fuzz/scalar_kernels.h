// Force-included into every file of the fuzz build (CMakeLists.txt, KVPACK_FUZZ). clang 14 rejects the
// "f16c" feature name that src/kernels passes to __builtin_cpu_supports (gcc accepts it), and the
// fuzzers target the loaders and text processing, not the SIMD kernels: every CPU feature reads as
// absent, so the kernels take their portable scalar paths.
#pragma once
#define __builtin_cpu_supports(feature) false
