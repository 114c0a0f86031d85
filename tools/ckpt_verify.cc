// ckpt verify: shard files, or every copy of a job's steps.

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "snapshot/manifest_seal.h"
#include "snapshot/shard_reader.h"
#include "tools/ckpt_cli.h"
#include "tools/data_dir_view.h"

namespace ckpt::cli {

int Verify(const std::vector<std::string>& paths, bool json,
           io::FileSystem* fs) {
  if (fs == nullptr) fs = ckpt::io::DefaultFileSystem();
  // With a cluster key given, every manifest read is checked against it.
  const bool sealed = snapshot::InstalledSealKeys() != nullptr;
  int bad_files = 0;
  nlohmann::json out = nlohmann::json::array();
  for (const std::string& path : paths) {
    auto reader = ShardReader::Open(fs, path);
    std::vector<absl::Status> errors;
    int chunks = 0;
    if (!reader.ok()) {
      errors.push_back(reader.status());
    } else {
      for (const proto::Item& item : (*reader)->manifest().items())
        chunks += item.chunks_size();
      errors = (*reader)->VerifyAll();
    }
    if (!errors.empty()) ++bad_files;
    nlohmann::json j;
    j["path"] = path;
    j["ok"] = errors.empty();
    j["chunks"] = chunks;
    j["errors"] = nlohmann::json::array();
    for (const absl::Status& e : errors)
      j["errors"].push_back(std::string(e.message()));
    if (!json) {
      for (const absl::Status& e : errors)
        std::printf("BAD %s\n", std::string(e.message()).c_str());
      if (errors.empty())
        std::printf("OK  %s: %d chunks verified%s\n", path.c_str(), chunks,
                    sealed ? " and its seal" : "");
    }
    out.push_back(std::move(j));
  }
  if (json) std::cout << (paths.size() == 1 ? out[0] : out).dump(2) << "\n";
  return bad_files == 0 ? 0 : 1;
}

int VerifyJob(const std::string& data_dir, const std::string& job,
              const std::string& step_text, bool json) {
  absl::optional<uint64_t> step;
  if (!step_text.empty()) {
    auto parsed = ParseStep(step_text);
    if (!parsed.ok()) return UsageError("verify", parsed.status());
    step = *parsed;
  }
  auto view = ckpt::tools::DataDirView::Open(data_dir);
  if (!view.ok()) return Fail("verify", view.status());
  // Without --cluster-key, the key a single node's ckptd made for itself.
  std::string sealed_by;
  if (snapshot::InstalledSealKeys() == nullptr) {
    auto id = (*view)->InstallClusterKey();
    if (!id.ok()) return Fail("verify", id.status());
    if (id->has_value()) sealed_by = **id;
  } else {
    sealed_by = snapshot::InstalledSealKeys()->current_id();
  }
  auto shards =
      step.has_value() ? (*view)->StepShards(job, *step) : (*view)->Shards(job);
  // The replicas this node holds for its peers, and the shared tier: a node
  // may hold copies of a job none of whose ranks ran here.
  const std::vector<ckpt::tools::TierCheck> beyond =
      (*view)->VerifyBeyond(job, step);
  if (!shards.ok() && (!absl::IsNotFound(shards.status()) || beyond.empty())) {
    return Fail("verify", shards.status());
  }
  if (!shards.ok()) shards = std::vector<proto::ShardRecord>();
  int problems = 0, copies = 0, parity_blocks = 0;
  uint64_t chunks = 0;
  nlohmann::json out = nlohmann::json::array();
  Progress progress("verify");
  int done = 0;
  auto record = [&](const ckpt::tools::TierCheck& c) {
    ++(c.group >= 0 ? parity_blocks : copies);
    chunks += c.chunks;
    problems += static_cast<int>(c.problems.size());
    nlohmann::json cj;
    cj["tier"] = c.tier;
    cj["step"] = c.step;
    const std::string where =
        c.group >= 0 ? absl::StrCat("group ", c.group, " block ", c.block)
                     : absl::StrCat("rank ", c.rank);
    if (c.group >= 0) {
      cj["group"] = c.group;
      cj["block"] = c.block;
    } else {
      cj["rank"] = c.rank;
    }
    cj["path"] = c.path;
    cj["chunks"] = c.chunks;
    cj["problems"] = c.problems;
    out.push_back(std::move(cj));
    if (!json) {
      for (const std::string& p : c.problems) {
        std::printf("BAD %s step %lu %s: %s\n", c.tier.c_str(),
                    static_cast<unsigned long>(c.step), where.c_str(),
                    p.c_str());
      }
    }
  };
  for (const proto::ShardRecord& r : *shards) {
    for (const ckpt::tools::TierCheck& c : (*view)->Verify(r)) {
      record(c);
    }
    progress.Update(++done, static_cast<int>(shards->size()));
  }
  for (const ckpt::tools::TierCheck& c : beyond) record(c);
  if (json) {
    nlohmann::json j;
    j["job"] = job;
    if (step.has_value()) j["step"] = *step;
    j["ok"] = problems == 0;
    j["seals_checked"] = !sealed_by.empty();
    j["copies"] = out;
    std::cout << j.dump(2) << "\n";
  } else if (problems == 0) {
    std::printf(
        "OK  job %s%s: %d shard copies, %lu chunks verified%s%s\n", job.c_str(),
        step.has_value() ? absl::StrCat(" step ", *step).c_str() : "", copies,
        static_cast<unsigned long>(chunks),
        parity_blocks == 0
            ? ""
            : absl::StrCat(", ", parity_blocks, " parity blocks").c_str(),
        sealed_by.empty()
            ? "; seals not checked (no cluster key here: give --cluster-key)"
            : absl::StrCat("; seals checked with cluster key ", sealed_by)
                  .c_str());
  } else {
    std::printf("%d problem(s) in job %s\n", problems, job.c_str());
  }
  return problems == 0 ? 0 : kExitProblems;
}

}  // namespace ckpt::cli
