// An elastic trainer rank for the many-node test, run as its own process: it
// joins the job's epoch (Rejoin), takes the box of a global float32 vector its
// rank owns in that epoch, restores the epoch's resume step (the newest one
// committed at tier peer when the epoch closed; resharded, from local copies
// and from peers) or starts from the initial state, then trains (an
// elementwise, deterministic update) and saves every iteration. When its daemon
// reports a lost node it leaves the loop and rejoins, waiting for the members
// of its epoch that were on other nodes (participant ids are "<node>-r<i>"); on
// SIGUSR1 (the job grows) it rejoins and waits for the full world of 8 — the
// process is never restarted. It trains up to the iteration written in
// LIMIT_FILE (read every iteration: the test paces the job), then waits;
// SIGUSR2 makes it write its box to OUT and exit 0 once it is at the limit.
// Each epoch it joins is appended to OUT.status as "epoch E rank R world W
// restored S iteration I".
//
// Save ids are epoch * 1000000 + iteration: unique per epoch, so a new epoch
// never saves a step id an older epoch committed (a committed step is never
// replaced), and the same on every rank.
//
//   elastic_trainer SOCKET JOB PARTICIPANT GLOBAL LIMIT_FILE FIRST_MIN OUT
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/checkpointer.h"
#include "client/elastic.h"
#include "tests/client/elastic_model.h"

namespace {

std::atomic<bool> grow{false}, finish{false};

void OnSignal(int sig) {
  if (sig == SIGUSR1) grow = true;
  if (sig == SIGUSR2) finish = true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ckpt;
  if (argc != 8) {
    std::fprintf(stderr,
                 "usage: %s SOCKET JOB PARTICIPANT GLOBAL LIMIT_FILE "
                 "FIRST_MIN OUT\n",
                 argv[0]);
    return 2;
  }
  const std::string socket = argv[1], job = argv[2], participant = argv[3];
  const int64_t global = std::atoll(argv[4]);
  const std::string limit_file = argv[5];
  auto limit = [&limit_file]() -> uint64_t {
    std::ifstream in(limit_file);
    uint64_t n = 0;
    in >> n;
    return n;
  };
  uint32_t min_ranks = static_cast<uint32_t>(std::atoi(argv[6]));
  const std::string out = argv[7];
  ::signal(SIGUSR1, OnSignal);
  ::signal(SIGUSR2, OnSignal);
  std::ofstream status(out + ".status", std::ios::app);
  auto fail = [&](const std::string& what, const absl::Status& s) {
    std::fprintf(stderr, "%s: %s: %s\n", participant.c_str(), what.c_str(),
                 s.ToString().c_str());
    return 3;
  };
  while (true) {
    auto epoch = client::Rejoin({.job = job,
                                 .socket_path = socket,
                                 .participant = participant,
                                 .min_ranks = min_ranks,
                                 .max_ranks = min_ranks,
                                 .settle = absl::Seconds(2),
                                 .timeout = absl::Minutes(2)});
    if (!epoch.ok()) return fail("rejoin", epoch.status());
    grow = false;
    const auto [offset, length] =
        testing::ElasticBox(global, epoch->rank, epoch->world_size);
    std::vector<float> w(length);
    std::string iteration_bytes;
    auto ckpt = client::Checkpointer::Connect(
        {job, epoch->rank, epoch->world_size, socket});
    if (!ckpt.ok()) return fail("connect", ckpt.status());
    absl::Status s = (*ckpt)->RegisterTensor(
        "w", proto::DTYPE_FLOAT32, w.data(), {global}, {offset}, {length});
    if (s.ok()) s = (*ckpt)->RegisterBytes("iteration", &iteration_bytes);
    if (!s.ok()) return fail("register", s);
    std::atomic<bool> lost{false};
    absl::Mutex lost_mu;
    std::vector<std::string> lost_nodes;
    s = (*ckpt)->WatchFailures([&](const std::vector<std::string>& nodes) {
      {
        absl::MutexLock lock(&lost_mu);
        lost_nodes.insert(lost_nodes.end(), nodes.begin(), nodes.end());
      }
      lost = true;
    });
    if (!s.ok()) return fail("watch", s);
    uint64_t iteration = 0;
    std::shared_ptr<client::SaveHandle> last_save;
    // Every member restores the step the epoch resumes from (the newest one
    // committed at the peer tier when it closed).
    const absl::optional<uint64_t> resumed = epoch->resume_step;
    if (resumed.has_value()) {
      if (absl::Status r = (*ckpt)->Restore(*resumed); !r.ok()) {
        return fail(absl::StrCat("restore of step ", *resumed), r);
      }
      if (!absl::SimpleAtoi(iteration_bytes, &iteration)) {
        return fail("restore", absl::DataLossError("bad iteration item"));
      }
    } else {
      for (int64_t i = 0; i < length; ++i)
        w[i] = testing::ElasticInitial(offset + i);
    }
    status << "epoch " << epoch->epoch << " rank " << epoch->rank << " world "
           << epoch->world_size << " restored " << resumed.value_or(0)
           << " iteration " << iteration << std::endl;
    while (!lost && !grow) {
      if (iteration >= limit()) {
        if (finish) {
          std::ofstream f(out, std::ios::binary | std::ios::trunc);
          f << offset << " " << length << "\n";
          f.write(reinterpret_cast<const char*>(w.data()),
                  static_cast<std::streamsize>(w.size() * sizeof(float)));
          return f.good() ? 0 : 3;
        }
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      ++iteration;
      for (int64_t i = 0; i < length; ++i)
        w[i] = testing::ElasticStep(w[i], iteration, offset + i);
      iteration_bytes = std::to_string(iteration);
      auto save = (*ckpt)->SaveAsync(epoch->epoch * 1000000 + iteration);
      if (save.ok()) {
        (void)(*save)->WaitStaged();
        last_save = *std::move(save);
      }
      absl::SleepFor(absl::Milliseconds(15));
    }
    // Growing: the job waits for its full size, replacements included. The
    // steps it saved are still being replicated: each rank waits (a while)
    // until its last one is committed at the peer tier, so that the newest
    // peer commit does not move while the grown job's ranks restore it (they
    // would restore different steps, and retention drops the older one).
    if (grow) {
      min_ranks = 8;
      if (last_save != nullptr) {
        (void)last_save->WaitCommitted(proto::TIER_PEER, absl::Seconds(5));
      }
    }
    last_save.reset();
    // A failure: the members of this epoch that were not on a lost node
    // (participant ids are "<node>-r<i>").
    if (lost) {
      absl::MutexLock lock(&lost_mu);
      min_ranks = 0;
      for (const std::string& m : epoch->members) {
        bool gone = false;
        for (const std::string& n : lost_nodes) {
          gone = gone || m.rfind(n + "-", 0) == 0;
        }
        if (!gone) ++min_ranks;
      }
    }
    (*ckpt).reset();  // stops watching before `lost_nodes` goes
  }
}
