#include "cli_plot.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

namespace kvpack::cli {
namespace fs = std::filesystem;
namespace {
std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
}  // namespace

std::string find_script(const std::string& name) {
  std::vector<fs::path> cands;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    cands.push_back(exe.parent_path() / "../scripts" / name);
    cands.push_back(exe.parent_path() / "../../scripts" / name);
  }
  cands.push_back(fs::path(__FILE__).parent_path() / "../scripts" / name);
  cands.push_back(fs::path("scripts") / name);
  for (const auto& p : cands)
    if (fs::exists(p, ec)) return fs::weakly_canonical(p, ec).string();
  return "";
}

std::string run_plot(const std::string& script, const std::string& csv, const std::string& out) {
  const std::string path = find_script(script);
  if (path.empty())
    return "no plot: scripts/" + script + " was not found next to the executable or in the source tree (run it by hand: python3 " +
           script + " " + csv + " " + out + ")";
  std::vector<std::string> pythons;
  if (const char* env = std::getenv("KVPACK_PYTHON"); env && *env) pythons.push_back(env);
  pythons.push_back("python3");
  pythons.push_back("/usr/bin/python3");
  std::string py;
  for (const auto& p : pythons)
    if (std::system((quote(p) + " -c 'import matplotlib' >/dev/null 2>&1").c_str()) == 0) {
      py = p;
      break;
    }
  if (py.empty())
    return "no plot: no python3 with matplotlib (apt-get install python3-matplotlib, then: python3 " + path + " " + csv + " " + out + ")";
  const std::string cmd = quote(py) + " " + quote(path) + " " + quote(csv) + " " + quote(out) + " 1>&2";
  if (std::system(cmd.c_str()) != 0) return "no plot: the plot script failed: " + cmd;
  return "plot: " + out;
}

}  // namespace kvpack::cli
