#include "tools/ckpt_store.h"

#include <cstdio>
#include <iostream>
#include <map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "io/s3/s3_client.h"
#include "io/s3/s3_file_system.h"
#include "io/status_macros.h"
#include "nlohmann/json.hpp"
#include "proto/catalog.pb.h"
#include "snapshot/format.h"
#include "snapshot/manifest_seal.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shared_layout.h"
#include "tools/ckpt_cli.h"
#include "tools/export.h"

namespace ckpt::cli {
namespace {

// A step as the tier holds it: its marker's record, if any, and its copies.
struct StoredStep {
  absl::optional<proto::CommitRecord> commit;
  std::map<uint32_t, std::string> copies;  // rank -> name
};

constexpr uint32_t kMaxMarkerWorld = 1 << 20;

// The ranks of `s`'s world without a copy in the folder's listing.
std::vector<uint32_t> MissingRanks(const StoredStep& s) {
  std::vector<uint32_t> missing;
  for (uint32_t r = 0; s.commit.has_value() && r < s.commit->world_size();
       ++r) {
    if (s.copies.count(r) == 0) missing.push_back(r);
  }
  return missing;
}

// The steps in the job folder `dir` (none if it is not one).
absl::StatusOr<std::map<uint64_t, StoredStep>> ReadJob(io::FileSystem* fs,
                                                       const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(dir));
  std::map<uint64_t, StoredStep> steps;
  for (const std::string& name : names) {
    uint64_t step = 0;
    uint32_t rank = 0;
    if (snapshot::ParseCopyName(name, &step, &rank)) {
      steps[step].copies[rank] = name;
    } else if (snapshot::ParseMarkerName(name, &step)) {
      ASSIGN_OR_RETURN(std::string bytes,
                       io::ReadFileToString(fs, io::JoinPath(dir, name)));
      proto::CommitRecord c;
      if (!c.ParseFromString(bytes) || c.step() != step) {
        return absl::DataLossError(absl::StrCat(
            "the commit marker ", io::JoinPath(dir, name), " is damaged"));
      }
      // Bytes from the store: a world no job has is refused before anything
      // is sized by it.
      if (c.world_size() == 0 || c.world_size() > kMaxMarkerWorld) {
        return absl::DataLossError(absl::StrCat(
            "the commit marker ", io::JoinPath(dir, name), " names a world of ",
            c.world_size(), " ranks (1 to ", kMaxMarkerWorld, " expected)"));
      }
      steps[step].commit = std::move(c);
    }
  }
  return steps;
}

nlohmann::json StepJson(io::FileSystem* fs, const std::string& dir,
                        uint64_t step, const StoredStep& s) {
  nlohmann::json j;
  j["step"] = step;
  j["committed"] = s.commit.has_value();
  if (s.commit.has_value()) j["world_size"] = s.commit->world_size();
  uint64_t bytes = 0;
  j["copies"] = nlohmann::json::array();
  for (const auto& [rank, name] : s.copies) {
    const uint64_t size = fs->FileSize(io::JoinPath(dir, name)).value_or(0);
    bytes += size;
    j["copies"].push_back({{"rank", rank}, {"bytes", size}});
  }
  j["bytes"] = bytes;
  return j;
}

}  // namespace

absl::StatusOr<std::unique_ptr<io::FileSystem>> OpenStore(
    const std::string& location, const StoreOptions& options) {
  if (!io::s3::S3FileSystem::IsS3Path(location)) {
    return io::NewPosixFileSystem();
  }
  RETURN_IF_ERROR(io::s3::ParseS3Uri(location).status());
  io::s3::S3Options s3;
  s3.endpoint = options.endpoint;
  s3.region = options.region;
  s3.path_style = options.path_style;
  ASSIGN_OR_RETURN(s3.credentials,
                   io::s3::ResolveCredentials(options.credentials));
  ASSIGN_OR_RETURN(std::unique_ptr<io::s3::S3Client> client,
                   io::s3::S3Client::Create(std::move(s3)));
  return std::unique_ptr<io::FileSystem>(
      new io::s3::S3FileSystem(std::move(client)));
}

int LsStore(io::FileSystem* fs, const std::string& location, bool json) {
  auto job = ReadJob(fs, location);
  if (!job.ok()) return Fail("ls", job.status());
  nlohmann::json out;
  if (!job->empty()) {  // a job's folder
    out["location"] = location;
    out["steps"] = nlohmann::json::array();
    for (const auto& [step, s] : *job) {
      out["steps"].push_back(StepJson(fs, location, step, s));
    }
  } else {
    auto names = fs->ListDir(location);
    if (!names.ok()) return Fail("ls", names.status());
    out["location"] = location;
    out["jobs"] = nlohmann::json::array();
    for (const std::string& name : *names) {
      auto steps = ReadJob(fs, io::JoinPath(location, name));
      if (!steps.ok() || steps->empty()) continue;
      std::vector<uint64_t> committed;
      for (const auto& [step, s] : *steps) {
        if (s.commit.has_value()) committed.push_back(step);
      }
      out["jobs"].push_back({{"job", name}, {"committed", committed}});
    }
  }
  if (json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (out.contains("steps")) {
    for (const nlohmann::json& s : out["steps"]) {
      std::printf("step %llu: %s, %zu copies, %llu bytes\n",
                  static_cast<unsigned long long>(s["step"].get<uint64_t>()),
                  s["committed"].get<bool>()
                      ? absl::StrCat("committed (world size ",
                                     s["world_size"].get<uint32_t>(), ")")
                            .c_str()
                      : "not committed",
                  s["copies"].size(),
                  static_cast<unsigned long long>(s["bytes"].get<uint64_t>()));
    }
  } else {
    for (const nlohmann::json& j : out["jobs"]) {
      const auto committed = j["committed"].get<std::vector<uint64_t>>();
      std::printf(
          "%s: committed steps %s\n", j["job"].get<std::string>().c_str(),
          committed.empty() ? "none" : absl::StrJoin(committed, ", ").c_str());
    }
  }
  return 0;
}

int VerifyStore(io::FileSystem* fs, const std::string& location,
                const std::string& step_text, bool json) {
  absl::optional<uint64_t> only;
  if (!step_text.empty()) {
    auto parsed = ParseStep(step_text);
    if (!parsed.ok()) return UsageError("verify", parsed.status());
    only = *parsed;
  }
  auto job = ReadJob(fs, location);
  if (!job.ok()) return Fail("verify", job.status());
  const bool sealed = snapshot::InstalledSealKeys() != nullptr;
  nlohmann::json out = nlohmann::json::array();
  int bad = 0, checked = 0;
  for (const auto& [step, s] : *job) {
    if ((only.has_value() && step != *only) || !s.commit.has_value()) continue;
    for (uint32_t rank = 0; rank < s.commit->world_size(); ++rank) {
      const std::string path =
          io::JoinPath(location, snapshot::ShardFileName(step, rank, ".ckpt"));
      std::vector<absl::Status> errors;
      if (s.copies.count(rank) == 0) {
        errors.push_back(absl::NotFoundError(
            absl::StrCat("no copy ", path, " in the folder")));
      } else if (auto reader = snapshot::ShardReader::Open(fs, path);
                 !reader.ok()) {
        errors.push_back(reader.status());
      } else {
        errors = (*reader)->VerifyAll();
      }
      ++checked;
      if (!errors.empty()) ++bad;
      nlohmann::json j = {{"step", step},
                          {"rank", rank},
                          {"path", path},
                          {"ok", errors.empty()}};
      for (const absl::Status& e : errors) {
        j["errors"].push_back(std::string(e.message()));
        if (!json) {
          std::printf("BAD step %llu rank %u: %s\n",
                      static_cast<unsigned long long>(step), rank,
                      std::string(e.message()).c_str());
        }
      }
      out.push_back(std::move(j));
    }
  }
  if (checked == 0) {
    return Fail("verify", absl::NotFoundError(absl::StrCat(
                              "no committed step", only.has_value() ? " " : "s",
                              only.has_value() ? std::to_string(*only) : "",
                              " in ", location)));
  }
  if (json) {
    std::cout << out.dump(2) << "\n";
  } else if (bad == 0) {
    std::printf("OK  %s: %d copies verified%s\n", location.c_str(), checked,
                sealed ? " with their seals" : "");
  }
  return bad == 0 ? 0 : 1;
}

int ExportStore(io::FileSystem* fs, const std::string& location,
                const std::string& step_text, const std::string& format,
                const std::string& out, bool json) {
  auto step = ParseStep(step_text);
  if (!step.ok()) return UsageError("export", step.status());
  if (!KnownExportFormat(format)) return kExitUsage;
  auto job = ReadJob(fs, location);
  if (!job.ok()) return Fail("export", job.status());
  auto it = job->find(*step);
  if (it == job->end() || !it->second.commit.has_value()) {
    return Fail("export",
                absl::NotFoundError(absl::StrCat(
                    "step ", *step, " is not committed in ", location,
                    it == job->end() ? " (no copy of it there)"
                                     : " (copies but no commit marker)",
                    "; see ckpt ls ", location)));
  }
  if (std::vector<uint32_t> missing = MissingRanks(it->second);
      !missing.empty()) {
    const size_t lacking = missing.size();
    if (missing.size() > 8) missing.resize(8);
    return Fail(
        "export",
        absl::NotFoundError(absl::StrCat(
            "step ", *step, " in ", location, " lacks ", lacking, " of its ",
            it->second.commit->world_size(), " ranks' copies (ranks ",
            absl::StrJoin(missing, ", "), "...)")));
  }
  const std::string name(
      io::BaseName(std::string(absl::StripSuffix(location, "/"))));
  Progress progress("export");
  auto stats = tools::ExportSafetensorsFromStore(
      fs, location, name, *step, it->second.commit->world_size(), out,
      [&](int done, int total) { progress.Update(done, total); });
  if (!stats.ok()) return Fail("export", stats.status());
  if (json) {
    std::cout << nlohmann::json{{"location", location},
                                {"step", *step},
                                {"path", out},
                                {"tensors", stats->tensors},
                                {"bytes", stats->bytes}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("exported step %llu of %s: %d tensors, %s -> %s\n",
                static_cast<unsigned long long>(*step), location.c_str(),
                stats->tensors, HumanBytes(stats->bytes).c_str(), out.c_str());
  }
  return 0;
}

namespace {

// The multipart uploads under the job folder `location` of an object store
// begun before now - `stale`, aborted unless `dry_run`; their keys.
absl::StatusOr<std::vector<std::string>> AbortStaleUploads(
    io::FileSystem* fs, const std::string& location, absl::Duration stale,
    bool dry_run) {
  auto* store = dynamic_cast<io::s3::S3FileSystem*>(fs);
  if (store == nullptr) return std::vector<std::string>();
  ASSIGN_OR_RETURN(io::s3::S3Uri uri, io::s3::ParseS3Uri(location));
  ASSIGN_OR_RETURN(std::vector<io::s3::MultipartUpload> uploads,
                   store->client().ListMultipartUploads(
                       uri.bucket, uri.prefix.empty() ? "" : uri.prefix + "/"));
  std::vector<std::string> aborted;
  const absl::Time before = absl::Now() - stale;
  for (const io::s3::MultipartUpload& u : uploads) {
    if (u.initiated > before) continue;
    if (!dry_run) {
      RETURN_IF_ERROR(
          store->client().AbortMultipartUpload(uri.bucket, u.key, u.upload_id));
    }
    aborted.push_back(u.key);
  }
  return aborted;
}

}  // namespace

int GcStore(io::FileSystem* fs, const std::string& location, int keep,
            absl::Duration stale_uploads, bool dry_run, bool json) {
  if (keep < 1) {
    return UsageError("gc", absl::InvalidArgumentError(
                                "--keep must be at least 1 on a store: "
                                "the newest committed step always stays"));
  }
  auto names = fs->ListDir(location);
  if (!names.ok()) return Fail("gc", names.status());
  std::vector<uint64_t> committed;
  for (const std::string& name : *names) {
    uint64_t step = 0;
    if (snapshot::ParseMarkerName(name, &step)) committed.push_back(step);
  }
  if (committed.empty()) {
    return Fail("gc", absl::NotFoundError(absl::StrCat(
                          "no committed step in ", location,
                          " (no commit marker): nothing is dropped")));
  }
  const snapshot::SharedRetention plan =
      snapshot::PlanSharedRetention(*names, committed, keep);
  int failed = 0;
  if (!dry_run) {
    // Markers first: a step is gone before any of its copies is.
    for (const std::vector<std::string>* batch :
         {&plan.markers, &plan.copies}) {
      for (const std::string& name : *batch) {
        absl::Status s = fs->Unlink(io::JoinPath(location, name));
        if (!s.ok() && !absl::IsNotFound(s)) {
          std::cerr << "ckpt gc: " << s << "\n";
          ++failed;
        }
      }
      if (failed > 0) break;  // no copy goes while its marker stays
    }
  }
  absl::StatusOr<std::vector<std::string>> aborted =
      AbortStaleUploads(fs, location, stale_uploads, dry_run);
  if (!aborted.ok()) {
    std::cerr << "ckpt gc: the uploads left open: " << aborted.status() << "\n";
    ++failed;
    aborted = std::vector<std::string>();
  }
  const std::vector<uint64_t> dropped(plan.dropped_steps.begin(),
                                      plan.dropped_steps.end());
  const std::vector<uint64_t> pinned(plan.pinned_steps.begin(),
                                     plan.pinned_steps.end());
  if (json) {
    std::cout << nlohmann::json{{"location", location},
                                {"dry_run", dry_run},
                                {"oldest_kept", plan.oldest_kept},
                                {"dropped_steps", dropped},
                                {"kept_as_bases", pinned},
                                {"uploads_aborted", *aborted},
                                {"objects_removed",
                                 dry_run ? 0
                                         : plan.markers.size() +
                                               plan.copies.size()},
                                {"errors", failed}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("%s%s: %s; keeps steps from %llu%s\n",
                dry_run ? "would drop, " : "", location.c_str(),
                dropped.empty()
                    ? "nothing to drop"
                    : absl::StrCat("steps ", absl::StrJoin(dropped, ", "),
                                   dry_run ? "" : " dropped")
                          .c_str(),
                static_cast<unsigned long long>(plan.oldest_kept),
                pinned.empty()
                    ? ""
                    : absl::StrCat(" and steps ", absl::StrJoin(pinned, ", "),
                                   " as bases of kept increments")
                          .c_str());
    if (!aborted->empty()) {
      std::printf("%s%zu upload(s) left open: %s\n",
                  dry_run ? "would abort " : "aborted ", aborted->size(),
                  absl::StrJoin(*aborted, ", ").c_str());
    }
  }
  return failed == 0 ? 0 : kExitProblems;
}

}  // namespace ckpt::cli
