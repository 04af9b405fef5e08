#include "server/kv_page.h"

namespace kvpack::server {

nlohmann::json kv_map_json(const KvMapSnapshot& m, const std::string& model_id) {
  nlohmann::json seqs = nlohmann::json::array();
  for (const KvMapSequence& s : m.sequences) {
    seqs.push_back({{"id", s.id},
                    {"state", s.state},
                    {"prompt_tokens", s.prompt_tokens},
                    {"generated", s.generated},
                    {"computed", s.computed},
                    {"policy", s.policy},
                    {"budget", s.budget},
                    {"slots", s.slots},
                    {"pages", s.pages},
                    {"shared_pages", s.shared_pages},
                    {"compactions", s.compactions},
                    {"evicted_tokens", s.evicted_tokens},
                    {"recalled_pages", s.recalled_pages},
                    {"cold_evicted_pages", s.cold_evicted_pages},
                    {"preemptions", s.preemptions},
                    {"drift", s.drift < 0 ? nlohmann::json(nullptr) : nlohmann::json(s.drift)}});
  }
  return {{"model", model_id},
          {"step", m.step},
          {"t", m.t},
          {"n_layers", m.n_layers},
          {"n_kv_heads", m.n_kv_heads},
          {"page_size", m.page_size},
          {"page_bytes", m.page_bytes},
          {"pool", {{"total", m.pages_total}, {"active", m.pages_active}, {"cached", m.pages_cached}, {"free", m.pages_free}}},
          {"resident_bytes", m.resident_bytes},
          {"cold", {{"capacity_bytes", m.cold_cap_bytes}, {"used_bytes", m.cold_used_bytes}, {"records", m.cold_records}}},
          {"sequences", std::move(seqs)}};
}

}  // namespace kvpack::server
