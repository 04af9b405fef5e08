#!/usr/bin/env node
// llama.cpp side of `kvpack bench peer`: drives llama.cpp through the npm package node-llama-cpp
// (prebuilt linux-x64 CPU binaries, or llama.cpp built from the source bundled in the package).
//
// Two modes:
//   --serve   JSON lines on stdin, one JSON line per reply on stdout (what `kvpack bench peer` uses,
//             so that each phase runs on kvpack and llama.cpp back to back):
//               {"cmd":"prefill","n":512,"reps":3,"warmup":1}
//               {"cmd":"fill","depth":2048}          (KV to 2048 tokens by real prefill)
//               {"cmd":"steps","n":8,"warmup":1}      (decode steps on top of the current state)
//               {"cmd":"decode","depth":2048,"tokens":32,"warmup":2}   (fill + steps)
//               {"cmd":"batchOpen","sequences":8,"depth":512,"steps":32}   (a context of its own with 8
//                  sequences, each prefilled with 512 random tokens, room for 32 more)
//               {"cmd":"batchSteps","n":8,"warmup":1}   (rounds in which every sequence decodes one token,
//                  all in one llama_decode batch)
//               {"cmd":"batchClose"}
//               {"cmd":"quit"}
//   otherwise a whole plan from the flags (--prompt-tokens, --depths, --decode-tokens), printed as
//             text, or as one JSON object with --json.
//   --build-source  builds llama.cpp from the bundled source (offline: the npm package carries a git
//             bundle of its llama.cpp release) and exits.
//
// Timing: wall time around each llama_decode call as seen from JS (node-llama-cpp dispatches batches
// with setImmediate, a few microseconds). Decode steps include greedy sampling over the vocabulary,
// as kvpack's steps include an argmax over the logits. Logs go to stderr, results to stdout.
import process from "node:process";
import readline from "node:readline";
import { readFile, stat, mkdir, rename, unlink } from "node:fs/promises";
import { createHash } from "node:crypto";
import path from "node:path";

const argv = process.argv.slice(2);
function flag(name) {
  return argv.includes(name);
}
function opt(name, def) {
  const i = argv.indexOf(name);
  if (i < 0) return def;
  if (i + 1 >= argv.length) throw new Error(`${name} needs a value`);
  return argv[i + 1];
}
function log(msg) {
  process.stderr.write(`[llama.cpp] ${msg}\n`);
}

const modelPath = opt("--model", opt("-m", null));
const threads = Number(opt("--threads", "2"));
const variant = opt("--variant", "prebuilt"); // prebuilt | source
const flashAttention = opt("--flash-attn", "off") === "on";
const batchSize = Number(opt("--batch", "512"));
const promptTokens = Number(opt("--prompt-tokens", "512"));
const depths = opt("--depths", "0").split(",").filter((s) => s !== "").map(Number);
const decodeTokens = Number(opt("--decode-tokens", "32"));
const reps = Number(opt("--reps", "3"));
const allowBuild = flag("--build"); // build from source if the source variant is missing
const verbose = flag("--verbose");
// --fill-cache DIR: keep each filled KV state in DIR (llama.cpp's own sequence state file, ~112 KiB per token
// for the Qwen3-0.6B shape: 3.6 GB at 32K) and load it on the next run instead of refilling; a 32K fill by
// real prefill takes most of an hour on 2 cores with flash attention off. With a cache every fill starts
// from an empty sequence (not appended to the previous depth), so a state depends only on its key.
const fillCache = opt("--fill-cache", null);
let contextSize = Number(opt("--ctx", "0"));
if (!contextSize) contextSize = Math.max(...depths, promptTokens) + decodeTokens + 64;

let nlc;
try {
  nlc = await import("node-llama-cpp");
} catch (e) {
  log(`cannot import node-llama-cpp (${e.message}); run \`npm install --omit=optional --ignore-scripts\` in scripts/peer`);
  process.exit(3);
}
const { getLlama, LlamaLogLevel } = nlc;

// A no-op CMake option gives the prebuilt request a build-folder name of its own, so a local build
// in the default folder is never picked up by mistake; prebuilt binaries do not have to match
// custom CMake options (existingPrebuiltBinaryMustMatchBuildOptions defaults to false).
const PREBUILT_MARKER = { KVPACK_PEER_PREBUILT: "1" };

async function loadLlama() {
  const common = {
    gpu: false,
    maxThreads: threads,
    logLevel: verbose ? LlamaLogLevel.info : LlamaLogLevel.warn,
    progressLogs: "stderr",
  };
  if (flag("--build-source")) {
    log("building llama.cpp from the source bundled in node-llama-cpp (GGML_NATIVE=ON, OpenMP if found); this takes a while on 2 cores");
    return getLlama({ ...common, build: "forceRebuild" });
  }
  if (variant === "prebuilt") {
    const llama = await getLlama({ ...common, build: "never", cmakeOptions: PREBUILT_MARKER });
    if (llama.buildType !== "prebuilt") throw new Error(`asked for the prebuilt binaries, got a ${llama.buildType}`);
    return llama;
  }
  if (variant === "source") {
    try {
      const llama = await getLlama({ ...common, build: "never", usePrebuiltBinaries: false });
      if (llama.buildType !== "localBuild") throw new Error(`asked for a local build, got ${llama.buildType}`);
      return llama;
    } catch (e) {
      if (!allowBuild) {
        log(`no usable source build (${e.message.split("\n")[0]}); build it with --build-source (or pass --build)`);
        process.exit(4);
      }
      log("no source build yet: building llama.cpp from the bundled source (takes a while on 2 cores)");
      return getLlama({ ...common, build: "forceRebuild" });
    }
  }
  throw new Error(`unknown --variant ${variant} (prebuilt | source)`);
}

function rng(seed) {
  // xorshift32: reproducible token ids
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x;
  };
}

const t0 = performance.now();
const llama = await loadLlama();
if (flag("--build-source")) {
  log(`built: ${llama.buildType}`);
  console.log(JSON.stringify({ event: "built", buildType: llama.buildType, llamaCpp: llama.llamaCppRelease }));
  await llama.dispose();
  process.exit(0);
}
if (!modelPath) throw new Error("--model is required");
let model;
try {
  model = await llama.loadModel({ modelPath, gpuLayers: 0, useMmap: true });
} catch (e) {
  log(`llama.cpp refused the model: ${e.message}`);
  console.log(JSON.stringify({ event: "error", where: "loadModel", message: String(e.message) }));
  process.exit(5);
}
const context = await model.createContext({
  contextSize,
  batchSize,
  threads: { ideal: threads, min: threads },
  flashAttention,
  sequences: 1,
  // KV cache type: node-llama-cpp's default is F16 for K and V (llama.cpp's default), left as is.
});
const seq = context.getSequence();
const vocabSize = model.fileInsights?.vocabularySize ?? model.fileInfo?.metadata?.[model.fileInfo.metadata.general.architecture]?.vocab_size;
const nTokens = Number(vocabSize ?? 151936);
const loadSeconds = (performance.now() - t0) / 1e3;
const info = {
  event: "ready",
  variant,
  buildType: llama.buildType,
  llamaCpp: llama.llamaCppRelease,
  nodeLlamaCpp: JSON.parse(await readFile(new URL("../package.json", import.meta.resolve("node-llama-cpp")), "utf8")).version,
  systemInfo: llama.systemInfo,
  threads: context.currentThreads,
  contextSize: context.contextSize,
  batchSize: context.batchSize,
  flashAttention: context.flashAttention,
  kvType: "f16",
  nVocab: nTokens,
  loadSeconds,
};

function randomTokens(n, r) {
  // skip the first 300 ids (byte tokens / specials in small vocabularies do not matter for speed,
  // but keep clear of control tokens anyway)
  const out = new Array(n);
  for (let i = 0; i < n; ++i) out[i] = 300 + (r() % (nTokens - 300));
  return out;
}

async function prefill({ n = promptTokens, reps: r = reps, warmup = 1, seed = 1 }) {
  const rand = rng(seed);
  const seconds = [];
  for (let i = 0; i < warmup + r; ++i) {
    await seq.clearHistory();
    const toks = randomTokens(n, rand);
    // logits for the last token only, as in a real prompt (kvpack does the same)
    const input = toks.map((t, j) => (j === n - 1 ? [t, { generateNext: { token: true } }] : t));
    const a = performance.now();
    await seq.controlledEvaluate(input);
    const s = (performance.now() - a) / 1e3;
    if (i >= warmup) seconds.push(s);
  }
  await seq.clearHistory();
  return { event: "prefill", n, seconds };
}

// Fills the sequence to `depth` tokens (appending to what it already holds when that is shorter,
// so ascending depths cost one prefill in total; a longer sequence is cleared and refilled).
async function fill({ depth, seed = 7 }) {
  const rand = rng(seed + depth);
  let fillSeconds = 0,
    filled = 0;
  const cached = fillCache ? await cacheFile(depth, seed) : null;
  const exists = cached && depth > 0 && (await stat(cached).then(() => true, () => false));
  if (cached || seq.nextTokenIndex > depth) await seq.clearHistory();
  if (exists) {
    try {
      const a = performance.now();
      await seq.loadStateFromFile(cached, { acceptRisk: true });
      if (seq.nextTokenIndex !== depth) throw new Error(`holds ${seq.nextTokenIndex} tokens, not ${depth}`);
      log(`KV state for depth ${depth} loaded from ${cached} in ${((performance.now() - a) / 1e3).toFixed(1)} s`);
      return { event: "fill", depth, fillTokens: 0, fillSeconds: 0, cached: true, tokens: seq.nextTokenIndex };
    } catch (e) {
      log(`fill cache ${cached} not usable (${e.message}): filling by prefill`);
      await seq.clearHistory();
    }
  }
  const need = depth - seq.nextTokenIndex;
  if (need > 0) {
    log(`filling the KV cache to ${depth} tokens (${need} more, real prefill)`);
    const a = performance.now();
    const chunk = 2048;
    for (let done = 0; done < need; done += chunk) {
      await seq.evaluateWithoutGeneratingNewTokens(randomTokens(Math.min(chunk, need - done), rand));
      if (need > chunk) process.stderr.write(`\r[llama.cpp]   ${seq.nextTokenIndex}/${depth} tokens, ${((performance.now() - a) / 1e3).toFixed(0)} s`);
    }
    if (need > chunk) process.stderr.write("\n");
    fillSeconds = (performance.now() - a) / 1e3;
    filled = need;
    if (cached) {
      // Written under a temporary name and renamed: an interrupted save never leaves a truncated state.
      const tmp = `${cached}.${process.pid}.tmp`;
      try {
        const { fileSize } = await seq.saveStateToFile(tmp);
        await rename(tmp, cached);
        log(`KV state for depth ${depth} saved to ${cached} (${(fileSize / 2 ** 20).toFixed(0)} MiB)`);
      } catch (e) {
        log(`could not save the fill cache ${cached}: ${e.message}`);
        await unlink(tmp).catch(() => {});
      }
    }
  }
  return { event: "fill", depth, fillTokens: filled, fillSeconds, tokens: seq.nextTokenIndex };
}

// The cache file of the state "depth random tokens from seed, from empty": keyed by everything that
// shapes that state (the model file by path, size and mtime; llama.cpp release and build; context and
// batch size; flash attention; the tokens' seed and count).
async function cacheFile(depth, seed) {
  await mkdir(fillCache, { recursive: true });
  const st = await stat(modelPath);
  const key = JSON.stringify({
    model: path.resolve(modelPath), size: st.size, mtime: st.mtimeMs, llamaCpp: llama.llamaCppRelease,
    buildType: llama.buildType, contextSize: context.contextSize, batchSize: context.batchSize, flashAttention,
    seed, depth, format: 1,
  });
  const h = createHash("sha256").update(key).digest("hex").slice(0, 16);
  return path.join(fillCache, `llama-fill-${depth}-${h}.state`);
}

// Times `warmup + n` single-token decode steps on top of the current state, warm-up dropped.
let stepSeed = 99;
async function steps({ n = decodeTokens, warmup = 2 }) {
  const rand = rng(++stepSeed);
  const startTokens = seq.nextTokenIndex;
  const out = [];
  const it = seq.evaluate(randomTokens(1, rand), { temperature: 0, yieldEogToken: true });
  for (let i = 0; i < warmup + n; ++i) {
    const a = performance.now();
    const res = await it.next();
    const s = (performance.now() - a) / 1e3;
    if (res.done) throw new Error("generation ended early");
    if (i >= warmup) out.push(s);
  }
  await it.return();
  return { event: "steps", startTokens, steps: out, endTokens: seq.nextTokenIndex };
}

async function decode({ depth, tokens = decodeTokens, warmup = 2, seed = 7 }) {
  const f = await fill({ depth, seed });
  const st = await steps({ n: tokens, warmup });
  return { ...f, ...st, event: "decode" };
}

// Batched decode: `sequences` sequences of one context (a context of its own, opened by batchOpen and
// prefilled there) decode one token each per round, all in one llama_decode: the tokens are queued in the
// same event-loop cycle and maximumParallelism keeps every sequence in the batch.
let batchState = null;
async function batchClose() {
  if (!batchState) return { event: "batchClosed" };
  await Promise.all(batchState.its.map((it) => it.return()));
  await batchState.ctx.dispose();
  batchState = null;
  return { event: "batchClosed" };
}
async function batchOpen({ sequences, depth, steps: n = decodeTokens, seed = 11 }) {
  await batchClose();
  const ctx = await model.createContext({
    contextSize: depth + n + 64,
    batchSize,
    threads: { ideal: threads, min: threads },
    flashAttention,
    sequences,
  });
  const seqs = [];
  for (let i = 0; i < sequences; ++i) seqs.push(ctx.getSequence());
  const rand = rng(seed + depth * 131 + sequences);
  const a = performance.now();
  // Each sequence its own prompt, evaluated concurrently, so llama.cpp packs them into shared batches.
  await Promise.all(seqs.map((s) => s.evaluateWithoutGeneratingNewTokens(randomTokens(depth, rand))));
  const fillSeconds = (performance.now() - a) / 1e3;
  const its = seqs.map((s) => s.evaluate(randomTokens(1, rand), { temperature: 0, yieldEogToken: true }));
  batchState = { ctx, seqs, its };
  return { event: "batchOpen", sequences, depth, fillTokens: depth * sequences, fillSeconds, contextSize: ctx.contextSize };
}
// `warmup + n` rounds on the open batch; seconds of each timed round.
async function batchSteps({ n = decodeTokens, warmup = 1 }) {
  if (!batchState) throw new Error("no open batch (batchOpen first)");
  const rounds = [];
  for (let i = 0; i < warmup + n; ++i) {
    const b = performance.now();
    const res = await Promise.all(batchState.its.map((it) => it.next()));
    const s = (performance.now() - b) / 1e3;
    if (res.some((r) => r.done)) throw new Error("generation ended early");
    if (i >= warmup) rounds.push(s);
  }
  const tokens = batchState.seqs.map((s) => s.nextTokenIndex);
  return { event: "batchSteps", rounds, minTokens: Math.min(...tokens), maxTokens: Math.max(...tokens) };
}

const median = (a) => {
  const s = [...a].sort((x, y) => x - y);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

if (flag("--serve")) {
  console.log(JSON.stringify(info));
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    if (!line.trim()) continue;
    let req;
    try {
      req = JSON.parse(line);
    } catch {
      console.log(JSON.stringify({ event: "error", message: "bad JSON" }));
      continue;
    }
    try {
      if (req.cmd === "quit") break;
      else if (req.cmd === "prefill") console.log(JSON.stringify(await prefill(req)));
      else if (req.cmd === "decode") console.log(JSON.stringify(await decode(req)));
      else if (req.cmd === "fill") console.log(JSON.stringify(await fill(req)));
      else if (req.cmd === "steps") console.log(JSON.stringify(await steps(req)));
      else if (req.cmd === "batchOpen") console.log(JSON.stringify(await batchOpen(req)));
      else if (req.cmd === "batchSteps") console.log(JSON.stringify(await batchSteps(req)));
      else if (req.cmd === "batchClose") console.log(JSON.stringify(await batchClose()));
      else console.log(JSON.stringify({ event: "error", message: `unknown cmd ${req.cmd}` }));
    } catch (e) {
      console.log(JSON.stringify({ event: "error", message: String(e.message) }));
    }
  }
} else {
  const results = { ...info, prefill: null, decode: [] };
  if (!flag("--json")) log(`${info.buildType} llama.cpp ${info.llamaCpp.release}, ${info.threads} threads, ctx ${info.contextSize}, flash attention ${info.flashAttention}`);
  if (promptTokens > 0) {
    results.prefill = await prefill({ n: promptTokens });
    if (!flag("--json")) console.log(`prefill n=${promptTokens} llama.cpp=${(promptTokens / median(results.prefill.seconds)).toFixed(2)} tok/s`);
  }
  for (const d of [...depths].sort((a, b) => a - b)) {
    const r = await decode({ depth: d });
    results.decode.push(r);
    if (!flag("--json"))
      console.log(`decode depth=${d} llama.cpp=${(1 / median(r.steps)).toFixed(2)} tok/s` + (r.fillTokens ? ` (filled ${r.fillTokens} tokens in ${r.fillSeconds.toFixed(1)} s)` : ""));
  }
  if (flag("--json")) console.log(JSON.stringify(results));
}
await context.dispose();
await model.dispose();
await llama.dispose();
process.exit(0); // stdin may still be open (serve mode): do not wait for it
