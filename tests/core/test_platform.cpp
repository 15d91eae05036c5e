#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/core/error.h"
#include "hybridflow/core/platform.h"
#include "support/error_of.h"

namespace hybridflow {

TEST(Platform, InitThreadsSetsAtenThreads) {
  init_threads(1);
  EXPECT_EQ(at::get_num_threads(), 1);
  init_threads(2);
  EXPECT_EQ(at::get_num_threads(), 2);
}

TEST(Platform, DetectsTheBlasLibtorchWasBuiltWith) {
  BlasInfo info = detect_blas();
  EXPECT_FALSE(info.library.empty()) << "libtorch's build configuration should name its BLAS";
  EXPECT_TRUE(info.fast) << info.library;  // the PyPI wheel the project builds against has MKL
}

TEST(Platform, ReadsBf16SupportFromCpuFlags) {
  auto amx = cpu_bf16_support_from_flags(" fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8");
  EXPECT_TRUE(amx.amx_bf16);
  EXPECT_TRUE(amx.avx512_bf16);
  EXPECT_EQ(amx.matmul_path(), "AMX (oneDNN)");
  auto avx = cpu_bf16_support_from_flags("fpu avx512f avx512_bf16");
  EXPECT_FALSE(avx.amx_bf16);
  EXPECT_EQ(avx.matmul_path(), "AVX512-BF16 (oneDNN)");
  auto none = cpu_bf16_support_from_flags("fpu sse2 avx avx2 fma amx_bf16");  // amx_bf16 without tiles
  EXPECT_FALSE(none.amx_bf16);
  EXPECT_NE(none.matmul_path().find("emulated"), std::string::npos);
}

TEST(Platform, RuntimeInfoNamesVersionDevicesAndBackends) {
  RuntimeInfo info = runtime_info();
  EXPECT_EQ(info.torch_version.substr(0, 2), "2.");
  EXPECT_FALSE(info.cpu_capability.empty());
  ASSERT_FALSE(info.collective_backends.empty());
  EXPECT_NE(info.collective_backends[0].find("gloo"), std::string::npos);
  const std::string text = format_runtime_info(info);
  for (const char* key : {"libtorch", "devices", "cpu isa", "blas", "dtypes", "collectives"})
    EXPECT_NE(text.find(key), std::string::npos) << key << " missing from:\n" << text;
}

TEST(Platform, DeviceKeysResolveToCpuOrCudaAndNameTheKeyWhenWrong) {
  const bool gpu = torch::cuda::is_available();
  EXPECT_EQ(resolve_device_name("auto", "trainer.device"), gpu ? "cuda" : "cpu");
  EXPECT_EQ(resolve_device_name("cpu", "trainer.device"), "cpu");
  try {
    resolve_device_name("tpu", "sft.trainer.device");
    ADD_FAILURE() << "tpu must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sft.trainer.device: expected cpu | cuda | auto, got 'tpu'"), std::string::npos)
        << e.what();
  }
  if (gpu) {
    EXPECT_EQ(resolve_device_name("cuda", "trainer.device"), "cuda");
  } else {
    try {
      resolve_device_name("cuda", "trainer.device");
      ADD_FAILURE() << "cuda without a GPU must be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("trainer.device=cuda, but"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("or set trainer.device=cpu"), std::string::npos) << e.what();
    }
  }
}

// Seen on a one-GPU machine: a split or standalone placement gave two processes the same GPU, and NCCL failed
// mid-run ("Duplicate GPU detected"). The count of processes per host against the GPUs decides up front.
TEST(Platform, MoreProcessesThanGpusFallBackToTheCpuOrAreRefusedNamingThePools) {
  const std::string pools = "pool 'train' (1 process, actor_rollout_ref.num_processes): actor";
  EXPECT_EQ(device_for_processes("cuda", "auto", 2, 2, "trainer.device", pools), "cuda");
  EXPECT_EQ(device_for_processes("cuda", "cuda", 1, 1, "trainer.device", pools), "cuda");
  EXPECT_EQ(device_for_processes("cpu", "cpu", 8, 0, "trainer.device", pools), "cpu");
  EXPECT_EQ(device_for_processes("cpu", "auto", 8, 0, "trainer.device", pools), "cpu");
  EXPECT_EQ(device_for_processes("cuda", "auto", 2, 1, "trainer.device", pools), "cpu") << "auto falls back";
  const std::string e = testing::error_of([&] { device_for_processes("cuda", "cuda", 2, 1, "trainer.device", pools); });
  for (const char* part : {"trainer.device=cuda", "2 worker processes per host", "actor_rollout_ref.num_processes",
                           "1 CUDA device(s)", "trainer.device=cpu"})
    EXPECT_NE(e.find(part), std::string::npos) << part << " missing from: " << e;
}

}  // namespace hybridflow
