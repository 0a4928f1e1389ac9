#include "tests/worker/worker_test_util.h"

#include <sstream>
#include <thread>

namespace muonshard::worker::testing {

std::vector<RankRun> RunRanksAsThreads(const WorkerOptions& o, int world) {
  std::vector<std::ostringstream> logs(world);
  std::vector<RankRun> runs(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      WorkerOptions mine = o;
      mine.rank = r;
      mine.log = &logs[r];
      runs[r].status = RunWorker(mine);
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < world; ++r) runs[r].log = logs[r].str();
  return runs;
}

}  // namespace muonshard::worker::testing
