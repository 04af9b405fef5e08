// Randomized: several sequences sharing one pool, appends / compressions / restarts, pool invariants.
#include <gtest/gtest.h>

#include "compress_test_refs.h"

using namespace kvpack;
using namespace kvpack::compress;
using namespace kvpack::compress_test;

// ===================================================================================================
// Randomized: several sequences sharing one pool, appends / compressions / restarts, pool invariants
// and content after every operation.

TEST(CompressInvariants, RandomizedPoolInvariants) {
  const ModelConfig mc = tiny_model(false, 2, 4, 2);
  const QueryStats qs = make_stats(mc, 900);
  kv::PagePool pool(pool_config(64));  // small enough that some appends are refused
  std::mt19937 rng(901);
  const PolicyKind policies[] = {PolicyKind::Streaming, PolicyKind::KNorm, PolicyKind::TriAttention, PolicyKind::SnapKV,
                                 PolicyKind::RKV, PolicyKind::TOVA, PolicyKind::H2O};
  struct Slot {
    std::unique_ptr<Seq> seq;
    std::unique_ptr<SequenceCompressor> comp;
    std::unique_ptr<Queries> qf;
    CompressConfig cfg;
    int32_t prompt = 0;
  };
  std::vector<Slot> seqs(3);
  auto restart = [&](Slot& sl) {
    sl.comp.reset();
    sl.seq = std::make_unique<Seq>(pool, mc, static_cast<uint32_t>(rng()));
    sl.qf = std::make_unique<Queries>(mc, static_cast<uint32_t>(rng()));
    const PolicyKind p = policies[rng() % 7];
    const int32_t budget = 13 + static_cast<int32_t>(rng() % 20);  // >= sinks (<= 3) + window (<= 8) + 1
    sl.cfg = make_cfg(p, budget, static_cast<int32_t>(rng() % 4), static_cast<int32_t>(rng() % 3) - 1, 1 + static_cast<int32_t>(rng() % 12));
    sl.cfg.protect_prompt = rng() % 4 == 0;
    sl.cfg.compress_prefill = rng() % 2 == 0;
    sl.cfg.split = static_cast<BudgetSplit>(rng() % 3);
    sl.prompt = static_cast<int32_t>(rng() % 12);
    sl.comp = std::make_unique<SequenceCompressor>(sl.cfg, mc, &qs, sl.prompt);
  };
  for (auto& sl : seqs) restart(sl);
  auto all_kv = [&]() {
    std::vector<kv::SequenceKv*> v;
    for (auto& sl : seqs) v.push_back(&sl.seq->kv());
    return v;
  };
  int compressions = 0, refused = 0;
  for (int op = 0; op < 3000; ++op) {
    Slot& sl = seqs[rng() % seqs.size()];
    const int r = static_cast<int>(rng() % 100);
    const CompressionStats before = sl.comp->stats();
    Snapshot sn = snapshot(*sl.seq);
    bool compressed = false;
    if (r < 80) {  // a forward of 1..9 tokens (mostly decode)
      const int32_t n = r < 60 ? 1 : 1 + static_cast<int32_t>(rng() % 9);
      std::vector<int32_t> toks(static_cast<size_t>(n), 1);
      BatchItem item;
      item.tokens = toks;
      sl.comp->prepare(sl.seq->kv(), item);
      if (!sl.seq->append(n)) {
        ++refused;
        EXPECT_EQ(sl.seq->kv().total_slots(), sn.total_slots);
      } else {
        if (item.key_mass != nullptr)
          for (int32_t s = 0; s < sl.seq->kv().n_streams(); ++s)
            for (int32_t j = 0; j < sl.seq->kv().n_slots(s); ++j)
              item.key_mass[static_cast<size_t>(s) * item.key_mass_stride + j] += static_cast<float>(rng() % 1000) / 1000.0f;
        sl.qf->feed(*sl.comp, n);
        sn = snapshot(*sl.seq);
        compressed = sl.comp->after_forward(sl.seq->kv(), r >= 60);
      }
    } else if (r < 92) {
      sl.comp->compress(sl.seq->kv());
      compressed = sl.cfg.enabled();
    } else {
      restart(sl);
    }
    if (compressed) {
      ++compressions;
      expect_stats(*sl.seq, sn, before, sl.comp->stats());
      for (int32_t s = 0; s < sl.seq->kv().n_streams(); ++s) {
        const auto got = kept_slots(*sl.seq, sn, s);
        const auto prot = protect_mask(sn.pos[static_cast<size_t>(s)], sl.cfg.sinks, sl.cfg.effective_window(),
                                       sl.cfg.protect_prompt ? sl.prompt : 0);
        const auto n_prot = static_cast<int32_t>(std::count(prot.begin(), prot.end(), true));
        const auto n_before = static_cast<int32_t>(prot.size());
        if (sl.cfg.split == BudgetSplit::Uniform) {
          EXPECT_EQ(static_cast<int32_t>(got.size()), n_before <= sl.cfg.budget ? n_before : std::max(sl.cfg.budget, n_prot))
              << "op " << op << " stream " << s;
        }
        for (size_t j = 0; j < prot.size(); ++j)
          if (prot[j]) {
            ASSERT_TRUE(std::binary_search(got.begin(), got.end(), static_cast<int32_t>(j))) << "protected slot evicted, op " << op;
          }
      }
    }
    ASSERT_EQ(check_pool(pool, all_kv()), "") << "op " << op;
    int64_t held = 0;
    for (auto* k : all_kv()) held += k->pages_held();
    ASSERT_EQ(held, pool.used_pages()) << "op " << op;
    ASSERT_TRUE(sl.seq->check_content()) << "op " << op;
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(compressions, 200);
  EXPECT_GT(refused, 0);  // the pool is small enough to exercise all-or-nothing appends
  RecordProperty("compressions", compressions);
  RecordProperty("refused_appends", refused);
}
