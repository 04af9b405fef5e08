// The live page map: GET /kv serves a self-contained HTML page (no external scripts or styles: it
// works offline and behind a strict proxy) that polls GET /kv/state twice a second and draws the pool
// (active / cached / free / cold pages), every sequence's pages by layer and KV head, the compactions,
// recalls and preemptions as they happen, and resident KV over time. With an API key the page itself
// is public (it holds no data) and reads the key from its URL fragment (/kv#key=KEY) for /kv/state.
#pragma once
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/scheduler.h"

namespace kvpack::server {

std::string_view kv_page_html();
// GET /kv/state's body.
nlohmann::json kv_map_json(const KvMapSnapshot& m, const std::string& model_id);

}  // namespace kvpack::server
