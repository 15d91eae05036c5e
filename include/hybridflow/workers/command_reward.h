// Scores a batch by running an external program once per batch (see reward_function.h for the
// line protocol). The program gets the batch on stdin and must print one score per line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/workers/reward_function.h"

namespace hybridflow {

class CommandReward : public RewardFunction {
 public:
  // argv[0] is looked up on PATH; no shell is involved, so arguments are never re-parsed. The program
  // gets timeout_s of wall-clock time per batch and may write at most max_output_bytes to stdout (and,
  // separately, to stderr); past either it is killed with its process group and score() throws.
  CommandReward(std::vector<std::string> argv, double timeout_s,
                int64_t max_output_bytes = kDefaultRewardMaxOutputBytes);
  // A user-written command line, run as /bin/sh -c <command_line>.
  static CommandReward shell(const std::string& command_line, double timeout_s,
                             int64_t max_output_bytes = kDefaultRewardMaxOutputBytes);

  std::vector<double> score(const std::vector<RewardRequest>& batch) override;
  std::string describe() const override;

 private:
  std::vector<std::string> argv_;
  double timeout_s_;
  int64_t max_output_bytes_;
};

// Parses one stdout line of a reward program: a JSON number or an object with a numeric "score".
// `where` names the source in the error ("command 'x' stdout line 3").
double parse_score_line(const std::string& line, const std::string& where);

}  // namespace hybridflow
