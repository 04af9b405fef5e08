// kvpack: command-line entry point. Errors are one clear line on stderr and a non-zero exit.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli_args.h"
#include "commands.h"
#include "kernels/cpu_features.h"

#ifndef KVPACK_GIT
#define KVPACK_GIT "unknown"
#endif

int main(int argc, char** argv) {
  CLI::App app{"kvpack: LLM inference with KV-cache compression that frees pages\n"
               "(`kvpack -m MODEL -p TEXT` and `kvpack -cnv` work as in llama-cli: they run `generate`)"};
  app.require_subcommand(1);
  // Every option's default shows in --help (subcommands inherit this from the app).
  app.option_defaults()->always_capture_default();
  namespace k = kvpack::kernels;
  app.set_version_flag("--version", std::string("kvpack, commit ") + KVPACK_GIT + " (compiler " __VERSION__ + "; kernels here: matmul " +
                                        k::isa_name(k::selected_isa(k::kMatmulIsa)) + ", attention " +
                                        k::isa_name(k::selected_isa(k::kAttentionIsa)) + ")");
  kvpack::cli::add_generate(app);
  kvpack::cli::add_tokenize(app);
  kvpack::cli::add_gen_model(app);
  kvpack::cli::add_calibrate(app);
  kvpack::cli::add_serve(app);
  kvpack::cli::add_eval(app);
  kvpack::cli::add_bench(app);
  kvpack::cli::add_analyze_prefix(app);
  try {
    kvpack::cli::NormalizedArgs na = kvpack::cli::normalize_args(app, std::vector<std::string>(argv + 1, argv + argc));
    for (const std::string& n : na.notes) std::fprintf(stderr, "[kvpack] note: %s\n", n.c_str());
    // CLI11 takes the arguments in reverse order.
    std::vector<std::string> rev(na.args.rbegin(), na.args.rend());
    app.parse(rev);
  } catch (const kvpack::cli::UsageError& e) {
    std::fprintf(stderr, "kvpack: error: %s\n", e.what());
    return 2;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvpack: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
