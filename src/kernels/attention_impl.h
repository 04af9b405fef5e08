// Internal to the attention kernels (not a public header): the ISA-independent driver of paged_attention.
//
// Algorithm (flash attention over pages, online softmax):
//   The n_new query tokens are cut into tiles of `tile_tokens` tokens; a tile has R = tokens * group query
//   rows (row r = token (r / group), head (r % group)). Each tile walks the pages its last token can see;
//   per page, one pass reads K (scores for all R rows: R x page_size floats in scratch), one pass reads V
//   (accumulate p * V into the R x head_dim f32 accumulator). All rows of the tile share every K/V load, so
//   decode (R = group) reads each page once per GQA group, and prefill reads each page once per tile.
//   Per row we keep the running max m, running sum l and the accumulator, rescaled by exp(m_old - m_new)
//   when the max grows. Causality: query token t sees slots [0, n_slots - n_new + t + 1); a row never
//   uses a slot past its own limit (masked in the softmax and skipped in the V pass, so even non-finite
//   K/V there cannot leak into it), and no slot >= n_slots or page past the last visible one is read.
//   key_mass (optional) is a second pass over K per tile, after the tile's final m and l are known.
//   KV element types: F32 / F16 / BF16 are read (and widened) in registers by the page kernels. Q8_0 rows
//   (head_dim / 32 ggml blocks: f16 scale + 32 int8) are too on AVX-512 (Kern::kDirectQ8); the other
//   paths dequantise them once per page and tile into the `conv` scratch tile (page_size x head_dim f32)
//   by Kern::dequant_q8 and run the F32 kernels: the same products d * q either way, so the same bits.
//   Where AVX-512 VNNI is present, QK of Q8_0 keys quantises the query rows too (int8 dot products; the
//   spec is attention_quantise_query_row in attention.h), so there the scores are those of quantised queries.
//   Software prefetch four pages ahead along the page table, into L2 (see prefetch_block), of the pages that
//   do not continue their stream in address order (kv_page_needs_prefetch: the hardware streams those).
//
// Each attention_<isa>.cpp defines a `Kern` with the page kernels (qk, softmax, pv, mass) and instantiates
// run<Kern>. Everything below lives in an anonymous namespace on purpose: the ISA files are compiled with
// different -m flags, and a shared inline function could otherwise be emitted with AVX-512 instructions in
// one object and be picked by the linker for the baseline path (ODR / SIGILL hazard).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/attention.h"

namespace kvpack::kernels::attn_detail {

// Per-ISA entry points (arguments already validated by paged_attention / paged_attention_on).
void paged_attention_scalar(const KvStreamView& kv, const AttentionArgs& args);
void paged_attention_avx2(const KvStreamView& kv, const AttentionArgs& args);
void paged_attention_avx512(const KvStreamView& kv, const AttentionArgs& args);  // + VNNI QK where present
void paged_attention_avx512_novnni(const KvStreamView& kv, const AttentionArgs& args);  // never VNNI (tests)

namespace {

// Element kinds the page kernels read directly (kElemQ8: only a Kern with kDirectQ8, see above).
enum : int { kElemF32 = 0, kElemF16 = 1, kElemBF16 = 2, kElemQ8 = 3 };

// Query rows processed together against each page. 32 rows x 128 dims keeps the q tile and accumulator
// (2 x 16 KiB) in L1/L2 while amortising each page load over up to 32 rows during prefill.
constexpr int32_t kTileRows = 32;
constexpr int32_t kPad = 16;  // rows of q / acc / scores are padded to multiples of 16 floats (one zmm)

constexpr int32_t round_up(int32_t x, int32_t m) { return (x + m - 1) / m * m; }
constexpr int32_t imin(int32_t a, int32_t b) { return a < b ? a : b; }
constexpr int32_t imax(int32_t a, int32_t b) { return a > b ? a : b; }
constexpr int32_t clampi(int32_t x, int32_t lo, int32_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

constexpr int32_t tile_tokens(int32_t n_new, int32_t group) { return imax(1, imin(n_new, kTileRows / group)); }

// Valid (causally visible) slots of row r in a page of n loaded slots; rel0 = first token's limit - page start.
constexpr int32_t row_valid(int32_t rel0, int32_t r, int32_t group, int32_t n) {
  return clampi(rel0 + r / group, 0, n);
}

struct Layout {
  int32_t hdp = 0;          // padded head_dim (row stride of qs / acc)
  int32_t psp = 0;          // padded page_size (row stride of scores)
  float* qs = nullptr;      // [rows][hdp]  q * scale, zero padded
  float* acc = nullptr;     // [rows][hdp]  un-normalised output accumulator
  float* scores = nullptr;  // [rows][psp]  scores, then probabilities, of the current page
  float* m = nullptr;       // [rows]       running max
  float* l = nullptr;       // [rows]       running sum
  float* alpha = nullptr;   // [rows]       rescale factor of the current page
  float* conv = nullptr;    // [max(page_size, rows)][hdp]  page block converted to f32 (Q8_0; F16/BF16 on the scalar
                            // path), or the tile's quantised query rows (AVX-512 VNNI, Q8_0 keys)
};

constexpr size_t scratch_floats(int32_t n_new, int32_t group, int32_t head_dim, int32_t page_size) {
  // Rows of a tile are tile_tokens(n_new, group) * group <= min(n_new * group, max(kTileRows, group)); the
  // bound (not the exact count) keeps the size non-decreasing in every argument.
  const int64_t n_rows = static_cast<int64_t>(imax(n_new, 1)) * group;
  const size_t rows = static_cast<size_t>(n_rows < imax(kTileRows, group) ? n_rows : imax(kTileRows, group));
  const size_t hdp = round_up(head_dim, kPad), psp = round_up(page_size, kPad),
               rp = round_up(static_cast<int32_t>(rows), kPad);
  // conv: a page of f32 rows, or (AVX-512 VNNI, Q8_0 keys) the tile's quantised query rows, < hdp floats each.
  const size_t conv_rows = rows > static_cast<size_t>(page_size) ? rows : static_cast<size_t>(page_size);
  return kPad /*alignment slack*/ + 2 * rows * hdp + rows * psp + 3 * rp + conv_rows * hdp;
}

inline Layout make_layout(float* scratch, int32_t n_new, int32_t group, int32_t head_dim, int32_t page_size) {
  Layout L;
  const size_t rows = static_cast<size_t>(tile_tokens(n_new, group)) * group;
  L.hdp = round_up(head_dim, kPad);
  L.psp = round_up(page_size, kPad);
  const size_t rp = round_up(static_cast<int32_t>(rows), kPad);
  auto addr = reinterpret_cast<uintptr_t>(scratch);
  float* p = scratch + ((64 - addr % 64) % 64) / sizeof(float);  // 64-byte aligned (scratch is float-aligned)
  L.qs = p;
  p += rows * L.hdp;
  L.acc = p;
  p += rows * L.hdp;
  L.scores = p;
  p += rows * L.psp;
  L.m = p;
  p += rp;
  L.l = p;
  p += rp;
  L.alpha = p;
  p += rp;
  L.conv = p;
  return L;
}

// Software prefetch of the page kPrefetchPages ahead along the page table: its K block before this page's
// QK pass, its V block before this page's PV pass (spread, not 2 x 64 lines at once). Pages are scattered,
// so the hardware prefetchers stop at every page boundary and, without this, each page's DRAM latency adds
// to its compute instead of hiding behind the previous pages' (measured: cold time ~= plain read + hot time).
// The hint is "L2, not L1" (prefetcht2): an L1 prefetch holds one of the core's few L1 miss buffers until
// its line arrives, so a page in flight stalls the loads of the page being computed; L2 has several times
// more outstanding misses. Measured 2026-12-04 on the AMD EPYC VM, one thread, F16, 8192 slots
// (bench_attention decode): L1 hint, 2 pages, whole page at once 5.5 GB/s; L2 hint + 2 MiB pages
// (PagePool) 7.5; split K / V 9.4; distance 4 10.0, distance 8 10.4 (2048 slots: 10.1 at 4, 9.0 at 8).
// A plain 4 KiB-chunk read there: 5.5 GB/s without prefetch, 7 with an L1 hint, 9.5 with an L2 one.
constexpr int32_t kPrefetchPages = kAttentionPrefetchPages;
inline void prefetch_block(const uint8_t* block, size_t block_bytes) {
  for (size_t off = 0; off < block_bytes; off += 64) __builtin_prefetch(block + off, 0, 1);
}

template <class Kern>
void run(const KvStreamView& kv, const AttentionArgs& a) {
  const int32_t hd = kv.head_dim, ps = kv.page_size, G = a.group, n_new = a.n_new;
  if (n_new <= 0) return;
  const DType type = kv.kv_type;
  const bool q8 = type == DType::Q8_0 && !Kern::kDirectQ8;  // dequantised to the conv tile first
  const int kind = type == DType::F16    ? kElemF16
                   : type == DType::BF16 ? kElemBF16
                   : type == DType::Q8_0 ? (Kern::kDirectQ8 ? kElemQ8 : kElemF32)
                                         : kElemF32;
  const int32_t base = kv.n_slots - n_new;  // slots before the first new token
  const int32_t tt = tile_tokens(n_new, G);
  const Layout L = make_layout(a.scratch, n_new, G, hd, ps);
  const size_t block_bytes = static_cast<size_t>(ps) * kv_row_bytes(type, hd);  // K (or V) bytes of one page
  const size_t page_span = kv_page_span(kv);
  const int32_t hdp = L.hdp, psp = L.psp;
  // Q8_0 block -> f32 rows in L.conv (row stride hd), read by the F32 kernels.
  auto block = [&](const uint8_t* b, int32_t n) -> const uint8_t* {
    if (!q8) return b;
    Kern::dequant_q8(b, n, hd, L.conv);
    return reinterpret_cast<const uint8_t*>(L.conv);
  };

  for (int32_t t0 = 0; t0 < n_new; t0 += tt) {
    const int32_t t1 = imin(n_new, t0 + tt);
    const int32_t R = (t1 - t0) * G;
    for (int32_t r = 0; r < R; ++r) {
      const float* src = a.q + static_cast<int64_t>(t0 + r / G) * a.q_stride + static_cast<int64_t>(r % G) * hd;
      float* dst = L.qs + static_cast<size_t>(r) * hdp;
      for (int32_t d = 0; d < hd; ++d) dst[d] = src[d] * a.scale;
      for (int32_t d = hd; d < hdp; ++d) dst[d] = 0.0f;
      float* acc = L.acc + static_cast<size_t>(r) * hdp;
      for (int32_t d = 0; d < hdp; ++d) acc[d] = 0.0f;
      L.m[r] = -__builtin_inff();
      L.l[r] = 0.0f;
    }
    // A Kern that quantises the queries for Q8_0 keys (AVX-512 VNNI) does it once per tile, for every page.
    if constexpr (requires { Kern::kQuantisesQ8Queries; })
      if (Kern::kQuantisesQ8Queries && kind == kElemQ8) Kern::prepare_q8(L.qs, hdp, R, hd, L.conv);
    const int32_t first_limit = base + t0 + 1;  // slots visible to the tile's first token
    const int32_t last_limit = base + t1;       // ... and to its last token
    const int32_t n_pages = (last_limit + ps - 1) / ps;

    for (int32_t pg = 0; pg < n_pages; ++pg) {
      const int32_t s0 = pg * ps;
      const int32_t n = imin(ps, last_limit - s0);
      const uint8_t* page = kv.pages[pg];
      const bool pf = pg + kPrefetchPages < n_pages && kv_page_needs_prefetch(kv.pages, pg + kPrefetchPages, page_span);
      if (pf) prefetch_block(kv.pages[pg + kPrefetchPages], block_bytes);
      Kern::qk(block(page, n), kind, n, hd, L.qs, hdp, R, L.scores, psp, L.conv);
      if (pf) prefetch_block(kv.pages[pg + kPrefetchPages] + kv.v_offset, block_bytes);
      Kern::softmax(L.scores, psp, n, R, G, first_limit - s0, L.m, L.l, L.alpha);
      Kern::pv(block(page + kv.v_offset, n), kind, n, hd, L.scores, psp, L.alpha, L.acc, hdp, R, G, first_limit - s0, L.conv);
    }

    for (int32_t r = 0; r < R; ++r) {
      float* dst = a.out + static_cast<int64_t>(t0 + r / G) * a.out_stride + static_cast<int64_t>(r % G) * hd;
      const float* acc = L.acc + static_cast<size_t>(r) * hdp;
      const float inv = L.l[r] > 0.0f ? 1.0f / L.l[r] : 0.0f;
      for (int32_t d = 0; d < hd; ++d) dst[d] = acc[d] * inv;
      if (a.lse != nullptr) a.lse[static_cast<int64_t>(t0) * G + r] = L.m[r] + __builtin_logf(L.l[r]);
    }

    if (a.key_mass != nullptr) {  // priced path: re-read K, recompute the scores, normalise with final m, l
      for (int32_t pg = 0; pg < n_pages; ++pg) {
        const int32_t s0 = pg * ps;
        const int32_t n = imin(ps, last_limit - s0);
        Kern::qk(block(kv.pages[pg], n), kind, n, hd, L.qs, hdp, R, L.scores, psp, L.conv);
          Kern::mass(L.scores, psp, n, R, G, first_limit - s0, L.m, L.l, a.key_mass + s0);
      }
    }
  }
}

}  // namespace
}  // namespace kvpack::kernels::attn_detail
