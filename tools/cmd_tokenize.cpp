// `kvpack tokenize`: print token ids of a text, like llama.cpp's tokenize tool. Works with any GGUF that
// has a vocab (vocab-only files included) and with llama2.c tokenizer files.
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "commands.h"
#include "gguf/gguf.h"
#include "options.h"
#include "tokenizer/tokenizer.h"

namespace kvpack::cli {

void add_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
  struct Opts {
    std::string model, tokenizer, prompt, file;
    bool ids = false, bos = false;
    int32_t vocab = 0;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("-m,--model", o->model, "GGUF file with a vocab (model or vocab-only)");
  cmd->add_option("--tokenizer", o->tokenizer, "llama2.c tokenizer file instead of a GGUF")->check(CLI::ExistingFile);
  cmd->add_option("--vocab-size", o->vocab, "Vocab size for a llama2.c tokenizer file (default: read them all)");
  auto* p = cmd->add_option("-p,--prompt", o->prompt, "Text to tokenize");
  auto* f = cmd->add_option("-f,--file", o->file, "Read the text from a file")->check(CLI::ExistingFile);
  p->excludes(f);
  cmd->add_flag("--ids", o->ids, "Print only the ids, as a list [1, 2, 3]");
  cmd->add_flag("--bos", o->bos, "Prepend BOS");
  cmd->callback([o] {
    if (o->model.empty() == o->tokenizer.empty()) throw std::runtime_error("give exactly one of -m MODEL or --tokenizer FILE");
    std::string text = o->prompt;
    if (!o->file.empty()) text = read_file(o->file).value_or("");
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<Tokenizer> tok;
    if (!o->model.empty()) {
      file = gguf::File::open(o->model);
      tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file));
    } else {
      tok = std::make_unique<Tokenizer>(Tokenizer::from_llama2c(o->tokenizer, o->vocab));
    }
    const std::vector<int32_t> ids = tok->encode(text, o->bos);
    if (o->ids) {
      std::printf("[");
      for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? ", %d" : "%d", ids[i]);
      std::printf("]\n");
    } else {
      for (int32_t id : ids) std::printf("%6d -> '%s'\n", id, tok->piece(id).c_str());
    }
  });
}

}  // namespace kvpack::cli
