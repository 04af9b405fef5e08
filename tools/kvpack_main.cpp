// kvpack: command-line entry point. Errors are one clear line on stderr and a non-zero exit.
#include <cstdio>
#include <exception>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvpack: LLM inference with KV-cache compression that frees pages"};
  app.require_subcommand(1);
  kvpack::cli::add_generate(app);
  kvpack::cli::add_tokenize(app);
  kvpack::cli::add_gen_model(app);
  kvpack::cli::add_calibrate(app);
  kvpack::cli::add_serve(app);
  kvpack::cli::add_eval(app);
  kvpack::cli::add_bench(app);
  kvpack::cli::add_analyze_prefix(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvpack: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
