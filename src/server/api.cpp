#include "server/api.h"

#include <cctype>
#include <cstdio>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <random>
#include <stdexcept>

namespace kvpack::server {
namespace {

// Parsing throws an ApiError internally; the public entry points turn it into a ParseResult.
[[noreturn]] void fail(std::string message, std::string param = "", std::string code = "") {
  throw bad_request(std::move(message), std::move(param), std::move(code));
}

// The field, or nullptr when absent or JSON null (OpenAI treats null as "not given").
const json* field(const json& b, const char* name) {
  auto it = b.find(name);
  if (it == b.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t as_int(const json& v, const char* name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) fail(std::string("'") + name + "' must be an integer", name);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    fail(std::string("'") + name + "' must be at most " + std::to_string(hi), name);
  const int64_t x = v.get<int64_t>();
  if (x < lo) fail(std::string("'") + name + "' must be at least " + std::to_string(lo), name);
  if (x > hi) fail(std::string("'") + name + "' must be at most " + std::to_string(hi), name);
  return x;
}

double as_number(const json& v, const char* name, double lo, double hi) {
  if (!v.is_number()) fail(std::string("'") + name + "' must be a number", name);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "'%s' must be between %g and %g", name, lo, hi);
    fail(buf, name);
  }
  return x;
}

bool as_bool(const json& v, const char* name) {
  if (!v.is_boolean()) fail(std::string("'") + name + "' must be a boolean", name);
  return v.get<bool>();
}

std::string as_string(const json& v, const char* name) {
  if (!v.is_string()) fail(std::string("'") + name + "' must be a string", name);
  return v.get<std::string>();
}

bool truthy(const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string()) return !v.get<std::string>().empty();
  if (v.is_array() || v.is_object()) return !v.empty();
  return false;
}

uint64_t random_seed() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return rng();
}

// Fields shared by both endpoints: sampling, limits, stop strings, streaming, KV extensions.
void parse_common(const json& b, const ApiContext& ctx, ParsedRequest& r) {
  // Features we do not implement are refused rather than silently ignored.
  // n: every choice runs in the same batch, so at most max_running of them.
  if (const json* v = field(b, "n")) r.spec.n = static_cast<int32_t>(as_int(*v, "n", 1, ctx.limits.max_choices > 0 ? ctx.limits.max_choices : 128));
  if (const json* v = field(b, "best_of"); v && as_int(*v, "best_of", 1, 1 << 20) != 1)
    fail("only best_of = 1 is supported (n > 1 returns every choice)", "best_of");
  for (const char* k : {"logit_bias", "suffix", "functions"})
    if (const json* v = field(b, k); v && truthy(*v)) fail(std::string("'") + k + "' is not supported by this server", k);
  for (const char* k : {"presence_penalty", "frequency_penalty"})
    if (const json* v = field(b, k); v && as_number(*v, k, -2, 2) != 0)
      fail(std::string("'") + k + "' is not supported; use the 'repeat_penalty' extension", k);
  if (const json* v = field(b, "response_format")) {
    if (!v->is_object() || v->value("type", "text") != "text")
      fail("only response_format {\"type\": \"text\"} is supported", "response_format");
  }
  if (const json* v = field(b, "model")) as_string(*v, "model");  // one model per server: any name is accepted

  if (const json* v = field(b, "stream")) r.stream = as_bool(*v, "stream");
  if (const json* v = field(b, "stream_options")) {
    if (!v->is_object()) fail("'stream_options' must be an object", "stream_options");
    if (const json* u = field(*v, "include_usage")) r.include_usage = as_bool(*u, "stream_options.include_usage");
  }

  const int32_t n_ctx = ctx.model->n_ctx;
  const int32_t limit = ctx.limits.max_tokens_limit > 0 ? ctx.limits.max_tokens_limit : n_ctx;
  Request& s = r.spec;
  s.max_tokens = std::min(ctx.limits.default_max_tokens, limit);
  for (const char* k : {"max_tokens", "max_completion_tokens"})
    if (const json* v = field(b, k)) s.max_tokens = static_cast<int32_t>(as_int(*v, k, 0, limit));

  SamplingParams& p = s.sampling;
  if (const json* v = field(b, "temperature")) p.temperature = static_cast<float>(as_number(*v, "temperature", 0, 2));
  if (const json* v = field(b, "top_p")) p.top_p = static_cast<float>(as_number(*v, "top_p", 0, 1));
  if (const json* v = field(b, "min_p")) p.min_p = static_cast<float>(as_number(*v, "min_p", 0, 1));
  if (const json* v = field(b, "top_k")) p.top_k = static_cast<int32_t>(std::max<int64_t>(0, as_int(*v, "top_k", -1, 1 << 30)));
  if (const json* v = field(b, "repeat_penalty")) p.repeat_penalty = static_cast<float>(as_number(*v, "repeat_penalty", 0.01, 10));
  const json* seed = field(b, "seed");
  p.seed = seed ? static_cast<uint64_t>(as_int(*seed, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
                : random_seed();

  if (const json* v = field(b, "stop")) {
    if (v->is_string()) {
      s.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (static_cast<int32_t>(v->size()) > ctx.limits.max_stop)
        fail("at most " + std::to_string(ctx.limits.max_stop) + " stop strings are allowed", "stop");
      for (const auto& x : *v) {
        if (!x.is_string()) fail("'stop' must be a string or a list of strings", "stop");
        s.stop.push_back(x.get<std::string>());
      }
    } else {
      fail("'stop' must be a string or a list of strings", "stop");
    }
    for (const auto& st : s.stop)
      if (st.empty()) fail("stop strings must not be empty", "stop");
  }
  if (const json* v = field(b, "ignore_eos")) s.ignore_eos = as_bool(*v, "ignore_eos");
  if (const json* v = field(b, "priority"))
    s.priority = static_cast<int32_t>(as_int(*v, "priority", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
  if (const json* v = field(b, "cache_salt")) s.cache_salt = salt_hash(as_string(*v, "cache_salt"));

  // KV compression: the server default, with policy and budget overridable per request.
  s.kv = ctx.default_kv;
  const json* pol = field(b, "kv_policy");
  const json* bud = field(b, "kv_budget");
  if (pol) {
    try {
      s.kv.policy = compress::parse_policy(as_string(*pol, "kv_policy"));
    } catch (const std::invalid_argument& e) {
      fail(e.what(), "kv_policy", "invalid_kv_policy");
    }
  }
  if (bud) s.kv.budget = static_cast<int32_t>(as_int(*bud, "kv_budget", 0, 1 << 24));
  // kv_budget alone is the one knob: N > 0 on a server without a compressing default picks the
  // recommended policy (as --kv-budget N does on the command line); 0 turns compression off.
  if (bud && !pol) {
    if (s.kv.budget == 0) s.kv.policy = compress::PolicyKind::Full;
    else if (s.kv.policy == compress::PolicyKind::Full) s.kv.policy = compress::kDefaultPolicy;
  }
  // Recall of evicted pages (needs the server's --kv-cold; without it the flag changes nothing).
  if (const json* v = field(b, "kv_recall")) {
    s.kv.recall.enabled = as_bool(*v, "kv_recall");
    s.kv.recall.bring_back = s.kv.recall.enabled;
  }
  // The exact drift check and its guard (compress::RecallConfig::exact / exact_guard; need --kv-cold too).
  // false turns off what the server's defaults switched on (the guard needs the check: both go).
  if (const json* v = field(b, "kv_drift_exact")) {
    if (as_bool(*v, "kv_drift_exact")) {
      s.kv.recall.exact = true;
      s.kv.recall.enabled = true;
    } else {
      s.kv.recall.exact = false;
      s.kv.recall.exact_guard = 0.0f;
    }
  }
  if (const json* v = field(b, "kv_guard_exact")) {
    if (as_bool(*v, "kv_guard_exact")) {
      s.kv.recall.exact = true;
      s.kv.recall.enabled = true;
      if (s.kv.recall.exact_guard <= 0) s.kv.recall.exact_guard = compress::kExactGuardTv;
    } else {
      s.kv.recall.exact_guard = 0.0f;
    }
  }
  if (const json* v = field(b, "kv_drift_exact_every")) {
    s.kv.recall.exact_every = static_cast<int32_t>(as_int(*v, "kv_drift_exact_every", 0, 1 << 20));
  }
  if (s.kv.policy != compress::PolicyKind::Full) {
    try {
      s.kv.validate(*ctx.model, ctx.calibration);
    } catch (const compress::InvalidCompressConfig& e) {
      // A budget the request did not send is the server default: the request's kv_policy is at fault.
      fail(e.what(), e.field() == "kv_budget" && !bud ? "kv_policy" : e.field());
    }
  } else if (bud && s.kv.budget > 0) {
    fail("kv_budget has no effect with kv_policy 'full'; drop kv_policy to get the recommended policy", "kv_budget");
  }
}

// Prompt checks shared by both endpoints (after the prompt tokens are known).
void check_prompt(const ApiContext& ctx, ParsedRequest& r, const char* param) {
  const auto& prompt = r.spec.prompt;
  const int32_t n_ctx = ctx.model->n_ctx;
  if (prompt.empty()) fail("the prompt is empty", param);
  for (int32_t t : prompt)
    if (t < 0 || t >= ctx.model->n_vocab)
      fail("token id " + std::to_string(t) + " is out of range (vocabulary of " + std::to_string(ctx.model->n_vocab) + ")", param);
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n >= n_ctx)
    fail("the prompt has " + std::to_string(n) + " tokens; this model's context is " + std::to_string(n_ctx) +
             " tokens (at most " + std::to_string(n_ctx - 1) + " prompt tokens)",
         param, "context_length_exceeded");
  if (ctx.limits.max_prompt_tokens > 0 && n > ctx.limits.max_prompt_tokens)
    fail("the prompt has " + std::to_string(n) + " tokens; this server accepts at most " +
             std::to_string(ctx.limits.max_prompt_tokens),
         param, "context_length_exceeded");
  // Without compression the whole prompt must fit in the page pool at once.
  if (!r.spec.kv.enabled() && ctx.kv_capacity_pages > 0) {
    const int64_t streams = static_cast<int64_t>(ctx.model->n_layer) * ctx.model->n_head_kv;
    const int64_t pages = streams * ((n + 1 + ctx.page_size - 1) / ctx.page_size);
    if (pages > ctx.kv_capacity_pages)
      fail("the prompt needs " + std::to_string(pages) + " KV pages and the server's pool has " +
               std::to_string(ctx.kv_capacity_pages) + " (try a compressing kv_policy)",
           param, "context_length_exceeded");
  }
}

std::string content_text(const json& c, size_t i) {
  const std::string param = "messages[" + std::to_string(i) + "].content";
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {  // content parts: text only
    std::string s;
    for (const auto& part : c) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
        fail("only text content parts ({\"type\": \"text\", \"text\": ...}) are supported", param);
      s += part["text"].get<std::string>();
    }
    return s;
  }
  fail("message content must be a string or a list of text parts", param);
}

template <class F>
ParseResult guarded(F&& f) {
  try {
    return f();
  } catch (const ApiError& e) {
    return e;
  } catch (const json::exception& e) {  // e.g. a type mismatch we did not anticipate
    return bad_request(std::string("invalid request: ") + e.what());
  }
}

std::string random_hex(size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  uint64_t x = random_seed();
  for (size_t i = 0; i < n; ++i) {
    if (i % 16 == 0 && i > 0) x = random_seed();
    s += digits[x & 15];
    x >>= 4;
  }
  return s;
}

}  // namespace

json error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return json{{"error", err}};
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ParseResult parse_completion_request(const json& b, const ApiContext& ctx) {
  return guarded([&]() -> ParseResult {
    if (!b.is_object()) fail("the request body must be a JSON object");
    if (const json* v = field(b, "tools"); v && truthy(*v)) fail("'tools' is a chat completions field", "tools");
    ParsedRequest r;
    parse_common(b, ctx, r);
    if (const json* v = field(b, "logprobs")) {  // an integer k; some clients send a boolean (true: k = 0)
      if (v->is_boolean()) r.spec.logprobs = v->get<bool>() ? 0 : -1;
      else r.spec.logprobs = static_cast<int32_t>(as_int(*v, "logprobs", 0, kMaxTopLogprobs));
    }
    if (const json* v = field(b, "top_logprobs"); v && truthy(*v))
      fail("'top_logprobs' is a chat completions field; on /v1/completions 'logprobs' is the number of alternatives", "top_logprobs");
    if (const json* v = field(b, "echo")) r.echo = as_bool(*v, "echo");
    if (r.echo && r.spec.logprobs >= 0)
      fail("'echo' with 'logprobs' asks for the prompt's log-probabilities, which this server does not compute", "echo");
    const json* p = field(b, "prompt");
    if (!p) fail("'prompt' is required", "prompt");
    const Tokenizer& tok = *ctx.tokenizer;
    auto encode = [&](const std::string& text) {
      if (text.empty()) fail("the prompt is empty", "prompt");
      return tok.encode(text, tok.add_bos_default());
    };
    if (p->is_string()) {
      r.spec.prompt = encode(p->get<std::string>());
    } else if (p->is_array()) {
      // A list of token ids, or a batch of one prompt ([string] / [[ids]]); larger batches: n/a.
      if (p->empty()) fail("the prompt is empty", "prompt");
      if ((*p)[0].is_string() || (*p)[0].is_array()) {
        if (p->size() != 1) fail("batched prompts are not supported: send one prompt per request", "prompt");
        const json& one = (*p)[0];
        if (one.is_string()) {
          r.spec.prompt = encode(one.get<std::string>());
        } else {
          for (const auto& t : one) r.spec.prompt.push_back(static_cast<int32_t>(as_int(t, "prompt", INT32_MIN, INT32_MAX)));
        }
      } else {
        for (const auto& t : *p) r.spec.prompt.push_back(static_cast<int32_t>(as_int(t, "prompt", INT32_MIN, INT32_MAX)));
      }
    } else {
      fail("'prompt' must be a string or a list of token ids", "prompt");
    }
    check_prompt(ctx, r, "prompt");
    if (r.echo) {
      if (p->is_string()) r.echo_text = p->get<std::string>();
      else if (p->is_array() && !p->empty() && (*p)[0].is_string()) r.echo_text = (*p)[0].get<std::string>();
      else {  // token ids: their text, without the BOS marker
        std::vector<int32_t> ids = r.spec.prompt;
        if (!ids.empty() && ids.front() == tok.bos()) ids.erase(ids.begin());
        r.echo_text = tok.decode(ids);
      }
    }
    return r;
  });
}

ParseResult parse_chat_request(const json& b, const ApiContext& ctx, const jinja::Value* ordered) {
  return guarded([&]() -> ParseResult {
    if (!b.is_object()) fail("the request body must be a JSON object");
    ParsedRequest r;
    r.chat = true;
    parse_common(b, ctx, r);
    // A field of the body for the template, in the client's key order when we have it.
    const jinja::Value ob = ordered && ordered->is_object() ? *ordered : jinja::Value::parse(b.dump());
    ChatOptions topts;
    if (const json* v = field(b, "tools")) {
      if (!v->is_array()) fail("'tools' must be a list of tool definitions", "tools");
      for (const auto& t : *v)
        if (!t.is_object()) fail("'tools' must be a list of objects ({\"type\": \"function\", \"function\": {...}})", "tools");
      if (!v->empty()) {
        if (ctx.chat == nullptr || !ctx.chat->uses_template())
          fail("'tools' needs the model's own chat template to describe them, and this model has none", "tools");
        topts.tools = ob.at("tools");
      }
    }
    if (const json* v = field(b, "chat_template_kwargs")) {
      if (!v->is_object()) fail("'chat_template_kwargs' must be an object (e.g. {\"enable_thinking\": false})", "chat_template_kwargs");
      if (v->contains("messages")) fail("'chat_template_kwargs' cannot set 'messages'", "chat_template_kwargs");
      topts.kwargs = ob.at("chat_template_kwargs");
    }
    const json* lp = field(b, "logprobs");
    const bool want_lp = lp && as_bool(*lp, "logprobs");
    if (const json* v = field(b, "top_logprobs")) {
      const int32_t k = static_cast<int32_t>(as_int(*v, "top_logprobs", 0, kMaxTopLogprobs));
      if (!want_lp && k > 0) fail("'top_logprobs' needs 'logprobs': true", "top_logprobs");
      r.spec.logprobs = k;
    }
    if (want_lp && r.spec.logprobs < 0) r.spec.logprobs = 0;
    if (!want_lp) r.spec.logprobs = -1;
    if (const json* v = field(b, "echo"); v && truthy(*v)) fail("'echo' is a /v1/completions field; chat completions have none", "echo");
    const json* m = field(b, "messages");
    if (!m) fail("'messages' is required", "messages");
    if (!m->is_array() || m->empty()) fail("'messages' must be a non-empty list", "messages");
    std::vector<ChatMessage> msgs;
    for (size_t i = 0; i < m->size(); ++i) {
      const json& x = (*m)[i];
      const std::string at = "messages[" + std::to_string(i) + "]";
      if (!x.is_object()) fail(at + " must be an object", "messages");
      if (!x.contains("role") || !x["role"].is_string()) fail(at + ".role must be a string", at + ".role");
      ChatMessage msg;
      msg.role = x["role"].get<std::string>();
      if (msg.role != "system" && msg.role != "developer" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
        fail(at + ".role must be one of system, developer, user, assistant, tool", at + ".role");
      const json* c = field(x, "content");
      if (c) msg.content = content_text(*c, i);
      else if (msg.role != "assistant") fail(at + ".content is required", at + ".content");
      // Tool calls and tool answers go to the template as given (it decides how they render).
      const jinja::Value& om = ob.at("messages").at(i);
      if (const json* tc = field(x, "tool_calls")) {
        if (!tc->is_array()) fail(at + ".tool_calls must be a list", at + ".tool_calls");
        msg.extra["tool_calls"] = om.at("tool_calls");
      }
      for (const char* k : {"tool_call_id", "name", "reasoning_content"})
        if (const json* f = field(x, k)) msg.extra[k] = as_string(*f, (at + "." + k).c_str());
      msgs.push_back(std::move(msg));
    }
    if (ctx.chat) {
      std::string note;
      try {
        r.spec.prompt = ctx.chat->tokens(msgs, &note, topts);
      } catch (const ChatRefused& e) {
        fail(e.what(), "messages");
      }
      if (!note.empty()) std::fprintf(stderr, "kvpack: %s\n", note.c_str());
      for (auto& st : note.empty() ? ctx.chat->default_stops() : chat_default_stops(ctx.chat->fallback()))
        r.spec.stop.push_back(st);
    } else {
      r.spec.prompt = render_chat_tokens(ctx.chat_format, msgs, *ctx.tokenizer);
      for (auto& st : chat_default_stops(ctx.chat_format)) r.spec.stop.push_back(st);
    }
    check_prompt(ctx, r, "messages");
    return r;
  });
}

ParseResult parse_request_body(std::string_view body, bool chat, const ApiContext& ctx) {
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e400 (found by fuzz_json_api)
    return bad_request(std::string("invalid JSON: ") + e.what(), "", "invalid_json");
  }
  if (!chat) return parse_completion_request(j, ctx);
  jinja::Value ordered = jinja::Value::parse(body.begin(), body.end(), nullptr, false);  // valid: parsed above
  return parse_chat_request(j, ctx, &ordered);
}

namespace {
template <class F>
JsonResult guarded_json(std::string_view body, F&& f) {
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    return bad_request(std::string("invalid JSON: ") + e.what(), "", "invalid_json");
  }
  try {
    if (!j.is_object()) fail("the request body must be a JSON object");
    return f(j);
  } catch (const ApiError& e) {
    return e;
  } catch (const json::exception& e) {
    return bad_request(std::string("invalid request: ") + e.what());
  }
}
}  // namespace

JsonResult tokenize_body(std::string_view body, const ApiContext& ctx) {
  return guarded_json(body, [&](const json& b) -> JsonResult {
    const json* c = field(b, "content");
    if (!c) fail("'content' is required", "content");
    const std::string text = as_string(*c, "content");
    bool add_special = false, with_pieces = false;
    if (const json* v = field(b, "add_special")) add_special = as_bool(*v, "add_special");
    if (const json* v = field(b, "with_pieces")) with_pieces = as_bool(*v, "with_pieces");
    const Tokenizer& tok = *ctx.tokenizer;
    const std::vector<int32_t> ids = tok.encode(text, add_special && tok.bos() >= 0);
    json out = json::array();
    for (int32_t id : ids) {
      if (with_pieces) out.push_back({{"id", id}, {"piece", tok.piece(id)}});
      else out.push_back(id);
    }
    return json{{"tokens", out}};
  });
}

JsonResult detokenize_body(std::string_view body, const ApiContext& ctx) {
  return guarded_json(body, [&](const json& b) -> JsonResult {
    const json* t = field(b, "tokens");
    if (!t) fail("'tokens' is required", "tokens");
    if (!t->is_array()) fail("'tokens' must be a list of token ids", "tokens");
    std::vector<int32_t> ids;
    for (const auto& x : *t) {
      const int64_t id = as_int(x, "tokens", INT32_MIN, INT32_MAX);
      if (id < 0 || id >= ctx.model->n_vocab)
        fail("token id " + std::to_string(id) + " is out of range (vocabulary of " + std::to_string(ctx.model->n_vocab) + ")", "tokens");
      ids.push_back(static_cast<int32_t>(id));
    }
    return json{{"content", ctx.tokenizer->decode(ids)}};
  });
}

std::string model_id_slug(std::string_view name) {
  std::string s;
  bool dash = false;
  for (char ch : name) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      if (dash && !s.empty()) s += '-';
      dash = false;
      s += ch;
    } else {
      dash = true;
    }
  }
  while (!s.empty() && s.back() == '-') s.pop_back();
  return s.empty() ? "kvpack" : s;
}

ResponseMeta new_response_meta(bool chat, std::string model) {
  ResponseMeta m;
  m.chat = chat;
  m.id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
  m.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  m.model = std::move(model);
  return m;
}

std::string openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::Eos:
    case FinishReason::Stop: return "stop";
    case FinishReason::Length:
    case FinishReason::Context: return "length";
    case FinishReason::Cancelled:
    case FinishReason::Error: break;  // never reach a client as a finish reason (503 / 500 instead)
  }
  return finish_reason_name(r);
}

Usage usage_from_stats(const RequestStats& st, int64_t page_bytes, int64_t kv_streams) {
  Usage u{st.prompt_tokens, st.completion_tokens, st.cached_tokens};
  u.preemptions = st.preemptions;
  u.swap_outs = st.swap_outs;
  u.recomputes = st.recomputes;
  u.cached_tokens_cold = st.cached_tokens_cold;
  u.cached_tokens_shared = st.cached_tokens_shared;
  u.peak_kv_bytes = st.peak_kv_pages * page_bytes;
  u.final_kv_bytes = st.kv_pages_in_use * page_bytes;
  u.evicted_tokens = kv_streams > 0 ? st.compression.evicted_slots / kv_streams : 0;
  u.compactions = st.compression.events;
  u.evicted_cold_pages = st.evicted.pages_written;
  u.evicted_cold_bytes = static_cast<int64_t>(st.evicted.bytes_written);
  u.recalled_pages = st.compression.recall.pages_recalled;
  u.recall_bytes_read = static_cast<int64_t>(st.compression.recall.bytes_read);
  u.drift = st.compression.recall.checks > 0 ? st.compression.recall.drift_max : -1.0;
  u.exact_tv = st.compression.recall.exact_checks > 0 ? st.compression.recall.exact_tv_max : -1.0;
  u.exact_flips = st.compression.recall.exact_flips;
  u.guard_fallbacks = st.compression.recall.guard_fallbacks;
  u.guard_fallbacks_incomplete = st.compression.recall.guard_fallbacks_incomplete;
  u.guard_fallbacks_refused = st.compression.recall.guard_fallbacks_refused;
  u.swap_ins = st.swap_ins;
  u.freed_pages = st.compression.freed_pages;
  u.pages_saved = st.fork_shared_pages;
  u.shared_prompt_pages = st.fork_shared_pages;
  u.compaction_seconds = st.compression.seconds;
  u.queue_seconds = st.queue_seconds;
  u.ttft_seconds = st.queue_seconds + st.prefill_seconds;
  return u;
}

json usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
              {"kvpack", {{"preemptions", u.preemptions},
                          {"swap_outs", u.swap_outs},
                          {"recomputes", u.recomputes},
                          {"cached_tokens_cold", u.cached_tokens_cold},
                          {"cached_tokens_shared", u.cached_tokens_shared},
                          {"peak_kv_bytes", u.peak_kv_bytes},
                          {"final_kv_bytes", u.final_kv_bytes},
                          {"evicted_tokens", u.evicted_tokens},
                          {"compactions", u.compactions},
                          {"evicted_cold_pages", u.evicted_cold_pages},
                          {"evicted_cold_bytes", u.evicted_cold_bytes},
                          {"recalled_pages", u.recalled_pages},
                          {"recall_bytes_read", u.recall_bytes_read},
                          {"drift", u.drift},
                          {"exact_tv", u.exact_tv},
                          {"exact_flips", u.exact_flips},
                          {"guard_fallbacks", u.guard_fallbacks},
                          {"guard_fallbacks_incomplete", u.guard_fallbacks_incomplete},
                          {"guard_fallbacks_refused", u.guard_fallbacks_refused},
                          {"swap_ins", u.swap_ins},
                          {"freed_pages", u.freed_pages},
                          {"choices", u.choices},
                          {"shared_prompt_pages", u.shared_prompt_pages},
                          {"pages_saved_by_sharing", u.pages_saved},
                          {"compaction_seconds", u.compaction_seconds},
                          {"queue_seconds", u.queue_seconds},
                          {"ttft_seconds", u.ttft_seconds}}}};
}

Usage combine_usage(const std::vector<Usage>& per_choice) {
  if (per_choice.empty()) return Usage{};
  Usage u = per_choice.front();  // prompt, cache, queue and first-token figures: the request's
  u.choices = static_cast<int32_t>(per_choice.size());
  for (size_t i = 1; i < per_choice.size(); ++i) {
    const Usage& c = per_choice[i];
    u.completion_tokens += c.completion_tokens;
    u.preemptions += c.preemptions;
    u.swap_outs += c.swap_outs;
    u.swap_ins += c.swap_ins;
    u.recomputes += c.recomputes;
    u.peak_kv_bytes += c.peak_kv_bytes;
    u.final_kv_bytes += c.final_kv_bytes;
    u.evicted_tokens += c.evicted_tokens;
    u.compactions += c.compactions;
    u.evicted_cold_pages += c.evicted_cold_pages;
    u.evicted_cold_bytes += c.evicted_cold_bytes;
    u.recalled_pages += c.recalled_pages;
    u.recall_bytes_read += c.recall_bytes_read;
    u.freed_pages += c.freed_pages;
    u.compaction_seconds += c.compaction_seconds;
    u.drift = std::max(u.drift, c.drift);
    u.exact_tv = std::max(u.exact_tv, c.exact_tv);
    u.exact_flips += c.exact_flips;
    u.guard_fallbacks += c.guard_fallbacks;
    u.guard_fallbacks_incomplete += c.guard_fallbacks_incomplete;
    u.guard_fallbacks_refused += c.guard_fallbacks_refused;
    u.shared_prompt_pages = std::max(u.shared_prompt_pages, c.shared_prompt_pages);
    u.pages_saved += c.pages_saved;
  }
  return u;
}

namespace {
json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}
}  // namespace

json logprobs_json(bool chat, const std::vector<TokenLogprob>& lps, const Tokenizer& tok, int64_t offset0) {
  if (chat) {
    json content = json::array();
    for (const TokenLogprob& lp : lps) {
      const std::string piece = tok.piece(lp.token);
      json top = json::array();
      for (const auto& [id, l] : lp.top) {
        const std::string p = tok.piece(id);
        top.push_back({{"token", p}, {"logprob", l}, {"bytes", bytes_of(p)}});
      }
      content.push_back({{"token", piece}, {"logprob", lp.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}});
    }
    return json{{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  int64_t off = offset0;
  for (const TokenLogprob& lp : lps) {
    const std::string piece = tok.piece(lp.token);
    tokens.push_back(piece);
    token_lps.push_back(lp.logprob);
    json top = json::object();
    for (const auto& [id, l] : lp.top)  // most likely first: of two ids with one piece, the likelier stays
      if (!top.contains(tok.piece(id))) top[tok.piece(id)] = l;
    tops.push_back(top);
    offsets.push_back(off);
    off += static_cast<int64_t>(piece.size());
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json completion_response(const ResponseMeta& m, const std::string& text, const std::string& finish_reason, const Usage& u,
                         const json& logprobs) {
  return completion_response(m, std::vector<ChoiceOut>{{text, finish_reason, logprobs}}, u);
}

json completion_response(const ResponseMeta& m, const std::vector<ChoiceOut>& choices, const Usage& u) {
  json arr = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOut& c = choices[i];
    json choice = {{"index", i}, {"logprobs", c.logprobs}, {"finish_reason", c.finish_reason}};
    if (m.chat) choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    else choice["text"] = c.text;
    arr.push_back(std::move(choice));
  }
  return json{{"id", m.id},
              {"object", m.chat ? "chat.completion" : "text_completion"},
              {"created", m.created},
              {"model", m.model},
              {"choices", arr},
              {"usage", usage_json(u)}};
}

json stream_chunk(const ResponseMeta& m, const std::string& text, const std::string& finish_reason, bool first_chunk,
                  const json& logprobs, int32_t index) {
  json choice = {{"index", index}, {"logprobs", logprobs}, {"finish_reason", nullptr}};
  if (!finish_reason.empty()) choice["finish_reason"] = finish_reason;
  if (m.chat) {
    json delta = json::object();
    if (first_chunk) delta["role"] = "assistant";
    if (!text.empty() || finish_reason.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return json{{"id", m.id},
              {"object", m.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", m.created},
              {"model", m.model},
              {"choices", json::array({choice})}};
}

json usage_chunk(const ResponseMeta& m, const Usage& u) {
  return json{{"id", m.id},
              {"object", m.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", m.created},
              {"model", m.model},
              {"choices", json::array()},
              {"usage", usage_json(u)}};
}

std::string dump_json(const json& j) {
  // Generated text can end in an incomplete UTF-8 sequence (flushed at the end of a stream): replace
  // it rather than throwing.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

bool bearer_matches(std::string_view header, std::string_view key) {
  // The scheme is not secret (and case-insensitive per RFC 7235); the key is compared in constant time.
  constexpr std::string_view scheme = "bearer ";
  if (header.size() < scheme.size()) return false;
  for (size_t i = 0; i < scheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(header[i])) != scheme[i]) return false;
  const std::string_view got = header.substr(scheme.size());
  unsigned char diff = got.size() != key.size() ? 1 : 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(key[i] ^ (i < got.size() ? got[i] : 0));
  return diff == 0 && !key.empty();
}

uint64_t salt_hash(std::string_view s) {
  if (s.empty()) return 0;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

}  // namespace kvpack::server
