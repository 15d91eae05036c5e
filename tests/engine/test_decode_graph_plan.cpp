// The planning of the decode step's CUDA graphs (engine/decode_graph_plan.h): which bucket a step pads to,
// when a graph is captured, replayed or skipped, and what the padded step's static inputs hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "hybridflow/core/error.h"
#include "hybridflow/engine/decode_graph_plan.h"

namespace hybridflow {
namespace {

DecodeGraphPlan plan(int64_t max_rows = 512, int64_t max_span = 4096, int64_t max_graphs = 64, int64_t reuse_factor = 1,
                     int64_t span_headroom = 1) {
  return DecodeGraphPlan({.block_size = 16,
                          .max_rows = max_rows,
                          .max_span = max_span,
                          .max_graphs = max_graphs,
                          .reuse_factor = reuse_factor,
                          .span_headroom = span_headroom});
}

TEST(DecodeGraphPlan, QuarterOctaveBuckets) {
  EXPECT_EQ(quarter_octave_bucket(5, 1, 8), 5);
  EXPECT_EQ(quarter_octave_bucket(960, 16, 0), 1024);
  EXPECT_EQ(quarter_octave_bucket(1024, 16, 0), 1024);
  EXPECT_EQ(quarter_octave_bucket(1040, 16, 0), 1280);
  EXPECT_EQ(quarter_octave_bucket(65, 8, 0), 80);
  EXPECT_EQ(quarter_octave_bucket(17, 16, 0), 32);  // never a step below `step`
  // Every bucket holds its size and pads by at most a quarter past small sizes.
  for (int64_t n = 1; n <= 5000; ++n) {
    const int64_t b = quarter_octave_bucket(n, 16, 0);
    ASSERT_GE(b, n);
    ASSERT_EQ(b % 16, 0) << n;
    if (n > 64) {
      ASSERT_LE(static_cast<double>(b - n), 0.25 * static_cast<double>(n)) << n;
    }
  }
}

TEST(DecodeGraphPlan, RowAndSpanBuckets) {
  const DecodeGraphPlan p = plan();
  EXPECT_EQ(p.bucket(1, 5), (DecodeGraphBucket{1, 16}));
  EXPECT_EQ(p.bucket(3, 17), (DecodeGraphBucket{4, 32}));
  EXPECT_EQ(p.bucket(8, 961), (DecodeGraphBucket{8, 1024}));
  EXPECT_EQ(p.bucket(9, 100), (DecodeGraphBucket{16, 112}));
  EXPECT_EQ(p.bucket(57, 1024), (DecodeGraphBucket{64, 1024}));
  EXPECT_EQ(p.bucket(250, 1025), (DecodeGraphBucket{256, 1280}));
  EXPECT_EQ(p.bucket(513, 10).rows, 0);  // past max_rows: eager
  // Buckets are cut to max_rows and to the longest sequence a step can hold (in whole blocks).
  EXPECT_EQ(plan(100).bucket(97, 5).rows, 100);
  EXPECT_EQ(plan(512, 1000).bucket(1, 990), (DecodeGraphBucket{1, 1008}));
  // A step that consecutive rollouts see alike maps to one bucket as its batch shrinks a little.
  EXPECT_EQ(p.bucket(60, 900), p.bucket(64, 1000));
  EXPECT_THROW(p.bucket(0, 5), Error);
}

TEST(DecodeGraphPlan, CapturesEachBucketOnceUpToTheLimit) {
  DecodeGraphPlan p = plan(512, 4096, 2);
  auto d = p.decide(5, 40);
  EXPECT_EQ(d.action, DecodeGraphPlan::Action::kCapture);
  EXPECT_EQ(d.bucket, (DecodeGraphBucket{8, 48}));
  p.mark_captured(d.bucket);
  EXPECT_EQ(p.decide(6, 33).action, DecodeGraphPlan::Action::kReplay);  // same bucket
  EXPECT_EQ(p.decide(6, 60).action, DecodeGraphPlan::Action::kCapture);
  p.mark_captured(p.decide(6, 60).bucket);
  EXPECT_EQ(p.graphs(), 2);
  EXPECT_EQ(p.decide(20, 60).action, DecodeGraphPlan::Action::kEager);  // no room for a third graph
  EXPECT_EQ(p.decide(8, 64).action, DecodeGraphPlan::Action::kReplay);
  EXPECT_EQ(p.decide(600, 64).action, DecodeGraphPlan::Action::kEager);
  EXPECT_EQ(plan(512, 4096, 0).decide(1, 1).action, DecodeGraphPlan::Action::kEager);
}

// A step replays a captured graph up to reuse_factor times its own bucket in rows and span, the fewest rows
// first, rather than capturing its own.
TEST(DecodeGraphPlan, ReplaysALargerGraphWithinTheReuseFactor) {
  DecodeGraphPlan p = plan(512, 4096, 64, /*reuse_factor=*/2);
  p.mark_captured({64, 128});
  p.mark_captured({256, 128});
  EXPECT_EQ(p.decide(40, 100).bucket, (DecodeGraphBucket{64, 128}));  // own {40, 112}: 64 <= 80 rows
  EXPECT_EQ(p.decide(40, 100).action, DecodeGraphPlan::Action::kReplay);
  EXPECT_EQ(p.decide(129, 128).bucket, (DecodeGraphBucket{256, 128}));  // own {160, 128}; 64 rows are too few
  const auto small = p.decide(20, 100);  // own {24, 112}: 64 rows are more than twice 24
  EXPECT_EQ(small.action, DecodeGraphPlan::Action::kCapture);
  EXPECT_EQ(small.bucket, (DecodeGraphBucket{24, 112}));
  EXPECT_EQ(p.decide(40, 129).action, DecodeGraphPlan::Action::kCapture);  // longer than every graph's span
  p.mark_captured({64, 1024});
  EXPECT_EQ(p.decide(40, 200).action, DecodeGraphPlan::Action::kCapture);  // own span 224: 1024 is past twice it
  EXPECT_EQ(p.decide(40, 500).bucket, (DecodeGraphBucket{64, 1024}));      // own span 512
  // Exact buckets only with a factor of 1.
  DecodeGraphPlan exact = plan();
  exact.mark_captured({64, 128});
  EXPECT_EQ(exact.decide(40, 100).action, DecodeGraphPlan::Action::kCapture);
  EXPECT_THROW(plan(512, 4096, 64, 0), Error);
  EXPECT_THROW(plan(512, 4096, 64, 1, 0), Error);
}

// span_headroom captures a longer span than the step's bucket (cut to max_span), which later, longer steps fit.
TEST(DecodeGraphPlan, CapturesSpanHeadroom) {
  DecodeGraphPlan p = plan(512, 300, 64, /*reuse_factor=*/1, /*span_headroom=*/2);
  const auto first = p.decide(5, 40);
  EXPECT_EQ(first.bucket, (DecodeGraphBucket{8, 96}));
  p.mark_captured(first.bucket);
  EXPECT_EQ(p.decide(5, 90).action, DecodeGraphPlan::Action::kReplay);
  EXPECT_EQ(p.decide(5, 90).bucket, first.bucket);
  const auto longer = p.decide(5, 97);  // own span 112
  EXPECT_EQ(longer.action, DecodeGraphPlan::Action::kCapture);
  EXPECT_EQ(longer.bucket, (DecodeGraphBucket{8, 224}));
  p.mark_captured(longer.bucket);
  EXPECT_EQ(p.decide(5, 250).bucket, (DecodeGraphBucket{8, 304}));  // own 256: cut to max_span in whole blocks
}

// A rollout's batch shrinks while its sequences grow: with reuse and headroom it captures a few graphs where
// exact buckets capture one per bucket it passes through; every replayed graph holds its step.
TEST(DecodeGraphPlan, ARolloutCapturesFewGraphs) {
  auto captures = [](DecodeGraphPlan p) {
    int64_t count = 0;
    for (int64_t step = 0; step < 256; ++step) {
      const int64_t rows = 256 - step, longest = 100 + step;
      const auto d = p.decide(rows, longest);
      EXPECT_NE(d.action, DecodeGraphPlan::Action::kEager) << step;
      EXPECT_GE(d.bucket.rows, rows) << step;
      EXPECT_GE(d.bucket.span, longest) << step;
      EXPECT_LE(d.bucket.rows, 2 * p.bucket(rows, longest).rows) << step;
      if (d.action == DecodeGraphPlan::Action::kCapture) {
        ++count;
        p.mark_captured(d.bucket);
      }
    }
    return count;
  };
  const int64_t exact = captures(plan(512, 356)), reused = captures(plan(512, 356, 64, 2, 2));
  std::printf("256 rows ending one a step, 100 to 356 positions: %lld graphs captured with exact buckets, %lld "
              "with reuse and span headroom\n",
              static_cast<long long>(exact), static_cast<long long>(reused));
  EXPECT_GE(exact, 20);
  EXPECT_LE(reused, 8);
}

TEST(DecodeGraphPlan, PadsRowsTablesAndLengths) {
  const DecodeGraphPlan p = plan();
  const DecodeGraphBucket bucket = p.bucket(3, 40);
  ASSERT_EQ(bucket, (DecodeGraphBucket{4, 48}));
  // Row 1's table is longer than the span needs (blocks taken ahead): cut to the span's 3 blocks.
  const PaddedDecodeStep step = p.pad(bucket, {11, 12, 13}, {{7}, {3, 9, 4, 8}, {5, 6, 2}}, {15, 39, 20}, 99, 0);
  EXPECT_EQ(step.tokens, (std::vector<int64_t>{11, 12, 13, 0}));
  EXPECT_EQ(step.lengths, (std::vector<int64_t>{15, 39, 20, 0}));
  EXPECT_EQ(step.tables, (std::vector<int64_t>{7, 99, 99, 3, 9, 4, 5, 6, 2, 99, 99, 99}));
  // A row whose position lies past its table or the span is refused, naming it.
  try {
    p.pad(bucket, {1}, {{7}}, {16}, 99, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 0 at position 16 with a table of 1 blocks"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(p.pad(bucket, {1, 2, 3, 4, 5}, {{1}, {1}, {1}, {1}, {1}}, {0, 0, 0, 0, 0}, 99, 0), Error);
  EXPECT_THROW(DecodeGraphPlan({.block_size = 0, .max_rows = 1, .max_span = 1}), Error);
}

// write_padded() is pad()'s three vectors one after the other, written into the caller's buffer from pointers
// to the tables; without tokens every token is the pad token.
TEST(DecodeGraphPlan, WritesThePaddedStepInPlace) {
  const DecodeGraphPlan p = plan();
  const DecodeGraphBucket bucket = p.bucket(3, 40);
  const std::vector<std::vector<int64_t>> tables = {{7}, {3, 9, 4, 8}, {5, 6, 2}};
  const std::vector<int64_t> tokens = {11, 12, 13}, lengths = {15, 39, 20};
  const PaddedDecodeStep step = p.pad(bucket, tokens, tables, lengths, 99, 0);
  std::vector<int64_t> expected = step.tokens;
  expected.insert(expected.end(), step.lengths.begin(), step.lengths.end());
  expected.insert(expected.end(), step.tables.begin(), step.tables.end());
  const std::vector<const std::vector<int64_t>*> refs = {&tables[0], &tables[1], &tables[2]};
  std::vector<int64_t> out(expected.size(), -1);
  p.write_padded(bucket, tokens.data(), refs, lengths, 99, 0, out.data());
  EXPECT_EQ(out, expected);
  std::fill(out.begin(), out.end(), -1);
  p.write_padded(bucket, nullptr, refs, lengths, 99, 5, out.data());
  EXPECT_EQ(std::vector<int64_t>(out.begin(), out.begin() + 4), (std::vector<int64_t>{5, 5, 5, 5}));
  EXPECT_EQ(std::vector<int64_t>(out.begin() + 4, out.end()), std::vector<int64_t>(expected.begin() + 4, expected.end()));
  // A row past its table is refused before anything is written past the buffer.
  const std::vector<int64_t> short_table = {7};
  EXPECT_THROW(p.write_padded(bucket, nullptr, {&short_table}, {16}, 99, 0, out.data()), Error);
}

}  // namespace
}  // namespace hybridflow
