// `kvpack eval parity`: kvpack's teacher-forced next-token logits against llama.cpp's on the same GGUF file
// and the same token ids (windows of a text, tokenized by kvpack; BOS first where the model has one).
// The llama.cpp side is scripts/peer/llama_logits (scripts/peer/build_llama_tools.sh builds it from the
// llama.cpp source bundled in node-llama-cpp); it is run as a child process on two temporary files
// (eval/parity.h). Reports top-1 agreement and KL(llama.cpp || kvpack) over every compared position.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "eval/parity.h"
#include "options.h"

extern char** environ;

namespace kvpack::cli {
namespace {

// A private temporary directory, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvpack-parity-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("cannot create a temporary directory");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// Runs argv[0] with argv (no shell); throws with the exit status if it fails.
void run_child(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (const int e = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ); e != 0)
    throw std::runtime_error("cannot run " + args[0] + ": " + std::strerror(e));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error("waitpid failed for " + args[0]);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(args[0] + " failed (" +
                             (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                                : "signal " + std::to_string(WTERMSIG(status))) +
                             "); its message is above");
}

std::string default_llama_logits() {
  if (const char* e = std::getenv("KVPACK_LLAMA_TOOLS")) return std::string(e) + "/llama_logits";
  return "build-llama/build/bin/llama_logits";
}

}  // namespace

void add_eval_parity(CLI::App& eval) {
  auto* cmd = eval.add_subcommand("parity", "Teacher-forced logits vs llama.cpp's on the same file and token ids");
  auto o = std::make_shared<ModelOptions>();
  auto text = std::make_shared<std::string>();
  auto ctx = std::make_shared<int32_t>(512);
  auto chunks = std::make_shared<int32_t>(4);
  auto tool = std::make_shared<std::string>(default_llama_logits());
  auto peer_logits = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto keep = std::make_shared<std::string>();
  add_model_options(*cmd, *o);
  cmd->add_option("--text", *text, "Plain-text file whose tokens are evaluated")->required()->check(CLI::ExistingFile);
  cmd->add_option("--ctx", *ctx, "Tokens per window (default 512; at most the model's context)")->check(CLI::PositiveNumber);
  cmd->add_option("--chunks", *chunks, "Windows, at most (default 4: 2044 compared positions at --ctx 512)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--llama-logits", *tool,
                  "The llama_logits program (scripts/peer/build_llama_tools.sh; default $KVPACK_LLAMA_TOOLS/llama_logits "
                  "or build-llama/build/bin/llama_logits)");
  cmd->add_option("--peer-logits", *peer_logits, "Use this logits file (eval/parity.h format) instead of running llama_logits")
      ->check(CLI::ExistingFile);
  cmd->add_option("--keep-files", *keep, "Write the windows and llama.cpp's logits into this directory and keep them");
  cmd->add_flag("--json", *json, "Print the result as JSON");
  cmd->callback([=] {
    if (o->model.empty()) throw std::invalid_argument("eval parity needs -m FILE.gguf (llama.cpp reads the same file)");
    auto model = load_model(*o);
    const EngineOptions eo = engine_options(*o);
    const int32_t c = std::min(*ctx, model->config().n_ctx);
    const int64_t per = c - (model->tokenizer().bos() >= 0 ? 1 : 0);
    const std::vector<int32_t> toks = eval::tokenize_head(model->tokenizer(), eval::read_text_file(*text), per * *chunks);
    const auto windows = eval::make_windows(*model, toks, c, *chunks);
    const int32_t n_windows = static_cast<int32_t>(windows.size());
    const int32_t V = model->config().n_vocab;

    TempDir tmp;
    std::string logits_path = *peer_logits;
    if (logits_path.empty()) {
      if (access(tool->c_str(), X_OK) != 0)
        throw std::runtime_error("no llama_logits program at " + *tool + " (build it: scripts/peer/build_llama_tools.sh)");
      std::filesystem::path dir = tmp.path;
      if (!keep->empty()) {
        std::filesystem::create_directories(*keep);
        dir = *keep;
      }
      const std::string win = (dir / "windows.bin").string();
      logits_path = (dir / "logits.bin").string();
      eval::write_windows_file(win, windows);
      if (!o->quiet) std::fprintf(stderr, "[kvpack] parity: llama.cpp on %d window(s) x %d tokens\n", n_windows, c);
      run_child({*tool, o->model, win, logits_path, std::to_string(o->threads)});
    }
    const eval::PeerLogits peer = eval::read_logits_file(logits_path, n_windows, c, V);
    if (!o->quiet) std::fprintf(stderr, "[kvpack] parity: kvpack on the same ids\n");
    const eval::FullReference ours = eval::full_reference(*model, windows, eo);
    const eval::ParityResult r = eval::compare_logits(ours, peer);
    if (*json) {
      const nlohmann::json j = {{"model", o->model}, {"text", *text}, {"windows", n_windows}, {"ctx", c},
                                {"positions", r.positions}, {"top1", r.top1}, {"mean_kl", r.mean_kl},
                                {"p99_kl", r.p99_kl}, {"max_kl", r.max_kl}, {"max_abs_logit_diff", r.max_abs_logit_diff}};
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("parity: %s vs llama.cpp, %d window(s) x %d tokens of %s\n", o->model.c_str(), n_windows, c, text->c_str());
    std::printf("positions compared: %lld\n", static_cast<long long>(r.positions));
    std::printf("top-1 agreement: %.3f%%\n", 100.0 * r.top1);
    std::printf("mean KL: %.6g\np99 KL: %.6g\nmax KL: %.6g\nmax |logit difference|: %.4g\n", r.mean_kl, r.p99_kl, r.max_kl,
                r.max_abs_logit_diff);
  });
}

}  // namespace kvpack::cli
