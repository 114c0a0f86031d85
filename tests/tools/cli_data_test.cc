// `ckpt ls / inspect / verify / export` on real data: a real ckptd, two ranks
// saving sharded tensors through libckpt, and the command reading ckptd's data
// directory while the daemon runs. The safetensors file is checked by a reader
// written here from the format's specification, independent of the exporter.
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/checkpointer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "tests/client/daemon_process.h"
#include "tests/test_util.h"
#include "tests/tools/run_cli.h"
#include "tests/tools/safetensors_file.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

constexpr int kRows = 6, kCols = 5, kBias = 7;

// The global state of step `step` (what an unsharded trainer would hold).
struct GlobalState {
  std::vector<float> w;       // [kRows, kCols], rows split 3 + 3
  std::vector<int64_t> bias;  // [kBias], split 4 + 3
  std::string rng[2];         // a byte item per rank
};

GlobalState StateOf(uint64_t seed, uint64_t step) {
  std::mt19937_64 rng(seed * 1000 + step);
  GlobalState s;
  for (int i = 0; i < kRows * kCols; ++i)
    s.w.push_back(std::uniform_real_distribution<float>(-1, 1)(rng));
  for (int i = 0; i < kBias; ++i) s.bias.push_back(static_cast<int64_t>(rng()));
  for (auto& r : s.rng) r = std::to_string(rng()) + "/" + std::to_string(step);
  return s;
}

class CliDataTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    seed_ = testing::TestSeed();
    daemon_ =
        new testing::DaemonProcess({"--keep-disk", "5", "--keep-memory", "2"});
    ASSERT_TRUE(daemon_->Start()) << daemon_->log();
    std::unique_ptr<client::Checkpointer> ranks[2];
    std::vector<float> w[2];
    std::vector<int64_t> bias[2];
    std::string rng[2];
    const int64_t bias_off[2] = {0, 4}, bias_len[2] = {4, 3};
    for (uint32_t r = 0; r < 2; ++r) {
      auto c = client::Checkpointer::Connect({"job", r, 2, daemon_->socket()});
      ASSERT_TRUE(c.ok()) << c.status();
      ranks[r] = *std::move(c);
      w[r].resize(3 * kCols);
      bias[r].resize(bias_len[r]);
      ASSERT_TRUE(ranks[r]
                      ->RegisterTensor("model/w", proto::DTYPE_FLOAT32,
                                       w[r].data(), {kRows, kCols}, {3 * r, 0},
                                       {3, kCols})
                      .ok());
      ASSERT_TRUE(ranks[r]
                      ->RegisterTensor("model/bias", proto::DTYPE_INT64,
                                       bias[r].data(), {kBias}, {bias_off[r]},
                                       {bias_len[r]})
                      .ok());
      ASSERT_TRUE(ranks[r]->RegisterBytes("rng", &rng[r]).ok());
    }
    for (uint64_t step = 1; step <= 3; ++step) {
      GlobalState s = StateOf(seed_, step);
      std::vector<std::shared_ptr<client::SaveHandle>> saves;
      for (uint32_t r = 0; r < 2; ++r) {
        std::copy_n(s.w.begin() + 3 * kCols * r, 3 * kCols, w[r].begin());
        std::copy_n(s.bias.begin() + bias_off[r], bias_len[r], bias[r].begin());
        rng[r] = s.rng[r];
        auto save = ranks[r]->SaveAsync(step);
        ASSERT_TRUE(save.ok()) << save.status();
        saves.push_back(*save);
      }
      for (auto& save : saves) {
        ASSERT_TRUE(save->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
      }
    }
  }
  static void TearDownTestSuite() {
    delete daemon_;
    daemon_ = nullptr;
  }

  std::string Cli(const std::string& args) {
    return "--data-dir " + daemon_->data_dir() + " " + args;
  }
  nlohmann::json Json(const std::string& args) {
    Result r = RunCli(Cli(args));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  }
  // Flips one byte of a file, or flips it back.
  static void Flip(const std::string& path, uint64_t at) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x5a));
  }

  static uint64_t seed_;
  static testing::DaemonProcess* daemon_;
  testing::TempDir dir_;
};

uint64_t CliDataTest::seed_ = 0;
testing::DaemonProcess* CliDataTest::daemon_ = nullptr;

TEST_F(CliDataTest, LsShowsJobsAndStepsPerTier) {
  Result jobs = RunCli(Cli("ls"));
  ASSERT_EQ(jobs.exit_code, 0) << jobs.out;
  EXPECT_THAT(jobs.out, HasSubstr("job"));
  EXPECT_THAT(jobs.out, HasSubstr("disk 3"));
  nlohmann::json j = Json("ls job --json");
  ASSERT_EQ(j["steps"].size(), 3u) << j.dump();
  for (const nlohmann::json& s : j["steps"]) {
    EXPECT_EQ(s["world_size"], 2);
    EXPECT_EQ(s["ranks_on_disk"], 2);
    EXPECT_THAT(s["committed"].dump(), HasSubstr("local_disk"));
    EXPECT_GT(s["raw_bytes"].get<uint64_t>(), 0u);
  }
  EXPECT_EQ(j["steps"][2]["ranks_in_memory"], 2) << "the newest step is kept "
                                                    "in memory";
  Result human = RunCli(Cli("ls job"));
  EXPECT_EQ(human.exit_code, 0);
  EXPECT_THAT(human.out, HasSubstr("committed"));
}

TEST_F(CliDataTest, InspectShowsTensorsAndTheirSharding) {
  nlohmann::json j = Json("inspect job 3 --json");
  EXPECT_EQ(j["world_size"], 2);
  ASSERT_EQ(j["ranks"].size(), 2u);
  const nlohmann::json& items = j["ranks"][1]["items"];
  bool found = false;
  for (const nlohmann::json& item : items) {
    if (item["name"] != "model/w") continue;
    found = true;
    EXPECT_EQ(item["dtype"], "float32");
    EXPECT_EQ(item["global_shape"].dump(), "[6,5]");
    EXPECT_EQ(item["box_offset"].dump(), "[3,0]");
    EXPECT_GE(item["chunks"].get<int>(), 1);
  }
  EXPECT_TRUE(found) << j.dump();
  Result human = RunCli(Cli("inspect job 3"));
  EXPECT_EQ(human.exit_code, 0) << human.out;
  EXPECT_THAT(human.out, HasSubstr("r1:[3,0]+[3,5]"));
}

TEST_F(CliDataTest, VerifyChecksDiskAndMemoryTiersAndNamesWhatIsBad) {
  Result ok = RunCli(Cli("verify job"));
  ASSERT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_THAT(ok.out, HasSubstr("OK"));
  // The ckptd made its own cluster key; verify found it in the data
  // directory and checked every seal with it.
  EXPECT_THAT(ok.out, HasSubstr("seals checked with cluster key"));
  nlohmann::json j = Json("inspect job 3 --json");
  const std::string file = j["ranks"][1]["shard_path"];
  const std::string slot = j["ranks"][0]["slot_path"];

  Flip(file, 64 + 3);  // inside the first chunk's stored bytes
  Result disk = RunCli(Cli("verify job 3"));
  Flip(file, 64 + 3);
  EXPECT_EQ(disk.exit_code, 1) << disk.out;
  EXPECT_THAT(disk.out, HasSubstr("BAD local_disk step 3 rank 1"));
  EXPECT_THAT(disk.out, HasSubstr(file));

  Flip(slot, 5);  // the first item's bytes in the staging slot
  Result memory = RunCli(Cli("verify job 3 --json"));
  Flip(slot, 5);
  EXPECT_EQ(memory.exit_code, 1) << memory.out;
  nlohmann::json mj = nlohmann::json::parse(memory.out);
  EXPECT_FALSE(mj["ok"].get<bool>());
  EXPECT_TRUE(mj["seals_checked"].get<bool>());
  int bad = 0;
  for (const nlohmann::json& c : mj["copies"]) {
    if (c["problems"].empty()) continue;
    ++bad;
    EXPECT_EQ(c["tier"], "memory");
    EXPECT_EQ(c["rank"], 0);
    EXPECT_THAT(c["problems"][0].get<std::string>(),
                HasSubstr("raw checksum mismatch"));
  }
  EXPECT_EQ(bad, 1);
  EXPECT_EQ(RunCli(Cli("verify job")).exit_code, 0) << "restored";
}

TEST_F(CliDataTest, ExportWritesFullTensorsAnIndependentReaderAccepts) {
  const std::string out = dir_.File("step2.safetensors");
  Result r = RunCli(Cli("export job 2 --format safetensors " + out));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  testing::SafetensorsFile f = testing::SafetensorsFile::Read(out);
  const GlobalState want = StateOf(seed_, 2);

  EXPECT_EQ(f.header["model/w"]["dtype"], "F32");
  EXPECT_EQ(f.header["model/w"]["shape"].dump(), "[6,5]");
  std::string w = f.Bytes("model/w");
  ASSERT_EQ(w.size(), want.w.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(w.data(), want.w.data(), w.size()), 0);

  EXPECT_EQ(f.header["model/bias"]["dtype"], "I64");
  EXPECT_EQ(f.header["model/bias"]["shape"].dump(), "[7]");
  std::string bias = f.Bytes("model/bias");
  ASSERT_EQ(bias.size(), want.bias.size() * sizeof(int64_t));
  EXPECT_EQ(std::memcmp(bias.data(), want.bias.data(), bias.size()), 0);

  for (int rank = 0; rank < 2; ++rank) {
    const std::string name = "rng@rank" + std::to_string(rank);
    EXPECT_EQ(f.header[name]["dtype"], "U8");
    EXPECT_EQ(f.Bytes(name), want.rng[rank]);
  }
  EXPECT_EQ(f.header["__metadata__"]["ckpt.step"], "2");
}

TEST_F(CliDataTest, StatusReportsTheDaemonTiersAndLastCommits) {
  nlohmann::json j = Json("status --json --socket " + daemon_->socket());
  EXPECT_TRUE(j["daemon_accepting"].get<bool>()) << j.dump();
  EXPECT_GT(j["memory_tier_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(j["disk_tier_bytes"].get<uint64_t>(), 0u);
  ASSERT_EQ(j["jobs"].size(), 1u);
  EXPECT_EQ(j["jobs"][0]["latest"]["local_disk"]["step"], 3);
  EXPECT_EQ(j["jobs"][0]["latest"]["memory"]["step"], 3);
  Result down = RunCli(Cli("status --socket " + dir_.File("no.sock")));
  EXPECT_EQ(down.exit_code, 0) << down.out;
  EXPECT_THAT(down.out, HasSubstr("NOT RUNNING"));
  EXPECT_THAT(down.out, HasSubstr("memory step 3"));
}

TEST_F(CliDataTest, RestorePlanNamesTheSourceOfEveryPiece) {
  nlohmann::json j = Json("restore-plan job 3 --world 3 --json");
  EXPECT_TRUE(j["complete"].get<bool>()) << j.dump();
  ASSERT_EQ(j["ranks"].size(), 3u);
  // New rank 1 of 3 holds rows [2, 4) of model/w: row 2 from saved rank 0,
  // row 3 from saved rank 1, both still in memory (step 3 is the newest).
  const nlohmann::json& rank1 = j["ranks"][1]["tensors"];
  bool found = false;
  for (const nlohmann::json& t : rank1) {
    if (t["name"] != "model/w") continue;
    found = true;
    EXPECT_EQ(t["box_offset"].dump(), "[2,0]");
    EXPECT_EQ(t["box_length"].dump(), "[2,5]");
    ASSERT_EQ(t["pieces"].size(), 2u) << t.dump();
    EXPECT_EQ(t["pieces"][0]["saved_rank"], 0);
    EXPECT_EQ(t["pieces"][0]["elements"], 5);
    EXPECT_EQ(t["pieces"][0]["source"], "memory");
    EXPECT_EQ(t["pieces"][1]["saved_rank"], 1);
    EXPECT_EQ(t["missing_elements"], 0);
  }
  EXPECT_TRUE(found);
  // Step 1 left the memory tier (keep-memory 2): it comes from disk.
  // (Garbage collection runs after the commit is announced: allow it time.)
  std::string source;
  for (int i = 0; i < 250 && source != "local_disk"; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    nlohmann::json old = Json("restore-plan job 1 --world 1 --json");
    source = old["ranks"][0]["tensors"][0]["pieces"][0]["source"];
  }
  EXPECT_EQ(source, "local_disk");
  Result human = RunCli(Cli("restore-plan job 3 --world 3"));
  EXPECT_EQ(human.exit_code, 0) << human.out;
  EXPECT_THAT(human.out, HasSubstr("r0 memory"));
}

// ckpt finds ckptd: with no --data-dir, every subcommand asks the daemon at
// $CKPT_SOCKET (or --socket) where its data is. Without a daemon there, the
// default data directory is used (here: one that does not exist).
TEST_F(CliDataTest, EverySubcommandFindsTheDaemonThroughItsSocket) {
  auto run = [&](const std::string& args) {
    return RunProgram("env -u CKPT_DATA_DIR CKPT_SOCKET=" + daemon_->socket() +
                          " " + CKPT_CLI,
                      args);
  };
  for (const std::string& args :
       {std::string("ls job --json"), std::string("inspect job 3 --json"),
        std::string("verify job 3 --json"), std::string("status --json"),
        std::string("restore-plan job 3 --world 1 --json"),
        std::string("gc job --keep 10 --dry-run --json"),
        "export job 3 --format safetensors " + dir_.File("found.st")}) {
    Result r = run(args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.out;
  }
  EXPECT_EQ(run("ls job --json").out, RunCli(Cli("ls job --json")).out);
  // --socket too, before or after the subcommand.
  Result before = RunProgram(std::string("env -u CKPT_DATA_DIR ") + CKPT_CLI,
                             "--socket " + daemon_->socket() + " ls job");
  EXPECT_EQ(before.exit_code, 0) << before.out;
  Result after = RunProgram(std::string("env -u CKPT_DATA_DIR ") + CKPT_CLI,
                            "ls job --socket " + daemon_->socket());
  EXPECT_EQ(after.exit_code, 0) << after.out;
  // No daemon at the socket: the default data directory, offline.
  Result none = RunProgram(std::string("env -u CKPT_DATA_DIR CKPT_SOCKET=") +
                               dir_.File("none.sock") + " HOME=" + dir_.path() +
                               " " + CKPT_CLI,
                           "ls job");
  EXPECT_NE(none.exit_code, 0) << none.out;
}

TEST_F(CliDataTest, MissingThingsGetClearErrorsAndExitCodes) {
  Result job = RunCli(Cli("ls nope"));
  EXPECT_EQ(job.exit_code, 3) << job.out;
  EXPECT_THAT(job.out, HasSubstr("no job \"nope\""));
  EXPECT_THAT(job.out, HasSubstr("jobs: job"));
  Result step = RunCli(Cli("inspect job 99"));
  EXPECT_EQ(step.exit_code, 3) << step.out;
  EXPECT_THAT(step.out, HasSubstr("job job has no step 99 (steps: 1, 2, 3)"));
  Result export_step =
      RunCli(Cli("export job 99 --format safetensors " + dir_.File("x")));
  EXPECT_EQ(export_step.exit_code, 3) << export_step.out;
  Result format = RunCli(Cli("export job 2 --format npz " + dir_.File("x")));
  EXPECT_EQ(format.exit_code, 2) << format.out;
  EXPECT_THAT(format.out, HasSubstr("unknown format \"npz\""));
  Result dir = RunCli("--data-dir " + dir_.File("none") + " ls");
  EXPECT_EQ(dir.exit_code, 3) << dir.out;
  EXPECT_THAT(dir.out, HasSubstr("no ckptd catalog in"));
  Result bad_step = RunCli(Cli("verify job two"));
  EXPECT_EQ(bad_step.exit_code, 2) << bad_step.out;
  EXPECT_THAT(bad_step.out, HasSubstr("step \"two\" is not a number"));
}

// `ckpt gc` goes through the daemon that owns the catalog, with its retention
// rules; --dry-run also works with no daemon running.
TEST(CliGcTest, GcDropsOldStepsThroughTheDaemonAndDryRunOnlyPlans) {
  testing::DaemonProcess daemon({"--keep-disk", "10", "--keep-memory", "1"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  std::vector<std::string> files;
  {
    auto c = client::Checkpointer::Connect({"gcjob", 0, 1, daemon.socket()});
    ASSERT_TRUE(c.ok()) << c.status();
    std::string state;
    ASSERT_TRUE((*c)->RegisterBytes("state", &state).ok());
    for (uint64_t step = 1; step <= 4; ++step) {
      state = std::string(10000, static_cast<char>('a' + step));
      auto save = (*c)->SaveAsync(step);
      ASSERT_TRUE(save.ok());
      ASSERT_TRUE((*save)->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
      auto shard = (*c)->DescribeShard(step);
      ASSERT_TRUE(shard.ok());
      files.push_back(shard->shard_path());
    }
  }
  const std::string base = "--data-dir " + daemon.data_dir() +
                           " gc gcjob --keep 2 --socket " + daemon.socket();
  Result plan = RunCli(base + " --dry-run --json");
  ASSERT_EQ(plan.exit_code, 0) << plan.out;
  nlohmann::json j = nlohmann::json::parse(plan.out);
  ASSERT_EQ(j["dropped"].size(), 2u) << j.dump();
  EXPECT_EQ(j["dropped"][0]["step"], 1);
  EXPECT_EQ(j["dropped"][1]["step"], 2);
  for (const std::string& f : files)
    EXPECT_TRUE(*io::DefaultFileSystem()->Exists(f))
        << "a dry run drops nothing";

  daemon.Stop();
  Result offline = RunCli(base + " --dry-run");
  EXPECT_EQ(offline.exit_code, 0) << offline.out;
  EXPECT_THAT(offline.out, HasSubstr("would drop 2 shard copies"));
  EXPECT_THAT(offline.out, HasSubstr("ckptd is not running"));
  Result refused = RunCli(base);
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_THAT(refused.out, HasSubstr("no ckptd accepts"));

  ASSERT_TRUE(daemon.Start()) << daemon.log();
  Result applied = RunCli(base);
  ASSERT_EQ(applied.exit_code, 0) << applied.out;
  EXPECT_THAT(applied.out, HasSubstr("dropped 2 shard copies"));
  for (size_t i = 0; i < files.size(); ++i) {
    EXPECT_EQ(*io::DefaultFileSystem()->Exists(files[i]), i >= 2) << files[i];
  }
  Result ls = RunCli("--data-dir " + daemon.data_dir() + " ls gcjob --json");
  ASSERT_EQ(ls.exit_code, 0) << ls.out;
  nlohmann::json steps = nlohmann::json::parse(ls.out)["steps"];
  ASSERT_EQ(steps.size(), 2u) << steps.dump();
  EXPECT_EQ(steps[0]["step"], 3);
  EXPECT_EQ(
      RunCli("--data-dir " + daemon.data_dir() + " verify gcjob").exit_code, 0);
  Result zero = RunCli("--data-dir " + daemon.data_dir() +
                       " gc gcjob --keep 0 --socket " + daemon.socket());
  EXPECT_EQ(zero.exit_code, 2) << zero.out;
}

// ckpt restore: the operator's rollback in place (newer steps archived, or
// discarded) and a fork into a new job; a trainer then resumes from the step
// and saves on; a damaged step is refused before anything changes.
TEST(CliRestoreTest, RollsBackInPlaceOrForksAndTheTrainerResumesThere) {
  testing::DaemonProcess daemon({"--keep-disk", "10", "--keep-memory", "1"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  auto state_of = [](uint64_t step) {
    return std::string(20000, static_cast<char>('a' + step));
  };
  auto trainer = [&](const std::string& job, std::string* state) {
    auto c = client::Checkpointer::Connect({job, 0, 1, daemon.socket()});
    EXPECT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE((*c)->RegisterBytes("state", state).ok());
    return *std::move(c);
  };
  std::vector<std::string> files;
  {
    std::string state;
    auto c = trainer("rb", &state);
    for (uint64_t step = 1; step <= 5; ++step) {
      state = state_of(step);
      auto save = c->SaveAsync(step);
      ASSERT_TRUE(save.ok());
      ASSERT_TRUE((*save)->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
      files.push_back(c->DescribeShard(step)->shard_path());
    }
  }
  const std::string cli = "--data-dir " + daemon.data_dir() +
                          " restore --socket " + daemon.socket() + " ";

  // A fork first: job rb-fork resumes from step 2; rb is untouched.
  Result fork = RunCli(cli + "rb 2 --into rb-fork");
  ASSERT_EQ(fork.exit_code, 0) << fork.out;
  EXPECT_THAT(fork.out, HasSubstr("job rb-fork forked from job rb at step 2"));
  {
    std::string state;
    auto c = trainer("rb-fork", &state);
    EXPECT_EQ(**c->LatestCommitted(proto::TIER_LOCAL_DISK), 2u);
    ASSERT_TRUE(c->Restore(2).ok());
    EXPECT_EQ(state, state_of(2));
    state = state_of(3);
    auto save = c->SaveAsync(3);  // the fork goes its own way
    ASSERT_TRUE(save.ok());
    ASSERT_TRUE((*save)->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
  }
  EXPECT_EQ(RunCli(cli + "rb 2 --into rb-fork").exit_code, 1)
      << "a fork never overwrites a job";

  // In place, keeping the newer steps as an archive job.
  Result back = RunCli(cli + "rb 3 --json");
  ASSERT_EQ(back.exit_code, 0) << back.out;
  nlohmann::json j = nlohmann::json::parse(back.out);
  EXPECT_EQ(j["step"], 3);
  EXPECT_EQ(j["from_step"], 5);
  EXPECT_EQ(j["dropped_steps"], 2);
  const std::string archive = j["archived_as"];
  {
    std::string state;
    auto c = trainer(archive, &state);
    EXPECT_THAT(*c->ListCommitted(proto::TIER_LOCAL_DISK),
                ::testing::ElementsAre(4, 5));
    ASSERT_TRUE(c->Restore(5).ok());
    EXPECT_EQ(state, state_of(5));
  }
  {
    std::string state;
    auto c = trainer("rb", &state);
    EXPECT_EQ(**c->LatestCommitted(proto::TIER_LOCAL_DISK), 3u);
    EXPECT_EQ(**c->LatestCommitted(proto::TIER_MEMORY), 3u);
    ASSERT_TRUE(c->Restore(3).ok());
    EXPECT_EQ(state, state_of(3));
    EXPECT_FALSE(c->Restore(5).ok()) << "step 5 left job rb";
    // The job goes on from step 3: step 4 is saved anew and commits.
    state = state_of(9);
    auto save = c->SaveAsync(4);
    ASSERT_TRUE(save.ok()) << save.status();
    ASSERT_TRUE((*save)->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
  }
  EXPECT_EQ(RunCli("--data-dir " + daemon.data_dir() + " verify rb").exit_code,
            0);

  // Discarding: back to step 2, no archive.
  Result discard = RunCli(cli + "rb 2 --discard-newer");
  ASSERT_EQ(discard.exit_code, 0) << discard.out;
  EXPECT_THAT(discard.out, HasSubstr("2 newer step(s) discarded"));

  // Refused: a step that is not committed, a damaged step, bad usage.
  EXPECT_EQ(RunCli(cli + "rb 7").exit_code, 3);
  EXPECT_EQ(RunCli(cli + "nosuchjob 1").exit_code, 3);
  EXPECT_EQ(RunCli(cli + "rb 2 --into x --discard-newer").exit_code, 2);
  std::string bytes = testing::ReadAll(files[0]);
  bytes[bytes.size() / 2] ^= 0x20;
  testing::WriteAll(files[0], bytes);
  Result damaged = RunCli(cli + "rb 1");
  EXPECT_EQ(damaged.exit_code, 1) << damaged.out;
  EXPECT_THAT(damaged.out, HasSubstr("does not verify"));
  EXPECT_THAT(damaged.out, HasSubstr("nothing was changed"));
  std::string state;
  auto c = trainer("rb", &state);
  EXPECT_EQ(**c->LatestCommitted(proto::TIER_LOCAL_DISK), 2u);
}

}  // namespace
}  // namespace ckpt
