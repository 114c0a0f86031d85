#include "io/unsynced_journal.h"

#include <algorithm>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "io/status_macros.h"

namespace ckpt::io {
namespace {

constexpr absl::string_view kKeptMarker = ".fi-kept-";

// Adds [begin, end) to a set of disjoint ranges, merging what touches it.
void AddRange(std::map<uint64_t, uint64_t>& ranges, uint64_t begin,
              uint64_t end) {
  if (begin >= end) return;
  auto it = ranges.upper_bound(begin);
  if (it != ranges.begin() && std::prev(it)->second >= begin) --it;
  while (it != ranges.end() && it->first <= end) {
    begin = std::min(begin, it->first);
    end = std::max(end, it->second);
    it = ranges.erase(it);
  }
  ranges[begin] = end;
}

// Drops everything at or beyond `size`.
void ClipRanges(std::map<uint64_t, uint64_t>& ranges, uint64_t size) {
  for (auto it = ranges.begin(); it != ranges.end();) {
    if (it->first >= size) {
      it = ranges.erase(it);
    } else {
      it->second = std::min(it->second, size);
      ++it;
    }
  }
}

}  // namespace

int UnsyncedJournal::IdAt(const std::string& path) {
  auto it = paths_.find(path);
  if (it != paths_.end()) return it->second;
  return 0;
}

int UnsyncedJournal::Opened(const std::string& path, int64_t existing_size,
                            bool truncate) {
  int id = IdAt(path);
  if (id == 0) {
    id = next_id_++;
    paths_[path] = id;
    FileState& f = files_[id];
    if (existing_size >= 0) {
      f.size = f.synced_size = static_cast<uint64_t>(existing_size);
    } else {
      pending_.push_back(NameOp{.create = true, .to = path});
    }
  }
  if (truncate) Resized(id, 0, /*shrink=*/true);
  return id;
}

void UnsyncedJournal::Wrote(int id, uint64_t offset, uint64_t length) {
  auto it = files_.find(id);
  if (it == files_.end()) return;  // unlinked meanwhile
  AddRange(it->second.dirty, offset, offset + length);
  it->second.size = std::max(it->second.size, offset + length);
}

void UnsyncedJournal::Resized(int id, uint64_t size, bool shrink) {
  auto it = files_.find(id);
  if (it == files_.end()) return;
  FileState& f = it->second;
  if (!shrink) {
    f.size = std::max(f.size, size);
    return;
  }
  // A shrink may reach the disk before the fsync: the harsher outcome.
  f.size = size;
  f.synced_size = std::min(f.synced_size, size);
}

void UnsyncedJournal::Synced(int id) {
  auto it = files_.find(id);
  if (it == files_.end()) return;
  it->second.dirty.clear();
  it->second.synced_size = it->second.size;
}

void UnsyncedJournal::SyncFailed(int id) {
  auto it = files_.find(id);
  if (it == files_.end()) return;
  for (const auto& [begin, end] : it->second.dirty) {
    AddRange(it->second.lost, begin, end);
  }
  it->second.dirty.clear();
}

void UnsyncedJournal::Renamed(const std::string& from, const std::string& to,
                              const std::string& kept) {
  const int id = IdAt(from);
  const int replaced = IdAt(to);
  if (replaced != 0) {
    paths_.erase(to);
    if (!kept.empty()) {
      paths_[kept] = replaced;
    } else {
      files_.erase(replaced);
    }
  }
  if (id != 0) {
    paths_.erase(from);
    paths_[to] = id;
  }
  pending_.push_back(NameOp{.from = from, .to = to, .kept = kept});
}

void UnsyncedJournal::Unlinked(const std::string& path) {
  const int id = IdAt(path);
  if (id == 0) return;
  paths_.erase(path);
  files_.erase(id);
}

void UnsyncedJournal::Linked(const std::string& link) {
  pending_.push_back(NameOp{.create = true, .to = link});
}

std::vector<std::string> UnsyncedJournal::DirSynced(const std::string& dir) {
  std::vector<std::string> kept;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (DirName(it->to) != dir) {
      ++it;
      continue;
    }
    if (!it->kept.empty()) {
      kept.push_back(it->kept);
      const int id = IdAt(it->kept);
      paths_.erase(it->kept);
      files_.erase(id);
    }
    it = pending_.erase(it);
  }
  return kept;
}

std::string UnsyncedJournal::Plan() const {
  std::string plan;
  // Names first, newest first, on a copy of the name map so that each file's
  // data is then fixed under the name it has after the undo.
  std::map<std::string, int> paths = paths_;
  for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
    if (it->create) {
      absl::StrAppend(&plan, "U\t", it->to, "\n");
      paths.erase(it->to);
      continue;
    }
    absl::StrAppend(&plan, "R\t", it->to, "\t", it->from, "\n");
    auto moved = paths.find(it->to);
    if (moved != paths.end()) {
      const int id = moved->second;
      paths.erase(moved);
      paths[it->from] = id;
    }
    if (!it->kept.empty()) {
      absl::StrAppend(&plan, "R\t", it->kept, "\t", it->to, "\n");
      auto back = paths.find(it->kept);
      if (back != paths.end()) {
        const int id = back->second;
        paths.erase(back);
        paths[it->to] = id;
      }
    }
  }
  for (const auto& [path, id] : paths) {
    auto f = files_.find(id);
    if (f == files_.end()) continue;
    std::map<uint64_t, uint64_t> garbage = f->second.lost;
    for (const auto& [begin, end] : f->second.dirty) {
      AddRange(garbage, begin, end);
    }
    ClipRanges(garbage, f->second.synced_size);
    absl::StrAppend(&plan, "T\t", path, "\t", f->second.synced_size, "\n");
    for (const auto& [begin, end] : garbage) {
      absl::StrAppend(&plan, "G\t", path, "\t", begin, "\t", end - begin, "\n");
    }
  }
  return plan;
}

std::string UnsyncedJournal::KeptLinkName(const std::string& path, uint64_t n) {
  return JoinPath(DirName(path), absl::StrCat(BaseName(path), kKeptMarker, n));
}

bool UnsyncedJournal::IsKeptLink(absl::string_view name) {
  return absl::StrContains(name, kKeptMarker);
}

absl::Status ApplyPowerLossPlan(FileSystem* fs, absl::string_view plan) {
  std::mt19937_64 rng(0x6a7b);
  for (absl::string_view line : absl::StrSplit(plan, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, '\t');
    auto bad = [&] {
      return absl::InvalidArgumentError(
          absl::StrCat("power-loss plan: bad line '", line, "'"));
    };
    if (f.empty() || f[0].size() != 1) return bad();
    const char op = f[0][0];
    if (op == 'U' && f.size() == 2) {
      absl::Status s = fs->Unlink(f[1]);
      if (!s.ok() && !absl::IsNotFound(s)) return s;
    } else if (op == 'R' && f.size() == 3) {
      absl::StatusOr<bool> there = fs->Exists(f[1]);
      RETURN_IF_ERROR(there.status());
      if (*there) RETURN_IF_ERROR(fs->Rename(f[1], f[2]));
    } else if ((op == 'T' && f.size() == 3) || (op == 'G' && f.size() == 4)) {
      uint64_t a = 0, b = 0;
      if (!absl::SimpleAtoi(f[2], &a) ||
          (op == 'G' && !absl::SimpleAtoi(f[3], &b))) {
        return bad();
      }
      absl::StatusOr<uint64_t> size = fs->FileSize(f[1]);
      if (absl::IsNotFound(size.status())) continue;
      RETURN_IF_ERROR(size.status());
      ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                       fs->NewWritableFile(f[1], {.truncate = false}));
      if (op == 'T') {
        if (*size > a) RETURN_IF_ERROR(file->Truncate(a));
      } else {
        std::string junk(b, '\0');
        for (char& c : junk) c = static_cast<char>(rng());
        RETURN_IF_ERROR(file->WriteBorrowed(
            a,
            absl::Span<const uint8_t>(
                reinterpret_cast<const uint8_t*>(junk.data()), junk.size())));
      }
      RETURN_IF_ERROR(file->Sync());
      RETURN_IF_ERROR(file->Close());
    } else {
      return bad();
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt::io
