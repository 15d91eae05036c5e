#include "hybridflow/core/heap_reuse.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Minor faults taken by allocating, touching and freeing a block of `bytes` after one of the same size was
// freed.
// Writes through a volatile pointer, one byte a page, so the compiler keeps the block and its stores.
void touch_block(void* block, size_t bytes, char value) {
  volatile char* bytes_of = static_cast<volatile char*>(block);
  for (size_t i = 0; i < bytes; i += 4096) bytes_of[i] = value;
}

long faults_of_second_block(size_t bytes) {
  void* first = std::malloc(bytes);
  touch_block(first, bytes, 1);
  std::free(first);
  const long before = minor_faults();
  void* second = std::malloc(bytes);
  touch_block(second, bytes, 2);
  const long faults = minor_faults() - before;
  std::free(second);
  return faults;
}

TEST(HeapReuse, EnvironmentValues) {
  EXPECT_TRUE(heap_reuse_requested(nullptr));
  EXPECT_TRUE(heap_reuse_requested(""));
  EXPECT_TRUE(heap_reuse_requested("0"));
  EXPECT_FALSE(heap_reuse_requested("1"));
  try {
    heap_reuse_requested("yes");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(kReturnFreedMemoryEnv), std::string::npos) << e.what();
  }
}

// Before: glibc maps a 96 MB block afresh and every page faults again. After: the freed block is reused.
TEST(HeapReuse, FreedLargeBlockIsReusedWithoutPageFaults) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "heap reuse is glibc's mallopt";
#endif
  constexpr size_t kBytes = size_t{96} << 20;
  const long pages = static_cast<long>(kBytes / 4096);
  EXPECT_GT(faults_of_second_block(kBytes), pages / 2);
  unsetenv(kReturnFreedMemoryEnv);
  ASSERT_TRUE(keep_freed_heap_for_reuse());
  faults_of_second_block(kBytes);  // the heap grows to hold the block once
  EXPECT_LT(faults_of_second_block(kBytes), pages / 100);
}

}  // namespace
}  // namespace hybridflow
