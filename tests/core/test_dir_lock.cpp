#include "hybridflow/core/dir_lock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>

#include "hybridflow/core/error.h"
#include "support/temp_dir.h"

namespace hybridflow {
namespace {

TEST(DirectoryLock, SecondHolderFailsNamingTheFirstPid) {
  testing::TempDir tmp;
  const std::string dir = tmp.file("run");
  auto first = std::make_unique<DirectoryLock>(dir);
  try {
    DirectoryLock second(dir);
    ADD_FAILURE() << "a second lock on " << dir << " must fail";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("in use by another hybridflow run (pid " + std::to_string(::getpid())), std::string::npos)
        << message;
    EXPECT_NE(message.find(dir), std::string::npos) << message;
  }
  first.reset();  // released: the next run takes it
  EXPECT_NO_THROW(DirectoryLock again(dir));
}

}  // namespace
}  // namespace hybridflow
