// A `kvpack serve` in the test process on a loopback port, over stories260K (loaded once per suite), with a
// small HTTP client: post / get return the status and the parsed JSON body, stream returns the parsed SSE
// `data:` events of a streamed request. `configure` lets a suite change the server's options before it
// starts. TearDown checks the scheduler's invariants. Used by the server choices and first-hour tests.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/server.h"
#include "server_model_fixture.h"

namespace kvpack::test {

struct Reply {
  int status = 0;
  nlohmann::json body;
};

// The `data:` events of a Server-Sent-Events body, parsed (without the final [DONE]); `done` says whether
// [DONE] came.
inline std::vector<nlohmann::json> sse_events(std::string buf, bool* done) {
  std::vector<nlohmann::json> events;
  *done = false;
  for (size_t end; (end = buf.find("\n\n")) != std::string::npos;) {
    const std::string ev = buf.substr(0, end);
    buf.erase(0, end + 2);
    if (ev.rfind("data: ", 0) != 0) continue;
    if (ev == "data: [DONE]") *done = true;
    else events.push_back(nlohmann::json::parse(ev.substr(6)));
  }
  return events;
}

class LiveServerTest : public StoriesModelTest {
 protected:
  virtual void configure(server::ServerOptions&) {}
  void SetUp() override {
    EngineOptions eo;
    eo.threads = 1;
    engine = std::make_unique<Engine>(*model_, eo);
    server::ServerOptions opt;
    opt.host = "127.0.0.1";
    opt.port = 0;
    configure(opt);
    srv = std::make_unique<server::Server>(*engine, opt);
    port = srv->start();
  }
  void TearDown() override {
    srv->stop();
    EXPECT_EQ(srv->scheduler().check_invariants(), "");
  }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
    c->set_read_timeout(120, 0);
    return c;
  }
  Reply post(const std::string& path, const nlohmann::json& body) const {
    auto r = client()->Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {};
    return {r->status, nlohmann::json::parse(r->body, nullptr, false)};
  }
  Reply get(const std::string& path) const {
    auto r = client()->Get(path.c_str());
    if (!r) return {};
    return {r->status, nlohmann::json::parse(r->body, nullptr, false)};
  }
  std::vector<nlohmann::json> stream(const std::string& path, nlohmann::json body, bool* done) const {
    body["stream"] = true;
    auto r = client()->Post(path.c_str(), body.dump(), "application/json");
    *done = false;
    if (!r) return {};
    return sse_events(r->body, done);
  }

  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::Server> srv;
  int port = 0;
};

}  // namespace kvpack::test
