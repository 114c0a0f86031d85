// One-node CheckpointServices for tests (ServiceTest: options in a temporary
// directory, started or the test fails), and deterministic shards staged
// through them the way a trainer does (map the slot, fill it, StageComplete)
// and checked in the persisted shards.
#ifndef CKPT_TESTS_DAEMON_SERVICE_UTIL_H_
#define CKPT_TESTS_DAEMON_SERVICE_UTIL_H_

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "daemon/service/checkpoint_service.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "snapshot/shard_reader.h"
#include "tests/test_util.h"

namespace ckpt::testing {

// A one-node service in `dir`: data and staging directories, a 64 MiB
// memory budget that refuses a save at once when full (kSkip), 64 KiB
// chunks.
inline daemon::ServiceOptions TestServiceOptions(const TempDir& dir) {
  daemon::ServiceOptions o;
  o.data_dir = dir.File("data");
  o.staging.dir = dir.File("staging");
  o.staging.budget_bytes = 64 << 20;
  o.staging.policy = daemon::FullPolicy::kSkip;
  o.writer.chunk_size = 64 << 10;
  return o;
}

// A test of services in a temporary directory.
class ServiceTest : public ::testing::Test {
 protected:
  daemon::ServiceOptions Options() { return TestServiceOptions(dir_); }
  // The service started, or null with the test failed.
  std::unique_ptr<daemon::CheckpointService> Start(io::FileSystem* fs,
                                                   daemon::ServiceOptions o) {
    auto service = daemon::CheckpointService::Start(fs, std::move(o));
    EXPECT_TRUE(service.ok()) << service.status();
    return service.ok() ? *std::move(service) : nullptr;
  }
  TempDir dir_;
};

// The state of `rank` at `step`: a float32 tensor (rank's box of a global
// vector) and RNG bytes.
struct RankState {
  std::vector<uint8_t> weights;
  std::vector<uint8_t> rng;
  int64_t elements;

  RankState(uint64_t step, uint32_t rank, int64_t elements = 50000)
      : elements(elements) {
    std::mt19937_64 gen(step * 1000 + rank);
    weights.resize(elements * 4);
    for (int64_t i = 0; i < elements; ++i) {
      float f = static_cast<float>(gen() % 1000) / 1000.0f;
      std::memcpy(&weights[i * 4], &f, 4);
    }
    rng.resize(16);
    for (auto& b : rng) b = static_cast<uint8_t>(gen());
  }

  std::vector<proto::StagedItem> Items(uint32_t rank, uint32_t world) const {
    std::vector<proto::StagedItem> items(2);
    proto::Item* w = items[0].mutable_item();
    w->set_name("model/w");
    w->set_kind(proto::ITEM_KIND_TENSOR);
    w->set_dtype(proto::DTYPE_FLOAT32);
    w->add_global_shape(elements * world);
    w->add_box_offset(elements * rank);
    w->add_box_length(elements);
    w->set_raw_size(weights.size());
    items[0].set_slot_offset(0);
    proto::Item* r = items[1].mutable_item();
    r->set_name("rng");
    r->set_kind(proto::ITEM_KIND_BYTES);
    r->set_raw_size(rng.size());
    items[1].set_slot_offset(weights.size());
    return items;
  }
  uint64_t bytes() const { return weights.size() + rng.size(); }

  // BeginStage, fill the slot through a mapping, StageComplete.
  absl::Status Stage(daemon::CheckpointService* service, const std::string& job,
                     uint64_t step, uint32_t rank, uint32_t world) const {
    auto slot = service->BeginStage(job, step, rank, world, bytes());
    if (!slot.ok()) return slot.status();
    {
      auto mapped = io::DefaultFileSystem()->MapFile(slot->path, {});
      if (!mapped.ok()) return mapped.status();
      std::memcpy((*mapped)->data(), weights.data(), weights.size());
      std::memcpy((*mapped)->data() + weights.size(), rng.data(), rng.size());
    }
    return service->StageComplete(job, step, rank, Items(rank, world));
  }

  // OK when the shard file holds exactly this state.
  absl::Status Check(const std::string& shard_path) const {
    auto reader =
        snapshot::ShardReader::Open(io::DefaultFileSystem(), shard_path);
    if (!reader.ok()) return reader.status();
    std::vector<uint8_t> w(weights.size()), r(rng.size());
    absl::Status s = (*reader)->ReadItem("model/w", absl::MakeSpan(w));
    if (s.ok()) s = (*reader)->ReadItem("rng", absl::MakeSpan(r));
    if (!s.ok()) return s;
    if (w != weights || r != rng)
      return absl::DataLossError(shard_path + " differs");
    return absl::OkStatus();
  }
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_DAEMON_SERVICE_UTIL_H_
