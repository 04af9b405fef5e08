#!/usr/bin/env bash
# Installs kvpack's build and test dependencies from Debian's archive (the machine may start bare).
set -euo pipefail
pkgs=(cmake g++ make pkg-config git ca-certificates
      lld   # the linker scripts/test.sh uses for its three builds (faster than ld.bfd)
      libgtest-dev libgmock-dev libbenchmark-dev
      libicu-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libboost-dev libxxhash-dev
      libhiredis-dev redis-server haproxy   # shared KV tier (Redis) and the replica router: docs/scale.md
      python3 python3-numpy python3-matplotlib curl
      python3-jinja2   # reference renderings of chat templates (tests/server_jinja_reference_test.cpp)
      clang libclang-rt-dev   # clang + libFuzzer / sanitizer runtimes: scripts/fuzz.sh
      chromium chromium-driver)  # headless browser test of the live page map (scripts/kv_page_check.py)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# scripts/fuzz.sh needs libFuzzer: a fuzz target must link with clang++ -fsanitize=fuzzer.
probe=$(mktemp -d)
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe/probe.cpp"
if ! clang++ -fsanitize=fuzzer "$probe/probe.cpp" -o "$probe/probe" 2>"$probe/err"; then
  echo "install-deps: clang++ -fsanitize=fuzzer does not link (libFuzzer missing):" >&2
  cat "$probe/err" >&2
  rm -rf "$probe"
  exit 1
fi
rm -rf "$probe"
