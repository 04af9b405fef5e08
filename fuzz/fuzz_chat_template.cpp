// Chat rendering on arbitrary bytes: the whole input as a Jinja template to detect, then the rest of
// the input as NUL-separated role/content pairs, rendered in the format the first byte picks, as text
// and as tokens with a real tokenizer that has ChatML markers (qwen2) or Llama-3 markers (llama-bpe).
#include <cstdint>

#include "fuzz_common.h"
#include "server/chat_template.h"

using namespace kvpack;
using namespace kvpack::server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  (void)chat_format_name(detect_chat_format(input));

  if (input.empty()) return 0;
  std::vector<ChatMessage> msgs;
  size_t pos = 1;
  while (pos <= input.size() && msgs.size() < 8) {
    size_t a = input.find('\0', pos);
    if (a == std::string::npos) a = input.size();
    size_t b = a < input.size() ? input.find('\0', a + 1) : std::string::npos;
    if (b == std::string::npos) b = input.size();
    msgs.push_back({input.substr(pos, a - pos), a < input.size() ? input.substr(a + 1, b - a - 1) : ""});
    pos = b + 1;
  }
  static const Tokenizer& chatml = fuzz::vocab_tokenizer("qwen2");
  static const Tokenizer& llama3 = fuzz::vocab_tokenizer("llama-bpe");
  const ChatFormat formats[] = {ChatFormat::Plain, ChatFormat::ChatML, ChatFormat::Llama3, ChatFormat::Gemma};
  const ChatFormat f = formats[data[0] & 3];
  (void)render_chat_text(f, msgs);
  (void)chat_default_stops(f);
  const Tokenizer& tok = data[0] & 4 ? llama3 : chatml;
  fuzz::check_ids(tok, render_chat_tokens(f, msgs, tok));
  return 0;
}
