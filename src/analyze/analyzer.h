// `kvpack analyze-prefix`: prices every cause of lost prefix reuse in a request log. The log's prompts
// are rendered as the server renders them and run through a simulated prefix cache (prefix_sim.h):
// that is the actual hit rate. Then the causes are fixed one after another in kAttributionOrder (each
// normaliser applied on top of the previous ones) and the simulation runs again after each: a cause's
// lost hit rate is the hit rate with it fixed minus the hit rate just before, so the rows add up to the
// whole gap between the actual and the all-fixed hit rate. "Alone" fixes only that cause (the rows of
// a log with several causes do not add up then: a break early in the prompt hides later ones).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analyze/causes.h"
#include "analyze/prefix_sim.h"
#include "analyze/prompt_render.h"

namespace kvpack::analyze {

// The first difference between two rendered prompts, for the report.
struct DiffSpan {
  size_t offset = 0;    // byte offset in the rendered prompt text
  std::string context;  // text just before the difference (common to both)
  std::string a, b;     // the differing text of each, until the two agree again (or a bounded window)
};
DiffSpan first_difference(const std::string& a, const std::string& b);

struct CauseReport {
  Cause cause{};
  int64_t requests_affected = 0;
  int64_t tokens_lost = 0;    // prompt tokens computed because of the cause (with the earlier causes fixed)
  double hit_rate_before = 0, hit_rate_after = 0;  // cumulative: before and after fixing this cause
  double alone_hit_rate = 0;  // the actual log with only this cause fixed
  double points_lost() const { return 100.0 * (hit_rate_after - hit_rate_before); }
  struct ExampleText {
    std::string first_id, second_id, where;
    DiffSpan diff;
  };
  std::optional<ExampleText> example;
};

struct Report {
  int64_t requests = 0, chat_requests = 0, prompt_tokens = 0, computed_tokens = 0;
  std::string chat_format;
  SimOptions sim;
  double hit_rate = 0;        // simulated on the log as it is
  double hit_rate_fixed = 0;  // every cause fixed
  int64_t logged_requests = 0, logged_prompt_tokens = 0, logged_cached_tokens = 0;  // server-reported, where present
  std::vector<CauseReport> causes;  // in attribution order
};

struct AnalyzeOptions {
  SimOptions sim;
};

Report analyze_prefix_reuse(const Log& log, PromptRenderer& renderer, const AnalyzeOptions& opt);
// The simulated cache over a log as it is (what the ground truth of generated traffic uses too).
SimResult simulate_log(const Log& log, PromptRenderer& renderer, const SimOptions& opt);

std::string format_report_text(const Report& r);
ordered_json report_json(const Report& r);

}  // namespace kvpack::analyze
