// Runs the kvpack binary (KVPACK_BINARY) with arguments and captures its exit status, stdout and stderr.
#pragma once
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <unistd.h>
#include <string>

namespace kvpack::test {

struct Proc {
  int status;
  std::string out, err;
};

inline Proc run_kvpack(const std::string& args) {
  const std::string err_path = ::testing::TempDir() + "/kvpack_stderr_" + std::to_string(::getpid()) + ".txt";
  Proc r{};
  FILE* p = popen((std::string(KVPACK_BINARY) + " " + args + " 2>" + err_path).c_str(), "r");
  if (p == nullptr) return {-1, "", "popen failed"};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  r.status = pclose(p);
  std::stringstream ss;
  ss << std::ifstream(err_path).rdbuf();
  r.err = ss.str();
  std::remove(err_path.c_str());  // one per test process: left behind, they piled up in /tmp
  return r;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Value of `key=NUMBER` in a stats line, or -1.
inline double stat_value(const std::string& text, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(key + "=([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

}  // namespace kvpack::test
