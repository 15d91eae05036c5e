#include <CLI/CLI.hpp>

#include "hybridflow/core/platform.h"

int main(int argc, char** argv) {
  CLI::App app{"hybridflow: RL post-training of language models"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
