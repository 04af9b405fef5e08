// The page of GET /kv (see kv_page.h). Plain HTML + SVG + a little script; everything inline.
#include "server/kv_page.h"

namespace kvpack::server {

std::string_view kv_page_html() {
  static constexpr std::string_view kPage = R"KVPAGE(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kvpack — KV cache</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222;background:#fafafa}
h1{font-size:18px;margin:0 0 4px} .sub{color:#666;margin-bottom:12px}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px 12px;margin-bottom:12px}
.bar{display:flex;height:22px;border-radius:4px;overflow:hidden;border:1px solid #ccc}
.bar div{height:100%} .legend span{display:inline-block;margin-right:14px}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px;border-radius:2px}
.active{background:#2f6fde}.cached{background:#9bc1f7}.free{background:#e9edf2}.cold{background:#7a5bd6}
.seqs{display:flex;flex-wrap:wrap;gap:12px}
.seq{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px;min-width:180px}
.seq.flash{box-shadow:0 0 0 3px #f0a020}
.seq h3{margin:0 0 4px;font-size:13px} .seq .meta{color:#555;font-size:12px;margin-bottom:4px}
.events{font-family:ui-monospace,monospace;font-size:12px;max-height:180px;overflow:auto;white-space:pre}
table.nums td{padding:0 12px 0 0}
</style></head><body>
<h1>kvpack — KV cache</h1>
<div class="sub"><span id="model"></span> · step <span id="step">–</span> · <span id="status">connecting…</span></div>
<div class="card">
  <div class="bar" id="poolbar"></div>
  <div class="legend" style="margin-top:6px">
    <span><i class="sw active"></i>active <b id="pool-active">0</b></span>
    <span><i class="sw cached"></i>cached (prefix, reusable) <b id="pool-cached">0</b></span>
    <span><i class="sw free"></i>free <b id="pool-free">0</b></span>
    <span><i class="sw cold"></i>cold tier <b id="cold-records">0</b> pages (<span id="cold-used">0</span>)</span>
    <span>of <b id="pool-total">0</b> pages × <span id="page-bytes"></span></span>
  </div>
</div>
<div class="card"><b>Resident KV</b> <span id="resident"></span>
  <svg id="chart" width="100%" height="120" viewBox="0 0 600 120" preserveAspectRatio="none"></svg>
  <div class="legend"><span><i class="sw active"></i>hot pool</span><span><i class="sw cold"></i>cold tier</span></div>
</div>
<div class="card"><b>Sequences</b> (<span id="seq-count">0</span>) — one cell per (layer, KV head): colour = slots held, number = pages;
  orange frame = compacted or recalled since the last picture
  <div class="seqs" id="seqs" style="margin-top:8px"></div>
</div>
<div class="card"><b>Events</b><div class="events" id="events"></div></div>
<script>
"use strict";
const key = new URLSearchParams(location.hash.slice(1)).get("key");
const $ = id => document.getElementById(id);
const fmt = b => b >= 1 << 30 ? (b / (1 << 30)).toFixed(2) + " GiB" : b >= 1 << 20 ? (b / (1 << 20)).toFixed(1) + " MiB" : (b / 1024).toFixed(1) + " KiB";
const history = [];   // [t, hot bytes, cold bytes]
const last = new Map();  // sequence id -> its previous picture
let polls = 0;
function log(line) {
  const e = $("events");
  e.textContent = new Date().toLocaleTimeString() + "  " + line + "\n" + e.textContent.split("\n").slice(0, 200).join("\n");
}
function poolBar(p) {
  const bar = $("poolbar"); bar.innerHTML = "";
  for (const [cls, n] of [["active", p.active], ["cached", p.cached], ["free", p.free]]) {
    const d = document.createElement("div"); d.className = cls; d.style.width = (100 * n / Math.max(1, p.total)) + "%"; d.title = cls + ": " + n; bar.appendChild(d);
  }
}
function chart() {
  const svg = $("chart"), W = 600, H = 120, n = history.length;
  if (n < 2) return;
  const t0 = history[0][0], t1 = history[n - 1][0], top = Math.max(1, ...history.map(h => Math.max(h[1], h[2])));
  const line = (i, color) => {
    const pts = history.map(h => ((h[0] - t0) / Math.max(1e-9, t1 - t0) * W).toFixed(1) + "," + (H - 4 - h[i] / top * (H - 8)).toFixed(1)).join(" ");
    return `<polyline fill="none" stroke="${color}" stroke-width="2" points="${pts}"/>`;
  };
  svg.innerHTML = line(1, "#2f6fde") + line(2, "#7a5bd6") + `<text x="4" y="12" font-size="11" fill="#666">${fmt(top)}</text>`;
}
function grid(s, L, H) {
  const cell = H > 16 ? 10 : 18, svgNS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("width", H * cell + 2); svg.setAttribute("height", L * cell + 2);
  const maxSlots = Math.max(1, ...s.slots);
  for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
    const i = l * H + h, r = document.createElementNS(svgNS, "rect");
    r.setAttribute("x", 1 + h * cell); r.setAttribute("y", 1 + l * cell); r.setAttribute("width", cell - 1); r.setAttribute("height", cell - 1);
    const f = s.slots[i] / maxSlots;
    r.setAttribute("fill", `rgba(47,111,222,${(0.12 + 0.88 * f).toFixed(3)})`);
    const tip = document.createElementNS(svgNS, "title");
    tip.textContent = `layer ${l} head ${h}: ${s.slots[i]} slots, ${s.pages[i]} pages (${s.shared_pages[i]} shared)`;
    r.appendChild(tip); svg.appendChild(r);
    if (cell >= 18) {
      const t = document.createElementNS(svgNS, "text");
      t.setAttribute("x", 1 + h * cell + cell / 2 - 0.5); t.setAttribute("y", 1 + l * cell + cell / 2 + 3);
      t.setAttribute("font-size", "9"); t.setAttribute("text-anchor", "middle"); t.setAttribute("fill", f > 0.55 ? "#fff" : "#123");
      t.textContent = s.pages[i]; svg.appendChild(t);
    }
  }
  return svg;
}
function render(st) {
  $("model").textContent = st.model; $("step").textContent = st.step; $("status").textContent = "live";
  $("pool-active").textContent = st.pool.active; $("pool-cached").textContent = st.pool.cached; $("pool-free").textContent = st.pool.free;
  $("pool-total").textContent = st.pool.total; $("page-bytes").textContent = fmt(st.page_bytes);
  $("cold-records").textContent = st.cold.records; $("cold-used").textContent = fmt(st.cold.used_bytes);
  $("resident").textContent = fmt(st.resident_bytes) + " hot, " + fmt(st.cold.used_bytes) + " cold";
  poolBar(st.pool);
  history.push([st.t, st.resident_bytes, st.cold.used_bytes]); if (history.length > 600) history.shift();
  chart();
  $("seq-count").textContent = st.sequences.length;
  const box = $("seqs"); box.innerHTML = "";
  const seen = new Set();
  for (const s of st.sequences) {
    seen.add(s.id);
    const prev = last.get(s.id), div = document.createElement("div");
    div.className = "seq"; div.dataset.id = s.id;
    if (!prev) log(`#${s.id} ${s.state} (${s.policy}${s.budget ? " budget " + s.budget : ""}, prompt ${s.prompt_tokens} tokens)`);
    const before = prev || {compactions: 0, evicted_tokens: 0, recalled_pages: 0};  // first sight: since it started
    if (s.compactions > before.compactions) { div.classList.add("flash"); log(`#${s.id} compacted: ${s.evicted_tokens - before.evicted_tokens} tokens evicted, ${s.compactions} compactions`); }
    if (s.recalled_pages > before.recalled_pages) { div.classList.add("flash"); log(`#${s.id} recalled ${s.recalled_pages - before.recalled_pages} pages from the cold tier`); }
    if (prev && s.preemptions > prev.preemptions) log(`#${s.id} preempted (${s.state})`);
    const pages = s.pages.reduce((a, b) => a + b, 0);
    div.innerHTML = `<h3>#${s.id} · ${s.state}</h3><div class="meta">${s.policy}${s.budget ? " b" + s.budget : ""} · ${s.computed} tokens · ${pages} pages` +
      (s.evicted_tokens ? ` · evicted ${s.evicted_tokens}` : "") + (s.cold_evicted_pages ? ` · cold ${s.cold_evicted_pages} pg` : "") +
      (s.recalled_pages ? ` · recalled ${s.recalled_pages}` : "") + (s.drift !== null ? ` · drift ${(100 * s.drift).toFixed(1)}%` : "") + `</div>`;
    if (s.slots.length) div.appendChild(grid(s, st.n_layers, st.n_kv_heads));
    box.appendChild(div);
    last.set(s.id, s);
  }
  for (const id of [...last.keys()]) if (!seen.has(id)) { log(`#${id} finished`); last.delete(id); }
}
async function poll() {
  try {
    const r = await fetch("/kv/state", {headers: key ? {Authorization: "Bearer " + key} : {}});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    document.body.dataset.polls = ++polls;
  } catch (e) { $("status").textContent = "error: " + e.message; }
  setTimeout(poll, 500);
}
poll();
</script></body></html>
)KVPAGE";
  return kPage;
}

}  // namespace kvpack::server
