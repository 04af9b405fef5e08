// make_cold_tier (spec parsing) and the default batched calls of ColdTier.
//
// Spec grammar: "host:BYTES" | "dir:PATH:BYTES". BYTES is a decimal integer with an optional suffix,
// case-insensitive: B (bytes), K/KiB, M/MiB, G/GiB, T/TiB — every suffix is a power of 1024 (K = KiB =
// 1024: the caps are memory sizes). "MB"-style suffixes are refused rather than guessed at. PATH is
// everything between "dir:" and the last ':' (so it may itself hold ':').
#include "kv/cold_tier.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "kv/cold_tier_file.h"
#include "kv/cold_tier_host.h"
#include "kv/cold_tier_index.h"

namespace kvpack::kv {

void ColdTier::put_many(std::span<const uint64_t> keys, std::span<const uint8_t* const> data, std::span<bool> ok) {
  cold::check_batch(keys.size(), data.size(), ok.size(), "put_many");
  for (size_t i = 0; i < keys.size(); ++i) ok[i] = put(keys[i], {data[i], record_bytes()});
}

void ColdTier::get_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok) {
  cold::check_batch(keys.size(), out.size(), ok.size(), "get_many");
  for (size_t i = 0; i < keys.size(); ++i) ok[i] = get(keys[i], {out[i], record_bytes()});
}

void ColdTier::take_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok) {
  get_many(keys, out, ok);
  for (uint64_t k : keys) erase(k);
}

namespace {

std::optional<uint64_t> parse_bytes(std::string_view text) {
  size_t i = 0;
  uint64_t value = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    const uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (value > (UINT64_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  if (i == 0) return std::nullopt;
  std::string suffix;
  for (; i < text.size(); ++i) suffix += static_cast<char>(std::toupper(static_cast<unsigned char>(text[i])));
  struct Suffix {
    std::string_view name;
    int shift;
  };
  static constexpr Suffix kSuffixes[] = {{"", 0},     {"B", 0},    {"K", 10}, {"KIB", 10}, {"M", 20},
                                         {"MIB", 20}, {"G", 30},   {"GIB", 30}, {"T", 40}, {"TIB", 40}};
  int shift = -1;
  for (const Suffix& known : kSuffixes) {
    if (suffix == known.name) shift = known.shift;
  }
  if (shift < 0 || (shift > 0 && value > (UINT64_MAX >> shift))) return std::nullopt;
  return value << shift;
}

}  // namespace

std::unique_ptr<ColdTier> make_cold_tier(const std::string& spec, size_t record_bytes, int io_threads) {
  const auto fail = [&](std::string_view why) {
    throw std::invalid_argument("--kv-cold '" + spec + "' : " + std::string(why));
  };
  const auto bytes_of = [&](std::string_view text) {
    const std::optional<uint64_t> bytes = parse_bytes(text);
    if (!bytes) fail("BYTES must be an integer with an optional K/M/G/T or KiB/MiB/GiB/TiB suffix (powers of 1024)");
    return *bytes;
  };
  // Errors of the backends (cap below one record, unusable directory) come back naming the spec too.
  const auto build = [&](auto&& make) -> std::unique_ptr<ColdTier> {
    try {
      return make();
    } catch (const std::exception& e) {
      std::string_view why = e.what();
      if (why.starts_with("cold tier: ")) why.remove_prefix(11);
      fail(why);
    }
    return nullptr;
  };
  const std::string_view s = spec;
  if (s.starts_with("host:")) {
    const uint64_t bytes = bytes_of(s.substr(5));
    return build([&] { return std::make_unique<HostColdTier>(bytes, record_bytes, io_threads); });
  }
  if (s.starts_with("dir:")) {
    const std::string_view rest = s.substr(4);
    const size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos || colon == 0) fail("expected dir:PATH:BYTES");
    const uint64_t bytes = bytes_of(rest.substr(colon + 1));
    const std::string dir(rest.substr(0, colon));
    FileTierOptions options;
    options.read_threads = std::max(options.read_threads, io_threads);
    return build([&] { return std::make_unique<FileColdTier>(dir, bytes, record_bytes, options); });
  }
  fail("expected host:BYTES or dir:PATH:BYTES");
  return nullptr;
}

}  // namespace kvpack::kv
