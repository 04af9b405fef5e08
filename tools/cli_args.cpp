#include "cli_args.h"

#include <algorithm>
#include <cctype>
#include <map>

namespace kvpack::cli {
namespace {

// What a llama.cpp flag becomes here.
struct Habit {
  enum Kind { Rename, Drop, Refuse } kind;
  const char* to;      // Rename: kvpack's flag
  int values;          // values it takes (Drop: skipped with it; -1: one optional on|off|auto)
  const char* why;     // the note (Drop) or the error (Refuse)
};

const std::map<std::string, Habit>& habits() {
  static const std::map<std::string, Habit> h = {
      {"-cnv", {Habit::Rename, "--conversation", 0, ""}},
      {"-no-cnv", {Habit::Drop, "", 0, "not a conversation is already the default"}},
      {"--no-conversation", {Habit::Drop, "", 0, "not a conversation is already the default"}},
      {"-sys", {Habit::Rename, "--system-prompt", 1, ""}},
      {"-ctk", {Habit::Rename, "--kv-type", 1, ""}},
      {"--cache-type-k", {Habit::Rename, "--kv-type", 1, ""}},
      {"-ctv", {Habit::Rename, "--kv-type", 1, ""}},
      {"--cache-type-v", {Habit::Rename, "--kv-type", 1, ""}},
      {"-np", {Habit::Rename, "--max-batch", 1, ""}},
      {"--parallel", {Habit::Rename, "--max-batch", 1, ""}},
      {"-ngl", {Habit::Drop, "", 1, "kvpack runs on the CPU (no GPU offload)"}},
      {"--gpu-layers", {Habit::Drop, "", 1, "kvpack runs on the CPU (no GPU offload)"}},
      {"--n-gpu-layers", {Habit::Drop, "", 1, "kvpack runs on the CPU (no GPU offload)"}},
      {"-mg", {Habit::Drop, "", 1, "kvpack runs on the CPU (no GPU)"}},
      {"--main-gpu", {Habit::Drop, "", 1, "kvpack runs on the CPU (no GPU)"}},
      {"-ts", {Habit::Drop, "", 1, "kvpack runs on the CPU (no GPU split)"}},
      {"--tensor-split", {Habit::Drop, "", 1, "kvpack runs on the CPU (no GPU split)"}},
      {"-sm", {Habit::Drop, "", 1, "kvpack runs on the CPU (no GPU split)"}},
      {"--split-mode", {Habit::Drop, "", 1, "kvpack runs on the CPU (no GPU split)"}},
      {"-dev", {Habit::Drop, "", 1, "kvpack runs on the CPU"}},
      {"--device", {Habit::Drop, "", 1, "kvpack runs on the CPU"}},
      {"-fa", {Habit::Drop, "", -1, "attention is always fused (paged flash attention) in kvpack"}},
      {"--flash-attn", {Habit::Drop, "", -1, "attention is always fused (paged flash attention) in kvpack"}},
      {"--mlock", {Habit::Drop, "", 0, "kvpack maps GGUF weights read-only and does not lock them"}},
      {"--no-mmap", {Habit::Drop, "", 0, "kvpack always maps GGUF weights"}},
      {"--mmap", {Habit::Drop, "", 0, "kvpack always maps GGUF weights"}},
      {"-cb", {Habit::Drop, "", 0, "continuous batching is always on"}},
      {"--cont-batching", {Habit::Drop, "", 0, "continuous batching is always on"}},
      {"-tb", {Habit::Drop, "", 1, "-t threads serve prefill and decode alike"}},
      {"--threads-batch", {Habit::Drop, "", 1, "-t threads serve prefill and decode alike"}},
      {"-ub", {Habit::Drop, "", 1, "kvpack has one batch size (-b)"}},
      {"--ubatch-size", {Habit::Drop, "", 1, "kvpack has one batch size (-b)"}},
      {"-hf", {Habit::Refuse, "", 1, "kvpack does not download models: give a local GGUF file with -m"}},
      {"-hfr", {Habit::Refuse, "", 1, "kvpack does not download models: give a local GGUF file with -m"}},
      {"--hf-repo", {Habit::Refuse, "", 1, "kvpack does not download models: give a local GGUF file with -m"}},
      {"-mu", {Habit::Refuse, "", 1, "kvpack does not download models: give a local GGUF file with -m"}},
      {"--model-url", {Habit::Refuse, "", 1, "kvpack does not download models: give a local GGUF file with -m"}},
  };
  return h;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      // a transposition ("tmep") counts as one edit
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) cur[j] = std::min(cur[j], prev[j - 1]);
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

bool is_number(const std::string& s) {
  if (s.size() < 2) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end != nullptr && *end == '\0';
}

std::vector<const CLI::Option*> options_of(const CLI::App* app) {
  std::vector<const CLI::Option*> v;
  for (const CLI::App* a = app; a != nullptr; a = a->get_parent())
    for (const CLI::Option* o : a->get_options()) v.push_back(o);
  return v;
}

const CLI::Option* find_option(const CLI::App* app, const std::string& flag) {
  const bool lng = flag.rfind("--", 0) == 0;
  const std::string name = flag.substr(lng ? 2 : 1);
  for (const CLI::Option* o : options_of(app)) {
    const auto& names = lng ? o->get_lnames() : o->get_snames();
    if (std::find(names.begin(), names.end(), name) != names.end()) return o;
  }
  return nullptr;
}

std::vector<std::string> flag_names(const CLI::App* app) {
  std::vector<std::string> v;
  for (const CLI::Option* o : options_of(app)) {
    for (const auto& l : o->get_lnames()) v.push_back("--" + l);
    for (const auto& s : o->get_snames()) v.push_back("-" + s);
  }
  return v;
}

std::vector<std::string> subcommand_names(const CLI::App* app) {
  std::vector<std::string> v;
  for (const CLI::App* s : app->get_subcommands([](const CLI::App*) { return true; })) v.push_back(s->get_name());
  return v;
}

const CLI::App* find_subcommand(const CLI::App* app, const std::string& name) {
  for (const CLI::App* s : app->get_subcommands([](const CLI::App*) { return true; }))
    if (s->get_name() == name) return s;
  return nullptr;
}

std::string command_path(const CLI::App* app) {
  std::string s;
  for (const CLI::App* a = app; a != nullptr && a->get_parent() != nullptr; a = a->get_parent()) s = a->get_name() + (s.empty() ? "" : " " + s);
  return s.empty() ? "kvpack" : "kvpack " + s;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

[[noreturn]] void unknown_flag(const CLI::App* app, const std::string& flag) {
  std::vector<std::string> cands = flag_names(app);
  // -temp → --temp: a long option typed with one dash.
  if (flag.size() > 2 && flag[1] != '-' && find_option(app, "-" + flag) != nullptr)
    throw UsageError("unknown flag " + flag + " for `" + command_path(app) + "`; did you mean -" + flag + "?");
  const std::string best = closest(flag, cands);
  throw UsageError("unknown flag " + flag + " for `" + command_path(app) + "`" + (best.empty() ? "" : "; did you mean " + best + "?") +
                   " (`" + command_path(app) + " --help` lists the flags)");
}

}  // namespace

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (c.size() > word.size() + 2 && c.compare(0, word.size(), word) == 0 && word.size() >= 4) d = std::min<size_t>(d, 1);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  const size_t limit = std::max<size_t>(2, word.size() / 3);
  return best_d <= limit ? best : "";
}

NormalizedArgs normalize_args(const CLI::App& app, std::vector<std::string> in) {
  NormalizedArgs out;
  const CLI::App* cur = &app;
  size_t i = 0;
  if (!in.empty()) {
    const std::string& a = in[0];
    const bool top_flag = a == "-h" || a == "--help" || a == "--version";
    if (a.size() > 1 && a[0] == '-' && !top_flag && !is_number(a)) {
      // llama-cli style: options without a sub-command generate (or chat, with -cnv).
      out.args.push_back("generate");
      cur = find_subcommand(&app, "generate");
    } else if (!top_flag && a[0] != '-') {
      if (find_subcommand(&app, a) == nullptr) {
        const std::string best = closest(a, subcommand_names(&app));
        throw UsageError("unknown command '" + a + "'" + (best.empty() ? "" : "; did you mean '" + best + "'?") +
                         " (commands: " + join(subcommand_names(&app)) + ")");
      }
    }
  }
  std::string kv_type_from_habit;
  for (; i < in.size(); ++i) {
    std::string a = in[i];
    if (a == "--") {  // everything after is positional
      out.args.insert(out.args.end(), in.begin() + static_cast<long>(i), in.end());
      break;
    }
    if (a.size() < 2 || a[0] != '-' || is_number(a)) {
      if (const CLI::App* sub = find_subcommand(cur, a)) cur = sub;
      else if (!cur->get_subcommands([](const CLI::App*) { return true; }).empty() && cur->get_parent() != nullptr && a[0] != '-') {
        const std::string best = closest(a, subcommand_names(cur));
        throw UsageError("unknown command '" + command_path(cur) + " " + a + "'" +
                         (best.empty() ? "" : "; did you mean '" + command_path(cur) + " " + best + "'?") + " (commands: " +
                         join(subcommand_names(cur)) + ")");
      }
      out.args.push_back(a);
      continue;
    }
    const size_t eq = a.find('=');
    const std::string flag = a.substr(0, eq);
    std::string inline_value = eq == std::string::npos ? "" : a.substr(eq + 1);
    // llama.cpp habits first (only where kvpack has no flag of that name).
    if (auto h = habits().find(flag); h != habits().end() && find_option(cur, flag) == nullptr) {
      const Habit& hb = h->second;
      auto take_value = [&](bool optional) -> std::string {
        if (eq != std::string::npos) return inline_value;
        if (i + 1 < in.size()) {
          const std::string& v = in[i + 1];
          if (!optional || v == "on" || v == "off" || v == "auto" || v == "1" || v == "0") {
            ++i;
            return v;
          }
        }
        if (!optional) throw UsageError(flag + " needs a value");
        return "";
      };
      if (hb.kind == Habit::Refuse) throw UsageError(flag + ": " + hb.why);
      if (hb.kind == Habit::Drop) {
        const std::string v = hb.values != 0 ? take_value(hb.values < 0) : "";
        out.notes.push_back(flag + (v.empty() ? "" : " " + v) + " ignored: " + hb.why);
        continue;
      }
      if (find_option(cur, hb.to) == nullptr) unknown_flag(cur, flag);  // e.g. -np on `generate`
      const std::string v = hb.values > 0 ? take_value(false) : "";
      if (std::string(hb.to) == "--kv-type") {
        // kvpack has one KV element type for K and V: -ctk X -ctv X is one --kv-type X.
        if (!kv_type_from_habit.empty() && kv_type_from_habit != v)
          throw UsageError("-ctk " + kv_type_from_habit + " and -ctv " + v + ": kvpack stores K and V in one type (--kv-type)");
        if (!kv_type_from_habit.empty()) continue;
        kv_type_from_habit = v;
      }
      out.args.push_back(hb.to);
      if (hb.values > 0) out.args.push_back(v);
      continue;
    }
    if (flag == "-h" || flag == "--help" || (flag == "--version" && cur == &app)) {
      out.args.push_back(a);
      continue;
    }
    const CLI::Option* o = find_option(cur, flag);
    if (o == nullptr) {
      // `-n128` style: a known one-letter option with its value attached.
      if (flag[1] != '-' && flag.size() > 2 && find_option(cur, flag.substr(0, 2)) != nullptr &&
          find_option(cur, flag.substr(0, 2))->get_expected_max() != 0) {
        const std::string rest = flag.substr(2);
        const bool word = std::all_of(rest.begin(), rest.end(), [](char c) { return std::islower(static_cast<unsigned char>(c)) || c == '-'; });
        if (!word || rest.size() < 2) {
          out.args.push_back(a);
          continue;
        }
      }
      unknown_flag(cur, flag);
    }
    out.args.push_back(a);
    // Skip the option's value so that a value starting with '-' is not read as a flag.
    if (eq == std::string::npos && o->get_expected_max() != 0 && i + 1 < in.size()) {  // flags expect 0 values
      const int n = std::max(1, o->get_items_expected_min());
      for (int k = 0; k < n && i + 1 < in.size(); ++k) out.args.push_back(in[++i]);
    }
  }
  return out;
}

}  // namespace kvpack::cli
