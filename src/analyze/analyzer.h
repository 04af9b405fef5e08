// `kvpack analyze-prefix`: prices every cause of lost prefix reuse in a request log. The log's prompts
// are rendered as the server renders them and run through a simulated prefix cache (prefix_sim.h):
// that is the actual hit rate. Then the causes are fixed one after another in kAttributionOrder (each
// normaliser applied on top of the previous ones) and the simulation runs again after each. A cause's
// tokens lost are the prefill tokens that fixing it saves (computed before minus computed after), and
// its hit-rate points lost are those tokens over the log's prompt tokens: the hit rate the log would
// have had if they had been cache hits. The rows add up to the saving of fixing everything.
// Why tokens over the log's own prompt tokens rather than the difference of two hit rates: a fix
// changes prompt lengths (a masked timestamp, re-anchored history), and the hit rate of the rewritten
// log counts those changed tokens too; on generated traffic that difference was 10 % off the ground
// truth for volatile spans, the token count 2 % (docs/observability.md).
// "Alone" fixes only that cause (with several causes the alone figures do not add up: a break early in
// the prompt hides later ones).
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
  int64_t tokens_lost = 0;         // prefill tokens computed because of the cause (the earlier causes fixed)
  int64_t alone_tokens_lost = 0;   // the same with only this cause fixed
  int64_t log_prompt_tokens = 0;   // of the log as it is: the denominator of the points
  double hit_rate_after = 0;       // the simulated hit rate of the log rewritten with this and the earlier fixes
  double points_lost() const { return points(tokens_lost); }
  double alone_points_lost() const { return points(alone_tokens_lost); }
  double points(int64_t tokens) const {
    return log_prompt_tokens > 0 ? 100.0 * static_cast<double>(tokens) / static_cast<double>(log_prompt_tokens) : 0;
  }
  struct ExampleText {
    std::string first_id, second_id, where, note;
    DiffSpan diff;  // of the part named by `where`
  };
  std::optional<ExampleText> example;
};

struct Report {
  int64_t requests = 0, chat_requests = 0, prompt_tokens = 0, computed_tokens = 0;
  std::string chat_format, order;
  SimOptions sim;
  double hit_rate = 0;        // simulated on the log as it is
  double hit_rate_fixed = 0;  // the simulated hit rate of the log rewritten with every fix
  int64_t computed_tokens_fixed = 0;
  int64_t logged_requests = 0, logged_prompt_tokens = 0, logged_cached_tokens = 0;  // server-reported, where present
  std::vector<CauseReport> causes;  // in attribution order
};

struct AnalyzeOptions {
  SimOptions sim;
  std::string order = "file order";  // how the log was ordered, for the report
};

Report analyze_prefix_reuse(const Log& log, PromptRenderer& renderer, const AnalyzeOptions& opt);
// The simulated cache over a log as it is (what the ground truth of generated traffic uses too).
SimResult simulate_log(const Log& log, PromptRenderer& renderer, const SimOptions& opt);

std::string format_report_text(const Report& r);
ordered_json report_json(const Report& r);

}  // namespace kvpack::analyze
