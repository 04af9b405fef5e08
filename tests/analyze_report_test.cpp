// The analyzer end to end on generated traffic with known planted causes: with all five planted it
// finds every one and prices each within 10 % (relative) of the ground truth, which is measured by
// generating the same traffic again without the cause (no normaliser involved). Each cause planted
// alone is found and no other is flagged; clean traffic flags nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <unistd.h>

#include "analyze/analyzer.h"
#include "analyze/traffic_gen.h"
#include "gguf/gguf.h"
#include "shared_files.h"

using namespace kvpack;
using namespace kvpack::analyze;

namespace {

struct Stories {
  std::unique_ptr<gguf::File> file = gguf::File::open(test::shared_path("models/stories260K.gguf"));
  Tokenizer tok = Tokenizer::from_gguf(*file);
};

// Through a file and the reader, as `kvpack analyze-prefix` gets it.
Log round_trip(const Log& log, const std::string& name) {
  const std::string path = ::testing::TempDir() + "/kvpack_" + std::to_string(::getpid()) + "_" + name + ".jsonl";
  {
    std::ofstream out(path, std::ios::binary);
    for (const auto& r : log) out << to_log_line(r) << "\n";
  }
  Log back = read_request_log_file(path);
  std::remove(path.c_str());
  return back;
}

}  // namespace

TEST(PrefixReport, FindsAllFivePlantedCausesAndPricesEachWithinTenPercent) {
  Stories s;
  PromptRenderer renderer(s.tok, server::ChatFormat::Plain);
  TrafficSpec spec;
  spec.requests = 200;
  spec.seed = 7;
  spec.planted = {kAttributionOrder.begin(), kAttributionOrder.end()};
  const SimOptions sim{16, 0};
  const GroundTruth truth = ground_truth(spec, renderer, sim);
  const Log log = round_trip(generate_traffic(spec), "five");
  const Report rep = analyze_prefix_reuse(log, renderer, {sim});

  EXPECT_NEAR(rep.hit_rate, truth.hit_rate, 1e-12);  // the same simulation of the same log
  ASSERT_EQ(rep.causes.size(), 5u);
  double sum = 0;
  for (size_t i = 0; i < 5; ++i) {
    const CauseReport& e = rep.causes[i];
    const TruthRow& t = truth.rows[i];
    SCOPED_TRACE(cause_name(e.cause));
    ASSERT_EQ(e.cause, t.cause);
    EXPECT_GT(e.requests_affected, 0);
    EXPECT_TRUE(e.example.has_value());
    // Every planted cause costs something worth measuring, so a relative bound means something.
    EXPECT_GE(t.points_lost(), 1.0);
    EXPECT_LE(std::fabs(e.points_lost() - t.points_lost()), 0.10 * t.points_lost())
        << "estimated " << e.points_lost() << " points, true " << t.points_lost();
    sum += e.points_lost();
  }
  // The rows add up to the saving of fixing everything.
  EXPECT_NEAR(sum, 100.0 * static_cast<double>(rep.computed_tokens - rep.computed_tokens_fixed) / static_cast<double>(rep.prompt_tokens),
              1e-9);
  EXPECT_GT(rep.hit_rate_fixed, rep.hit_rate + 0.3);
}

TEST(PrefixReport, EachCausePlantedAloneIsTheOnlyOneFlagged) {
  for (Cause planted : kAttributionOrder) {
    SCOPED_TRACE(cause_name(planted));
    TrafficSpec spec;
    spec.requests = 120;
    spec.seed = 3;
    spec.planted = {planted};
    const Log log = generate_traffic(spec);
    for (Cause c : kAttributionOrder) {
      const Detection d = detect(c, log);
      if (c == planted) EXPECT_GT(d.affected.size(), 5u);
      else EXPECT_TRUE(d.affected.empty()) << cause_name(c) << " flagged " << d.affected.size() << " requests";
    }
  }
}

TEST(PrefixReport, CleanTrafficFlagsNothingAndLosesNothing) {
  Stories s;
  PromptRenderer renderer(s.tok, server::ChatFormat::Plain);
  TrafficSpec spec;
  spec.requests = 120;
  spec.seed = 5;
  const Report rep = analyze_prefix_reuse(generate_traffic(spec), renderer, {SimOptions{16, 0}});
  for (const auto& c : rep.causes) {
    SCOPED_TRACE(cause_name(c.cause));
    EXPECT_EQ(c.requests_affected, 0);
    // Normalisers may rewrite stable text (a masked date), which moves block edges a little.
    EXPECT_LT(std::fabs(c.points_lost()), 0.5);
  }
  EXPECT_GT(rep.hit_rate, 0.6);  // clean traffic reuses most of its prompts
}

TEST(PrefixReport, TextAndJsonCarryEveryCauseWithExampleAndFix) {
  Stories s;
  PromptRenderer renderer(s.tok, server::ChatFormat::Plain);
  TrafficSpec spec;
  spec.requests = 80;
  spec.planted = {Cause::Volatile, Cause::Documents};
  const Report rep = analyze_prefix_reuse(generate_traffic(spec), renderer, {SimOptions{16, 0}});
  const std::string text = format_report_text(rep);
  for (Cause c : kAttributionOrder) {
    EXPECT_NE(text.find("| " + std::string(cause_name(c)) + " "), std::string::npos) << cause_name(c);
    EXPECT_NE(text.find(cause_fix(c)), std::string::npos) << cause_name(c);
  }
  EXPECT_NE(text.find("system prompt first differs at byte"), std::string::npos) << text;
  EXPECT_NE(text.find("not found in this log"), std::string::npos) << text;  // tools, whitespace, truncation
  const ordered_json j = ordered_json::parse(report_json(rep).dump());
  ASSERT_EQ(j["causes"].size(), 5u);
  EXPECT_EQ(j["causes"][0]["cause"], "volatile");
  EXPECT_GT(j["causes"][0]["requests_affected"].get<int64_t>(), 0);
  EXPECT_TRUE(j["causes"][0].contains("example"));
  EXPECT_FALSE(j["causes"][1].contains("example"));
  EXPECT_EQ(j["requests"], 80);
}

TEST(PrefixReport, TheDifferenceIsShownAtTheCauseNotEarlier) {
  const DiffSpan d = first_difference("Now: 10:31:07 UTC. Request id: 4f.", "Now: 10:31:09 UTC. Request id: 9a.");
  EXPECT_EQ(d.offset, 12u);
  EXPECT_EQ(d.context, "Now: 10:31:0");
  EXPECT_EQ(d.a, "7");
  EXPECT_EQ(d.b, "9");
  const DiffSpan w = first_difference("line one \r\nline two", "line one\nline two");
  EXPECT_EQ(w.a, " \r");
  EXPECT_EQ(w.b, "");
  const DiffSpan u = first_difference("caf\xc3\xa9 ok", "caf\xc3\xa8 ok");  // never half a character
  EXPECT_EQ(u.a, "\xc3\xa9");
  EXPECT_EQ(u.b, "\xc3\xa8");
}
