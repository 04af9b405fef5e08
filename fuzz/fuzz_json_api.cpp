// OpenAI request parsing and validation (server/api.*, no HTTP) on arbitrary bodies: the first byte
// picks completion vs chat and the chat format, the rest is the body. parse_request_body must answer
// every body with a request or an ApiError (a 4xx), never an exception.
#include <cstdint>

#include "fuzz_common.h"
#include "compress/calibration.h"
#include "server/api.h"

using namespace kvpack;
using namespace kvpack::server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const Tokenizer& tok = fuzz::vocab_tokenizer("qwen2");
  static const ModelConfig model = [] {
    ModelConfig c;
    c.n_ctx = 512;
    c.n_vocab = tok.n_vocab();
    c.n_layer = 2;
    c.n_head = c.n_head_kv = 2;
    c.head_dim = 8;
    return c;
  }();
  ApiContext ctx;
  ctx.tokenizer = &tok;
  ctx.model = &model;
  const ChatFormat formats[] = {ChatFormat::Plain, ChatFormat::ChatML, ChatFormat::Llama3, ChatFormat::Gemma};
  ctx.chat_format = formats[(data[0] >> 1) & 3];
  // validate() only asks whether statistics exist: an empty set stands for "the server was calibrated".
  static const compress::QueryStats stats{};
  ctx.calibration = (data[0] & 8) ? &stats : nullptr;
  ctx.kv_capacity_pages = 64;
  const bool chat = data[0] & 1;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const ParseResult r = parse_request_body(body, chat, ctx);
  if (const auto* e = std::get_if<ApiError>(&r)) {
    if (e->status < 400 || e->status >= 500) std::abort();
    (void)dump_json(error_body(*e));
  } else {
    const auto& p = std::get<ParsedRequest>(r);
    fuzz::check_ids(tok, p.spec.prompt);
    if (p.chat != chat) std::abort();
  }
  return 0;
}
