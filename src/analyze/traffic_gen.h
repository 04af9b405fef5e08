// Test traffic with planted causes of lost prefix reuse, and its ground truth.
//
// Three applications share one server, their sessions interleaved in arrival order:
//   chat   multi-turn sessions (2-8 turns) under one system prompt;
//   agent  multi-turn sessions (2-5 turns) under another system prompt with five tool definitions,
//          users paste several lines per turn;
//   rag    single questions about one of six shared documents.
// Each cause, when planted, changes only how requests are written, never which conversations happen:
//   volatile    chat: the system prompt carries the time of the request and a request id
//               (else the date only);
//   tools       agent: the tools come in a random order per request (else one fixed order);
//   whitespace  agent: the newest user turn is sent as typed ("\r\n", trailing blanks) and re-sent
//               trimmed in later turns (else always trimmed);
//   truncation  chat: only the last 4 history messages are sent (else the whole history);
//   documents   rag: the question comes before the document (else after it).
// The ground truth of a cause is measured without any of the analyzer's normalisers: the same traffic
// is generated again with the cause not planted and run through the same cache simulation.
#pragma once
#include <cstdint>
#include <vector>

#include "analyze/causes.h"
#include "analyze/prefix_sim.h"
#include "analyze/prompt_render.h"

namespace kvpack::analyze {

struct TrafficSpec {
  int32_t requests = 400;
  uint64_t seed = 1;
  std::vector<Cause> planted;
};

Log generate_traffic(const TrafficSpec& spec);

struct TruthRow {
  Cause cause{};
  bool planted = false;
  int64_t tokens_lost = 0;        // computed without the causes before it (kAttributionOrder) minus without it too
  int64_t alone_tokens_lost = 0;  // the traffic as planted minus it without only this cause
  int64_t planted_prompt_tokens = 0;
  // Points as the analyzer counts them: tokens over the prompt tokens of the traffic as planted.
  double points_lost() const { return points(tokens_lost); }
  double alone_points_lost() const { return points(alone_tokens_lost); }
  double points(int64_t t) const {
    return planted_prompt_tokens > 0 ? 100.0 * static_cast<double>(t) / static_cast<double>(planted_prompt_tokens) : 0;
  }
};

struct GroundTruth {
  double hit_rate = 0;        // the traffic as planted
  double hit_rate_clean = 0;  // nothing planted
  std::vector<TruthRow> rows;  // kAttributionOrder
};

GroundTruth ground_truth(const TrafficSpec& spec, PromptRenderer& renderer, const SimOptions& sim);

}  // namespace kvpack::analyze
