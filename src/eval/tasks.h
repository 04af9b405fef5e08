// Long-dependency tasks for the quality harness (DESIGN.md §5 "task accuracy"), RULER-style
// (research/policies.md §2.1), generated from a seed at a chosen context length and scored by exact
// match of a generated answer several tokens long, so that KV compression is exercised while the
// answer is decoded after a long prompt.
//
// Three kinds (formats in docs/quality.md; every string is plain ASCII words, digits and punctuation,
// so any tokenizer can read them):
//   needle    multi-key needle retrieval: 4 needles "The magic number for KEY is: VALUE." in filler
//             (keys adjective-noun; 3 distractor keys, one sharing the queried key's adjective, one its
//             noun; 7-digit values); the queried needle's relative depth is swept by the caller.
//   vartrack  variable tracking: 2 chains "VAR AAAAA = 12345." -> "VAR BBBBB = VAR AAAAA." ... (4 hops,
//             lines in chain order at random depths, interleaved); asks the value of the last variable of
//             one chain; the answer traces the chain to its 5-digit number: " VAR D = VAR C = ... = 12345".
//   pointer   pointer chasing / recursive state query: link lines "ABCD -> EFGH" (4 uppercase letters)
//             scattered in random order, the queried chain of 4 hops plus 12 distractor links in other
//             chains; the answer is the whole path "EFGH -> IJKL -> MNOP -> QRST", so every generated
//             step must look far back for the next link.
//   walk      the decode regime (not in "all"): link lines as in pointer; the answer walks 4 links from the
//             start node, counts down from K to 0 (K = 128, a fixed part of the task: ~420 answer tokens), and
//             repeats the answer line: " B -> C -> D -> E. Then count down from 128: 128, ..., 1, 0. Answer:
//             A -> B -> C -> D -> E". The repeat copies what the model itself wrote ~390 tokens earlier (each
//             count depends only on the one before it), so compression during decode decides it: the regime
//             TriAttention was designed for (long generation whose early tokens matter again later).
// The prompt ends right before the answer (no trailing space); the answer starts with a space.
// Scoring: whitespace is removed from both strings and the generation must start with the answer.
//
// Sizing: filler lines are added (binary search) until tokens(BOS + prompt) + answer tokens + margin is as
// large as fits in ctx_tokens. With no tokenizer, lengths are counted in bytes (character-level models).
// Randomness: splitmix64 from the seed, no std:: distributions, so a seed gives the same task with any
// standard library (the trainer reproduces the data from `kvpack eval gen-tasks`).
// Thread-safety: pure functions; safe to call concurrently.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "compress/compressor.h"
#include "compress/config.h"
#include "tokenizer/tokenizer.h"

namespace kvpack {
class Engine;
}

namespace kvpack::eval {

enum class TaskKind { Needle, VarTrack, Pointer, Walk };

// "needle", "vartrack", "pointer", "walk"; throws std::invalid_argument listing the valid names.
TaskKind parse_task(const std::string& name);
const char* task_name(TaskKind k);
// The prompt-regime tasks (needle, vartrack, pointer): what "all" means. walk is asked for by name: its
// answers are hundreds of tokens (a run costs several times as much) and the testbed model was not trained on it.
std::vector<TaskKind> all_tasks();
// "all" -> all_tasks(), else a comma-separated list of names ("all" may be one of them: "all,walk").
std::vector<TaskKind> parse_tasks(const std::string& list);

// Deterministic 64-bit generator (splitmix64).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next();
  uint64_t below(uint64_t n);  // [0, n), n > 0
  double unit();               // [0, 1)
 private:
  uint64_t s_;
};

// Seed of sample `index` of a run with base seed `seed` (what `eval tasks` and `gen-tasks` use).
uint64_t sample_seed(uint64_t seed, TaskKind kind, int32_t index);

struct TaskOptions {
  // needle: relative depth in [0, 1] of the queried needle among the filler lines; < 0: drawn from the seed.
  double depth = -1;
  // Filler lines (e.g. filler_sentences(text of --filler FILE)); empty: the built-in deterministic filler.
  std::vector<std::string> filler;
  int32_t gen_margin = 8;  // generated tokens allowed beyond the answer
  // Generate only answer_tokens (the same prompts; the margin still sizes them): the generation is the
  // scored span alone, so per-request figures such as the exact drift check cover the answer and nothing
  // after it (the drift detector's evaluation).
  bool answer_only = false;
  // needle: number of needles, kNeedlesMin..kNeedlesMax. The harness always uses 4; more (random extra keys,
  // not built to share a word with the queried one, drawn after the first four so that 4 gives the same
  // prompts) are for training data, where each needle is one more question the trainer can ask.
  int32_t needles = 4;
  // vartrack: number of chains, kChainsMin..kChainsMax. The harness always uses 2 (the question is about the
  // first); more (names and numbers distinct from all others, drawn after the first two so that 2 gives the
  // same prompts) are for training data: each extra chain's last variable is one more 4-hop question.
  int32_t chains = 2;
  // walk: where the count down starts; 0: kWalkCountDefault at every context. A fixed part of the task, not
  // drawn per prompt: the testbed model did not learn to copy a varying count from the question (~1000 samples,
  // docs/testbed.md §12), and the count is only there to put ~400 generated tokens between the walk and its repeat.
  int32_t walk_count = 0;
  // Called after each sample of run_task with the samples done so far (progress; may be empty).
  std::function<void(int32_t)> on_sample;
};
constexpr int32_t kNeedlesMin = 4, kNeedlesMax = 32;
constexpr int32_t kChainsMin = 2, kChainsMax = 8;
constexpr int32_t kWalkCountMin = 8, kWalkCountMax = 999;  // 999: numbers stay one token with 3-digit tokenizers
constexpr int32_t kWalkCountDefault = 128;                   // ~420 answer tokens with the testbed's digit tokens

struct Task {
  TaskKind kind = TaskKind::Needle;
  uint64_t seed = 0;
  int32_t ctx_target = 0;
  std::string prompt;         // ends right before the answer
  std::string answer;         // expected continuation (starts with a space)
  int32_t prompt_tokens = 0;  // tokens of the prompt, BOS included when the tokenizer has one (bytes without)
  int32_t answer_tokens = 0;  // tokens the answer adds after the prompt
  int32_t max_tokens = 0;     // generation length: answer_tokens + gen_margin (prompt_tokens + max_tokens <= ctx)
  double depth = 0;           // relative depth of the first relevant line (queried needle / chain start)
  int32_t filler_lines = 0;
};

// Makes one task. tok == nullptr: sizes in bytes. Throws std::invalid_argument when ctx_tokens is too
// small for the task's fixed parts.
Task make_task(TaskKind kind, int32_t ctx_tokens, uint64_t seed, const Tokenizer* tok, const TaskOptions& opt = {});

// Exact match: whitespace removed from both, `generated` must start with `expected` (non-empty).
bool score_answer(std::string_view generated, std::string_view expected);

// Filler lines from real text: sentences split at . ! ? (whitespace normalised, underscores dropped),
// keeping those of 3..30 words that are printable ASCII with no digits, no "->", and no run of two
// uppercase letters (so they cannot collide with needle values, variable names or link keys).
std::vector<std::string> filler_sentences(std::string_view text);
// The built-in filler line number `index` for `seed` (simple lowercase sentences, no digits).
std::string builtin_filler(uint64_t seed, int64_t index);

// ---- Running tasks on an engine ------------------------------------------------------------------------

struct TaskSample {
  Task task;
  std::string generated;
  bool correct = false;
  size_t peak_resident_kv_bytes = 0;
  compress::RecallStats recall;  // recall checks of this sample (drift estimate, pages recalled)
  kv::EvictedStats evicted;      // evicted slots kept in the cold tier
};

struct TaskResult {
  TaskKind kind = TaskKind::Needle;
  int32_t n = 0, correct = 0;
  double accuracy = 0;             // correct / n
  double mean_prompt_tokens = 0;
  size_t peak_resident_kv_bytes = 0;  // max over samples
  compress::CompressionStats compression;  // summed over samples
  std::vector<TaskSample> samples;
};

// Runs n samples (seeds sample_seed(seed, kind, i); needle depth swept i / (n - 1) unless opt.depth >= 0)
// with greedy generation under `kv` on `engine` (its calibration is used for triattention).
TaskResult run_task(Engine& engine, TaskKind kind, int32_t ctx_tokens, int32_t n, uint64_t seed,
                    const compress::CompressConfig& kv, const TaskOptions& opt = {});

}  // namespace kvpack::eval
