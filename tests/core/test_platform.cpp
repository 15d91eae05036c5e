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

}  // namespace hybridflow
