// Stragglers end to end on a real ckptd: a rank slowed before each save (a
// slow GPU, a slow host) is flagged with its node within the window's
// steps, in the metrics and `ckpt status`; a job whose ranks save together
// flags nobody.
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/daemon_process.h"
#include "tests/client/peer_ranks.h"
#include "tests/tools/run_cli.h"

namespace ckpt::client {
namespace {

constexpr int kWorld = 4;
constexpr int kSteps = 7;  // more than the window (5)

// Runs `job` for kSteps steps; rank `slow` (if any) sleeps `delay` before
// each of its saves, the others save at once; every step is committed
// before the next.
void Train(const testing::DaemonProcess& d, const std::string& job, int slow,
           absl::Duration delay) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.push_back(
        std::make_unique<Rank>(d.socket(), job, r, kWorld, 1 << 16));
    ASSERT_TRUE(ranks.back()->ckpt);
  }
  for (uint64_t step = 1; step <= kSteps; ++step) {
    std::vector<std::thread> threads;
    std::vector<absl::Status> done(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        if (r == slow) absl::SleepFor(delay);
        ranks[r]->Fill(step);
        auto save = ranks[r]->ckpt->SaveAsync(step);
        done[r] = save.ok() ? (*save)->WaitCommitted(proto::TIER_LOCAL_DISK,
                                                     absl::Seconds(60))
                            : save.status();
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : done) ASSERT_TRUE(s.ok()) << s;
  }
}

TEST(StragglerTest, ASlowedRankIsFlaggedAndAnEvenJobFlagsNobody) {
  testing::DaemonProcess d({"--node-id", "node-s"});
  ASSERT_TRUE(d.Start()) << d.log();
  Train(d, "slow", /*slow=*/2, absl::Milliseconds(400));
  Train(d, "even", /*slow=*/-1, absl::ZeroDuration());
  // The flag follows the last commit: ask until it shows (or 30 s).
  nlohmann::json jobs;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (;;) {
    Result status = RunCli("--data-dir " + d.data_dir() + " --socket " +
                           d.socket() + " status --json");
    ASSERT_EQ(status.exit_code, 0) << status.out;
    nlohmann::json j = nlohmann::json::parse(status.out, nullptr, false);
    for (const nlohmann::json& job : j["jobs"]) {
      jobs[job["job"].get<std::string>()] = job["figures"];
    }
    if (jobs["slow"].contains("stragglers") || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(jobs["slow"].contains("stragglers")) << jobs.dump(2) << d.log();
  ASSERT_EQ(jobs["slow"]["stragglers"].size(), 1u) << jobs.dump(2);
  EXPECT_EQ(jobs["slow"]["stragglers"][0]["rank"], 2);
  EXPECT_EQ(jobs["slow"]["stragglers"][0]["node"], "node-s");
  EXPECT_GT(jobs["slow"]["stragglers"][0]["mean_lag_s"].get<double>(), 0.05);
  EXPECT_FALSE(jobs["even"].contains("stragglers")) << jobs.dump(2);
  Result human = RunCli("--data-dir " + d.data_dir() + " --socket " +
                        d.socket() + " status");
  EXPECT_THAT(human.out,
              ::testing::ContainsRegex("stragglers rank 2 \\(node node-s\\) "
                                       "[0-9.]+ (ms|s) behind"));
}

}  // namespace
}  // namespace ckpt::client
