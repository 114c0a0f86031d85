#include "daemon/peer/replication_backlog.h"

namespace ckpt::daemon {

BacklogChoice ChooseFromBacklog(const std::set<uint64_t>& waiting,
                                const std::set<uint64_t>& voted,
                                size_t threshold) {
  BacklogChoice choice;
  if (waiting.size() <= threshold || waiting.empty()) return choice;
  choice.thinned = true;
  choice.push = *waiting.rbegin();
  for (auto it = voted.rbegin(); it != voted.rend(); ++it) {
    if (waiting.count(*it) > 0) {
      choice.push = *it;
      break;
    }
  }
  for (uint64_t step : waiting) {
    if (step < choice.push) choice.dropped.insert(step);
    if (step > choice.push) choice.later.insert(step);
  }
  return choice;
}

}  // namespace ckpt::daemon
