// OpenAI-compatible request parsing and response building, kept free of any HTTP library so that every
// validation rule can be unit-tested with plain JSON. The HTTP wiring lives in server.cpp.
//
// Requests (POST /v1/completions, POST /v1/chat/completions) accept the OpenAI fields max_tokens
// (chat also max_completion_tokens), temperature, top_p, min_p, seed, stop, stream,
// stream_options.include_usage, logprobs (completions: an integer k; chat: a boolean with
// top_logprobs k; k <= 20; streamed too), echo (completions), and these extensions: top_k,
// repeat_penalty, ignore_eos, kv_policy, kv_budget (alone: the recommended policy), priority,
// cache_salt, n (choices: one prefill, its KV pages shared copy-on-write; choice i > 0 samples with
// choice_seed(seed, i)); chat also tools and chat_template_kwargs (into the chat template's context).
// Fields that would silently change semantics if ignored (best_of, echo together with logprobs (prompt
// log-probabilities), non-zero presence/frequency penalties, logit_bias, completions' tools) are
// rejected with a 400 instead. Unknown fields are ignored, as OpenAI clients send many optional ones.
// Omitted sampling fields take the engine's defaults (llama.cpp-like: temperature 0.8, top_k 40,
// top_p 0.95, min_p 0.05); an omitted seed draws a fresh random one per request.
// Nothing in a request can name a file (e.g. no per-request calibration file): the server's KV
// calibration is whatever it was started with.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "compress/config.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "server/chat_template.h"

namespace kvpack::server {

using json = nlohmann::json;

// An error as the client sees it: HTTP status + OpenAI's {"error": {message, type, param, code}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // offending field ("" → null)
  std::string code;   // machine-readable code ("" → null)
};
json error_body(const ApiError& e);
ApiError bad_request(std::string message, std::string param = "", std::string code = "");

struct ApiLimits {
  size_t max_body_bytes = 1 << 20;   // larger bodies: 413
  int32_t max_prompt_tokens = 0;     // 0: context - 1
  int32_t max_tokens_limit = 0;      // largest max_tokens a request may ask for; 0: the context length
  int32_t default_max_tokens = 256;  // when a request gives none (clamped to the limit)
  int32_t max_stop = 16;             // stop strings per request
  int32_t max_choices = 0;           // largest n; 0: the scheduler's max_running (all choices run in one batch)
};

// What the parser needs to know about the model and the server's configuration.
struct ApiContext {
  const Tokenizer* tokenizer = nullptr;
  const ModelConfig* model = nullptr;
  ChatFormat chat_format = ChatFormat::Plain;
  const ChatRenderer* chat = nullptr;  // the model's template (or its fallback); nullptr: chat_format
  compress::CompressConfig default_kv;  // server default policy, overridable per request
  const compress::QueryStats* calibration = nullptr;  // the engine's statistics (nullptr: none; triattention refused)
  int64_t kv_capacity_pages = 0;        // page pool size (an uncompressed prompt must fit)
  int32_t page_size = 16;
  ApiLimits limits;
};

struct ParsedRequest {
  Request spec;                // spec.logprobs: -1 off, else the top alternatives per token
  bool chat = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions: the prompt text is returned before the completion
  std::string echo_text;       // ... this text (the prompt string, or the decoded prompt ids)
};

using ParseResult = std::variant<ParsedRequest, ApiError>;
ParseResult parse_completion_request(const json& body, const ApiContext& ctx);
// `ordered`: the same body with its objects' key order kept (parse_request_body passes it), so `tools` and
// tool calls reach the template's tojson in the client's order; without it they come from `body` (sorted).
ParseResult parse_chat_request(const json& body, const ApiContext& ctx, const jinja::Value* ordered = nullptr);
// Parses a raw body (invalid JSON → 400) and dispatches on `chat`.
ParseResult parse_request_body(std::string_view body, bool chat, const ApiContext& ctx);

// llama-server's tokenizer endpoints (same field names):
//   POST /tokenize   {"content": string, "add_special": bool = false, "with_pieces": bool = false}
//                    → {"tokens": [id, ...]}, or with_pieces {"tokens": [{"id": id, "piece": string}, ...]}
//   POST /detokenize {"tokens": [id, ...]} → {"content": string}   (ids outside the vocabulary: 400)
using JsonResult = std::variant<json, ApiError>;
JsonResult tokenize_body(std::string_view body, const ApiContext& ctx);
JsonResult detokenize_body(std::string_view body, const ApiContext& ctx);

// A model id clients can put in a URL path: runs of anything but [A-Za-z0-9._-] become one '-', no
// leading / trailing '-' ("kvpack testbed qwen3" → "kvpack-testbed-qwen3"); "kvpack" if nothing is left.
std::string model_id_slug(std::string_view name);

// --- responses ---------------------------------------------------------------------------------------

struct ResponseMeta {
  std::string id;      // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0; // unix seconds
  std::string model;
  bool chat = false;
};
ResponseMeta new_response_meta(bool chat, std::string model);  // fresh random id, current time

struct Usage {
  int32_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  // kvpack's own per-request KV figures (usage.kvpack in responses; absent from the OpenAI schema, which
  // clients ignore): preemptions and how they were handled, prefix tokens from the cold tier, KV bytes.
  int32_t preemptions = 0, swap_outs = 0, recomputes = 0, cached_tokens_cold = 0, cached_tokens_shared = 0;
  int64_t peak_kv_bytes = 0, final_kv_bytes = 0, evicted_tokens = 0, compactions = 0;
  int64_t evicted_cold_pages = 0, evicted_cold_bytes = 0;  // evicted tokens kept in the cold tier
  int64_t recalled_pages = 0, recall_bytes_read = 0;        // recall: pages brought back, cold bytes read
  double drift = -1;                                        // the drift estimate's largest value (-1: not measured)
  // The exact drift check (kv_drift_exact): its largest total variation (-1: no check), checks whose most
  // likely token differed, and fallbacks to full KV (either guard).
  double exact_tv = -1;
  int64_t exact_flips = 0, guard_fallbacks = 0;
  int64_t guard_fallbacks_incomplete = 0;  // fallbacks that could not bring every evicted token back
  int64_t guard_fallbacks_refused = 0;     // flagged, but the pool cannot hold the whole KV: stayed compressed
  int32_t swap_ins = 0;
  int64_t freed_pages = 0;                                  // pages compaction returned to the pool
  // n > 1: the prompt's full pages the choices shared (taken by reference from choice 0), and the pages
  // sharing saved (summed over choices 1..n-1: what n unshared prefills would have allocated more).
  int64_t shared_prompt_pages = 0, pages_saved = 0;
  int32_t choices = 1;
  double compaction_seconds = 0, queue_seconds = 0, ttft_seconds = 0;  // engine side
};

// Scheduler finish reasons → OpenAI's: eos / stop string → "stop"; max_tokens / context → "length".
std::string openai_finish_reason(FinishReason r);

// The usage figures of a finished request (page_bytes: bytes per KV page; kv_streams: layers x KV heads).
Usage usage_from_stats(const RequestStats& st, int64_t page_bytes, int64_t kv_streams);
json usage_json(const Usage& u);
// One request's usage from its choices' (n > 1; OpenAI counts the prompt once): prompt and cache figures
// and queue / first-token times from choice 0, completion tokens and the KV event counts and bytes
// summed over choices (a shared page counts in every choice's KV bytes), drift the largest.
Usage combine_usage(const std::vector<Usage>& per_choice);
// The logprobs object of a choice, in the endpoint's shape. Chat: {"content": [{"token", "logprob",
// "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}. Completions (legacy):
// {"tokens", "token_logprobs", "top_logprobs": [{piece: logprob}], "text_offset"}; text_offset counts
// bytes from the start of the choice's text, starting at `offset0` (the echoed prompt's length).
json logprobs_json(bool chat, const std::vector<TokenLogprob>& lps, const Tokenizer& tok, int64_t offset0 = 0);
// `logprobs`: null, or logprobs_json's object.
json completion_response(const ResponseMeta& m, const std::string& text, const std::string& finish_reason, const Usage& u,
                         const json& logprobs = nullptr);
// The same with several choices (n > 1), index = position in `choices`.
struct ChoiceOut {
  std::string text;
  std::string finish_reason;
  json logprobs;  // null or logprobs_json's object
};
json completion_response(const ResponseMeta& m, const std::vector<ChoiceOut>& choices, const Usage& u);
// One streamed chunk: a text delta (finish_reason empty → null), or the closing chunk with its finish
// reason. For chat, the first chunk (first_chunk) carries delta.role = "assistant".
json stream_chunk(const ResponseMeta& m, const std::string& text, const std::string& finish_reason, bool first_chunk,
                  const json& logprobs = nullptr, int32_t index = 0);
// The extra last chunk of stream_options.include_usage: empty choices and the usage.
json usage_chunk(const ResponseMeta& m, const Usage& u);
std::string sse_event(const json& j);  // "data: <json>\n\n"
// Compact JSON text; invalid UTF-8 (a flushed partial character at the end of a generation) is replaced.
std::string dump_json(const json& j);

// Constant-time comparison of an Authorization header against "Bearer <key>" (the time does not
// depend on where the first mismatching byte is).
bool bearer_matches(std::string_view header, std::string_view key);

// Stable 64-bit hash for cache_salt (non-zero for any non-empty salt; 0 means "no salt").
uint64_t salt_hash(std::string_view s);

}  // namespace kvpack::server
