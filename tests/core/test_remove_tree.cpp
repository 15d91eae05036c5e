#include "hybridflow/core/remove_tree.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "support/temp_dir.h"

namespace hybridflow {
namespace {

namespace fs = std::filesystem;

void touch(const std::string& path) { std::ofstream(path) << "x"; }

TEST(RemoveTree, RemovesANestedTreeDepthFirst) {
  testing::TempDir tmp;
  const std::string root = tmp.file("run");
  fs::create_directories(root + "/checkpoints/global_step_2/actor");
  fs::create_directories(root + "/empty");
  touch(root + "/metrics.jsonl");
  touch(root + "/checkpoints/global_step_2/actor/model.safetensors");
  EXPECT_EQ(remove_tree(root), "");
  EXPECT_FALSE(fs::exists(root));
  EXPECT_TRUE(fs::exists(tmp.path())) << "only the named tree goes";
}

TEST(RemoveTree, RemovesALinkNotWhatItPointsTo) {
  testing::TempDir tmp;
  const std::string kept = tmp.file("kept");
  fs::create_directories(kept);
  touch(kept + "/data.jsonl");
  const std::string root = tmp.file("run");
  fs::create_directories(root);
  fs::create_directory_symlink(kept, root + "/link_to_kept");
  ASSERT_EQ(remove_tree(root), "");
  EXPECT_FALSE(fs::exists(root));
  EXPECT_TRUE(fs::exists(kept + "/data.jsonl")) << "the link's target must survive";

  // A link given as the path itself is removed as a link too.
  fs::create_directory_symlink(kept, tmp.file("alias"));
  ASSERT_EQ(remove_tree(tmp.file("alias")), "");
  EXPECT_FALSE(fs::is_symlink(tmp.file("alias")));
  EXPECT_TRUE(fs::exists(kept + "/data.jsonl"));
}

TEST(RemoveTree, ASingleFileAndAMissingPath) {
  testing::TempDir tmp;
  touch(tmp.file("one"));
  EXPECT_EQ(remove_tree(tmp.file("one")), "");
  EXPECT_FALSE(fs::exists(tmp.file("one")));
  EXPECT_EQ(remove_tree(tmp.file("never_made")), "") << "nothing to remove is not an error";
}

TEST(RemoveTree, AFailureNamesTheEntry) {
  // procfs refuses to unlink its files, to root as well: a failure that every user can provoke harmlessly.
  const std::string failure = remove_tree("/proc/self/comm");
  EXPECT_NE(failure.find("/proc/self/comm: "), std::string::npos) << failure;
  EXPECT_TRUE(fs::exists("/proc/self/comm"));
}

}  // namespace
}  // namespace hybridflow
