// The fused decode's few-rows matrix-vector kernel: its AVX2 and AVX-512 variants against the portable loops
// on odd shapes (rows 1..8, lengths not a multiple of any vector width, feature ranges that start and end
// inside a register block, row strides wider than the rows), each skipped where the CPU lacks it.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "model/fused_decode.h"

namespace fd = hybridflow::fused_decode;

namespace {

struct Case {
  int64_t rows, in, out, o0, o1;
};

std::vector<Case> cases() {
  std::vector<Case> all;
  std::mt19937 rng(31);
  const int64_t lengths[] = {1, 7, 15, 16, 17, 33, 100, 257, 899};
  for (int64_t rows = 1; rows <= fd::kMaxVectorRows; ++rows)
    for (int64_t in : lengths) {
      const int64_t out = 1 + static_cast<int64_t>(rng() % 23);
      const int64_t o0 = static_cast<int64_t>(rng() % out);
      const int64_t o1 = o0 + 1 + static_cast<int64_t>(rng() % (out - o0));
      all.push_back({rows, in, out, o0, o1});
    }
  return all;
}

struct Data {
  int64_t ldx, ldy;
  std::vector<float> w, x;
};

Data case_data(const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Data d{c.in + 3, c.out + 5, std::vector<float>(static_cast<size_t>(c.out * c.in)),
         std::vector<float>(static_cast<size_t>(c.rows * (c.in + 3)))};
  for (float& v : d.w) v = normal(rng);
  for (float& v : d.x) v = normal(rng);
  return d;
}

// y of `isa` over the case, NaN where the kernel must not write; false when the CPU lacks it.
bool run(fd::Isa isa, const Case& c, const Data& d, std::vector<float>& y) {
  y.assign(static_cast<size_t>(c.rows * d.ldy), std::numeric_limits<float>::quiet_NaN());
  return fd::rows_dot_with(isa, d.w.data(), c.in, d.x.data(), d.ldx, c.rows, c.o0, c.o1, y.data(), d.ldy);
}

void expect_equals_portable(fd::Isa isa, const char* name) {
  std::mt19937 rng(7);
  for (const Case& c : cases()) {
    const Data d = case_data(c, rng);
    std::vector<float> want, got;
    ASSERT_TRUE(run(fd::Isa::portable, c, d, want));
    if (!run(isa, c, d, got)) GTEST_SKIP() << "this CPU has no " << name;
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t o = 0; o < d.ldy; ++o) {
        const size_t i = static_cast<size_t>(r * d.ldy + o);
        const std::string where = std::string(name) + " rows " + std::to_string(c.rows) + " in " +
                                  std::to_string(c.in) + " row " + std::to_string(r) + " feature " + std::to_string(o);
        if (o < c.o0 || o >= c.o1) {
          EXPECT_TRUE(std::isnan(got[i])) << "wrote outside its features: " << where;
          continue;
        }
        // Both sum the same products in different orders: each differs from the exact sum by at most
        // in * eps * sum |w x| (the classical bound for recursive summation).
        double magnitude = 0;
        for (int64_t k = 0; k < c.in; ++k)
          magnitude += std::fabs(static_cast<double>(d.w[static_cast<size_t>(o * c.in + k)]) *
                                 d.x[static_cast<size_t>(r * d.ldx + k)]);
        EXPECT_NEAR(got[i], want[i], 2.0 * static_cast<double>(c.in) * FLT_EPSILON * magnitude) << where;
      }
  }
}

}  // namespace

TEST(FusedDecodeKernels, Avx2EqualsPortableWithinRounding) { expect_equals_portable(fd::Isa::avx2, "avx2"); }

TEST(FusedDecodeKernels, Avx512EqualsPortableWithinRounding) { expect_equals_portable(fd::Isa::avx512, "avx512f"); }

// The AVX-512 kernel sums each (row, feature) in one chain whatever shares its pass, so a row's result is the
// same bits alone or among up to eight rows, and whichever feature range (a thread's share) it falls in.
TEST(FusedDecodeKernels, Avx512RowIsTheSameAloneOrInABatch) {
  std::mt19937 rng(11);
  for (const Case& c : cases()) {
    const Data d = case_data(c, rng);
    std::vector<float> batch;
    if (!run(fd::Isa::avx512, c, d, batch)) GTEST_SKIP() << "this CPU has no avx512f";
    for (int64_t r = 0; r < c.rows; ++r) {
      const Case alone{1, c.in, c.out, 0, c.out};
      const Data row{d.ldx, d.ldy, d.w,
                     std::vector<float>(d.x.begin() + r * d.ldx, d.x.begin() + (r + 1) * d.ldx)};
      std::vector<float> single;
      ASSERT_TRUE(run(fd::Isa::avx512, alone, row, single));
      for (int64_t o = c.o0; o < c.o1; ++o)
        EXPECT_EQ(batch[static_cast<size_t>(r * d.ldy + o)], single[static_cast<size_t>(o)])
            << "rows " << c.rows << " in " << c.in << " row " << r << " feature " << o;
    }
  }
}

// The decode uses the widest variant the CPU has.
TEST(FusedDecodeKernels, SelectsTheWidestVariantTheCpuHas) {
  std::vector<float> w(16, 1.0f), x(16, 1.0f), y(1);
  const bool avx512 = fd::rows_dot_with(fd::Isa::avx512, w.data(), 16, x.data(), 16, 1, 0, 1, y.data(), 1);
  const bool avx2 = fd::rows_dot_with(fd::Isa::avx2, w.data(), 16, x.data(), 16, 1, 0, 1, y.data(), 1);
  EXPECT_EQ(fd::selected_isa(), avx512 ? fd::Isa::avx512 : avx2 ? fd::Isa::avx2 : fd::Isa::portable);
}
