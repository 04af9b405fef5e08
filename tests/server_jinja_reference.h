// Renders (template, context) cases with Python's jinja2 (tests/data/jinja_reference.py) in one call.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "server/jinja.h"

namespace kvpack::test {

struct JinjaCase {
  std::string name;
  std::string tmpl;
  jinja::Value context;
};

// Python is there (with jinja2)? The tests skip, naming the package, when not.
inline bool have_python_jinja2() { return std::system("python3 -c 'import jinja2' >/dev/null 2>&1") == 0; }

// One result per case: {"ok": text} or {"error": message}. Empty on a failure to run Python.
inline std::vector<jinja::Value> python_render(const std::vector<JinjaCase>& cases) {
  jinja::Value in = jinja::Value::array();
  for (const auto& c : cases) in.push_back({{"template", c.tmpl}, {"context", c.context}});
  char dir[] = "/tmp/kvpack_jinja_XXXXXX";
  if (!mkdtemp(dir)) return {};
  const std::string ip = std::string(dir) + "/in.json", op = std::string(dir) + "/out.json";
  std::ofstream(ip) << in.dump();
  const std::string cmd = "python3 " KVPACK_SOURCE_DIR "/tests/data/jinja_reference.py " + ip + " " + op;
  std::vector<jinja::Value> res;
  if (std::system(cmd.c_str()) == 0) {
    std::ifstream f(op);
    std::stringstream ss;
    ss << f.rdbuf();
    for (auto& r : jinja::Value::parse(ss.str())) res.push_back(r);
  }
  std::remove(ip.c_str());
  std::remove(op.c_str());
  rmdir(dir);
  return res;
}

// kvpack's rendering in the same shape.
inline jinja::Value kvpack_render(const JinjaCase& c) {
  try {
    return {{"ok", jinja::Template(c.tmpl).render(c.context)}};
  } catch (const jinja::Error& e) {
    return {{"error", e.what()}};
  }
}

}  // namespace kvpack::test
