#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/core/platform.h"

namespace hybridflow {

TEST(Platform, InitThreadsSetsAtenThreads) {
  init_threads(1);
  EXPECT_EQ(at::get_num_threads(), 1);
  init_threads(2);
  EXPECT_EQ(at::get_num_threads(), 2);
}

TEST(Platform, DetectsTheBlasThatLibtorchLoaded) {
  auto a = torch::randn({64, 64});
  auto b = torch::mm(a, a);  // makes sure the BLAS is mapped
  ASSERT_EQ(b.size(0), 64);
  BlasInfo info = detect_blas();
  EXPECT_FALSE(info.library.empty()) << "libtorch should have a BLAS mapped";
}

TEST(Platform, PicksTheWidestOpenBlasKernelTheFlagsAllow) {
  EXPECT_EQ(openblas_coretype_for_flags(" fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_bf16"), "SkylakeX");
  EXPECT_EQ(openblas_coretype_for_flags("fpu sse2 avx avx2 fma"), "Haswell");
  EXPECT_EQ(openblas_coretype_for_flags("fpu sse2 avx avx512f"), "");  // avx512f alone: no avx2/fma either
  EXPECT_EQ(openblas_coretype_for_flags("fpu sse2 avx"), "");
  EXPECT_EQ(openblas_coretype_for_flags(""), "");
}

}  // namespace hybridflow
