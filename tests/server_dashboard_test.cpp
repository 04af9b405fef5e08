// The Grafana dashboard in deploy/grafana/kvpack-dashboard.json queries only metrics the server has:
// every metric name in every panel's PromQL is a family that a real server (loopback, stories260K,
// a host cold tier, a compressed request with recall, a plain one) announces in GET /metrics, and each
// has at least one sample after that traffic (a panel that can never show anything is a broken panel).
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "engine/engine.h"
#include "server/server.h"
#include "server_model_fixture.h"

using namespace kvpack;
using json = nlohmann::json;

namespace {

void collect_exprs(const json& j, std::vector<std::string>& out) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      if (k == "expr" && v.is_string()) out.push_back(v.get<std::string>());
      else collect_exprs(v, out);
    }
  } else if (j.is_array()) {
    for (const auto& v : j) collect_exprs(v, out);
  }
}

// Metric names in a PromQL expression: identifiers of the kvpack_ / vllm: namespaces (functions, label
// names and label values are not: labels sit inside braces, values inside quotes).
std::set<std::string> metric_names(const std::string& expr) {
  std::string bare;  // quoted strings and {...} matchers removed
  int depth = 0;
  bool quoted = false;
  for (char c : expr) {
    if (quoted) {
      quoted = c != '"';
      continue;
    }
    if (c == '"') quoted = true;
    else if (c == '{') ++depth;
    else if (c == '}') --depth;
    else if (depth == 0) bare += c;
  }
  std::set<std::string> names;
  static const std::regex ident(R"((vllm:|kvpack_)[A-Za-z0-9_:]*)");
  for (std::sregex_iterator it(bare.begin(), bare.end(), ident), end; it != end; ++it) names.insert(it->str());
  return names;
}

class DashboardTest : public test::StoriesModelTest {};

// An engine with `eo` behind a real server on a loopback port, and a client for it.
struct LoopbackServer {
  LoopbackServer(const Model& model, const EngineOptions& eo, const compress::CompressConfig& default_kv = {})
      : engine(model, eo), srv(engine, options(default_kv)), cli("127.0.0.1", srv.start()) {
    cli.set_read_timeout(120, 0);
  }
  static server::ServerOptions options(const compress::CompressConfig& default_kv) {
    server::ServerOptions opt;
    opt.host = "127.0.0.1";
    opt.port = 0;
    opt.default_kv = default_kv;
    return opt;
  }
  Engine engine;
  server::Server srv;
  httplib::Client cli;
};

TEST_F(DashboardTest, EveryQueriedMetricExistsAndHasSamples) {
  std::ifstream in(std::string(KVPACK_SOURCE_DIR) + "/deploy/grafana/kvpack-dashboard.json");
  ASSERT_TRUE(in) << "deploy/grafana/kvpack-dashboard.json missing";
  const json dash = json::parse(in);
  std::vector<std::string> exprs;
  collect_exprs(dash, exprs);
  ASSERT_GE(exprs.size(), 20u);

  EngineOptions eo;
  eo.threads = 1;
  eo.kv_cold = "host:64M";
  LoopbackServer server(*model_, eo);
  httplib::Client& cli = server.cli;
  json compressed = {{"prompt", "Once upon a time"}, {"max_tokens", 300}, {"temperature", 0}, {"ignore_eos", true},
                     {"kv_policy", "knorm"}, {"kv_budget", 48}, {"kv_recall", true}};
  ASSERT_EQ(cli.Post("/v1/completions", compressed.dump(), "application/json")->status, 200);
  json plain = {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
  ASSERT_EQ(cli.Post("/v1/completions", plain.dump(), "application/json")->status, 200);
  const std::string metrics = cli.Get("/metrics")->body;
  server.srv.stop();

  std::map<std::string, std::string> type_of;  // family -> type
  std::set<std::string> sampled;               // families with at least one sample
  std::istringstream lines(metrics);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream f(line.substr(7));
      std::string name, type;
      f >> name >> type;
      type_of[name] = type;
    } else if (!line.empty() && line[0] != '#') {
      sampled.insert(line.substr(0, line.find_first_of("{ ")));
    }
  }
  int checked = 0;
  for (const std::string& e : exprs)
    for (std::string name : metric_names(e)) {
      std::string family = name;
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string s = suffix;
        if (family.size() > s.size() && family.compare(family.size() - s.size(), s.size(), s) == 0 &&
            type_of.count(family.substr(0, family.size() - s.size())) && type_of[family.substr(0, family.size() - s.size())] == "histogram")
          family.resize(family.size() - s.size());
      }
      ASSERT_TRUE(type_of.count(family)) << "the dashboard queries " << name << ", which /metrics does not have (in: " << e << ")";
      EXPECT_TRUE(sampled.count(name)) << name << " has no sample after compressed + plain traffic (in: " << e << ")";
      ++checked;
    }
  EXPECT_GE(checked, 40);
}

// The exact drift check and its guard through the HTTP API (a real server on loopback): kv_drift_exact gives
// usage.kvpack.exact_tv and the kvpack_kv_exact_* counters; kv_guard_exact is accepted; a non-boolean is a 400.
TEST_F(DashboardTest, TheExactDriftCheckIsReportedPerRequestAndAsMetrics) {
  EngineOptions eo;
  eo.threads = 1;
  eo.kv_cold = "host:64M";
  eo.contexts = 2;
  LoopbackServer server(*model_, eo);
  httplib::Client& cli = server.cli;
  json req = {{"prompt", "Once upon a time"}, {"max_tokens", 300}, {"temperature", 0}, {"ignore_eos", true},
              {"kv_policy", "knorm"}, {"kv_budget", 48}, {"kv_drift_exact", true}};
  auto r = cli.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  const json usage = json::parse(r->body)["usage"]["kvpack"];
  EXPECT_GT(usage["evicted_tokens"].get<int64_t>(), 0);
  EXPECT_GE(usage["exact_tv"].get<double>(), 0.0);
  EXPECT_LE(usage["exact_tv"].get<double>(), 1.0);
  EXPECT_EQ(usage["guard_fallbacks"].get<int64_t>(), 0);  // no guard asked for
  EXPECT_EQ(usage["guard_fallbacks_incomplete"].get<int64_t>(), 0);
  EXPECT_EQ(usage["guard_fallbacks_refused"].get<int64_t>(), 0);
  req.erase("kv_drift_exact");
  req["kv_guard_exact"] = true;
  r = cli.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_GE(json::parse(r->body)["usage"]["kvpack"]["exact_tv"].get<double>(), 0.0);
  req["kv_guard_exact"] = "yes";
  EXPECT_EQ(cli.Post("/v1/completions", req.dump(), "application/json")->status, 400);
  const std::string metrics = cli.Get("/metrics")->body;
  server.srv.stop();
  const std::string key = "kvpack_kv_exact_checks_total{policy=\"knorm\"} ";
  const size_t at = metrics.find(key);
  ASSERT_NE(at, std::string::npos) << metrics;
  EXPECT_GE(std::stod(metrics.substr(at + key.size())), 2.0);  // at least the end-of-prefill check of each request
  EXPECT_NE(metrics.find("kvpack_kv_guard_fallbacks_total{policy=\"knorm\"} "), std::string::npos);
}

// A server whose default compression has the exact check and its guard on (`kvpack serve --kv-guard-exact`):
// a request can turn them off (kv_drift_exact: false, no check at all; kv_guard_exact: false, the check
// without the guard) and choose the check's cadence (kv_drift_exact_every; out of range is a 400).
TEST_F(DashboardTest, ARequestCanTurnOffTheServersExactCheckAndSetItsCadence) {
  EngineOptions eo;
  eo.threads = 1;
  eo.kv_cold = "host:64M";
  compress::CompressConfig def;
  def.policy = compress::PolicyKind::KNorm;
  def.budget = 48;
  def.interval = 16;
  def.recall.enabled = true;
  def.recall.bring_back = false;
  def.recall.exact = true;
  def.recall.exact_guard = compress::kExactGuardTv;
  LoopbackServer server(*model_, eo, def);
  httplib::Client& cli = server.cli;
  auto usage_of = [&](const json& req) {
    auto r = cli.Post("/v1/completions", req.dump(), "application/json");
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body)["usage"]["kvpack"];
  };
  const json base = {{"prompt", "Once upon a time"}, {"max_tokens", 120}, {"temperature", 0}, {"ignore_eos", true}};
  EXPECT_GE(usage_of(base)["exact_tv"].get<double>(), 0.0);  // the server's default: checked
  json off = base;
  off["kv_drift_exact"] = false;
  const json u = usage_of(off);
  EXPECT_GT(u["evicted_tokens"].get<int64_t>(), 0);  // still compressed
  EXPECT_EQ(u["exact_tv"].get<double>(), -1.0);      // no check ran
  EXPECT_EQ(u["guard_fallbacks"].get<int64_t>(), 0);
  json every = base;
  every["kv_guard_exact"] = false;
  every["kv_drift_exact_every"] = 1 << 20;  // right after prefill only
  EXPECT_GE(usage_of(every)["exact_tv"].get<double>(), 0.0);
  every["kv_drift_exact_every"] = -1;
  EXPECT_EQ(cli.Post("/v1/completions", every.dump(), "application/json")->status, 400);
  server.srv.stop();
}

TEST(DashboardQueries, MetricNamesSkipLabelsAndFunctions) {
  const auto n = metric_names(R"(histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name=~"kvpack_x"}[5m]))) / kvpack_kv_pages_total)");
  EXPECT_EQ(n, (std::set<std::string>{"vllm:e2e_request_latency_seconds_bucket", "kvpack_kv_pages_total"}));
}

}  // namespace
