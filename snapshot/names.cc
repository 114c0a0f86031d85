#include "snapshot/names.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ckpt::snapshot {
namespace {

// Quoted and escaped so a NUL or control byte in a bad name shows up in the
// message.
std::string Quote(absl::string_view s) {
  constexpr size_t kShown = 80;
  std::string shown = absl::CHexEscape(s.substr(0, kShown));
  return absl::StrCat("\"", shown, s.size() > kShown ? "...\"" : "\"");
}

absl::Status CheckComponents(absl::string_view what, absl::string_view name) {
  if (name.front() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Quote(name), " is absolute"));
  }
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", Quote(name), " has an empty component"));
    }
    if (part == "." || part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", Quote(name), " has a '", part, "' component"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// A name that is also a path component and a coordinator key component:
// letters, digits, '.', '_' and '-', not "." or "..".
absl::Status ValidateId(absl::string_view what, absl::string_view id) {
  if (id.empty())
    return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (id.size() > kMaxJobIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Quote(id), " is ", id.size(),
                     " bytes; the limit is ", kMaxJobIdLength));
  }
  if (id == "." || id == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Quote(id), " is not allowed"));
  }
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", Quote(id), " contains ", Quote(absl::string_view(&c, 1)),
          "; allowed are letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobId(absl::string_view job) {
  return ValidateId("job id", job);
}

absl::Status ValidateTopic(absl::string_view topic) {
  return ValidateId("topic", topic);
}

absl::Status ValidateItemName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("item name is empty");
  if (name.size() > kMaxItemNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("item name ", Quote(name), " is ", name.size(),
                     " bytes; the limit is ", kMaxItemNameLength));
  }
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "item name ", Quote(name), " contains a control or non-ASCII byte ",
          Quote(absl::string_view(&c, 1))));
    }
  }
  return CheckComponents("item name", name);
}

absl::Status ValidateRelativePath(absl::string_view path) {
  if (path.empty()) return absl::InvalidArgumentError("path is empty");
  if (path.size() > kMaxPathLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("path ", Quote(path), " is ", path.size(),
                     " bytes; the limit is ", kMaxPathLength));
  }
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("path ", Quote(path), " contains NUL"));
  }
  return CheckComponents("path", path);
}

}  // namespace ckpt::snapshot
