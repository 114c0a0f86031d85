#include "io/s3/credentials.h"

#include <cstdlib>
#include <fstream>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ckpt::io::s3 {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// The profile's keys in an INI file of [profile] sections and `key = value`
// lines; NotFound if the file or the profile is not there.
absl::StatusOr<std::map<std::string, std::string>> ReadProfile(
    const std::string& path, const std::string& profile) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("no shared credentials file ", path));
  }
  std::map<std::string, std::string> keys;
  bool inside = false, found = false;
  for (std::string line; std::getline(in, line);) {
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty() || l[0] == '#' || l[0] == ';') continue;
    if (l.front() == '[' && l.back() == ']') {
      inside = absl::StripAsciiWhitespace(l.substr(1, l.size() - 2)) == profile;
      found = found || inside;
      continue;
    }
    const size_t eq = l.find('=');
    if (!inside || eq == absl::string_view::npos) continue;
    keys[std::string(absl::StripAsciiWhitespace(l.substr(0, eq)))] =
        std::string(absl::StripAsciiWhitespace(l.substr(eq + 1)));
  }
  if (!found) {
    return absl::NotFoundError(
        absl::StrCat("no profile [", profile, "] in ", path));
  }
  return keys;
}

}  // namespace

absl::StatusOr<Credentials> ResolveCredentials(
    const CredentialSources& sources) {
  if (!sources.given.access_key_id.empty()) {
    if (sources.given.secret_access_key.empty()) {
      return absl::InvalidArgumentError(
          "S3 credentials: an access key id is given without its secret key");
    }
    return sources.given;
  }
  Credentials env{Env("AWS_ACCESS_KEY_ID"), Env("AWS_SECRET_ACCESS_KEY"),
                  Env("AWS_SESSION_TOKEN")};
  if (!env.access_key_id.empty() && !env.secret_access_key.empty()) {
    return env;
  }
  std::string file = sources.credentials_file;
  if (file.empty()) file = Env("AWS_SHARED_CREDENTIALS_FILE");
  if (file.empty() && !Env("HOME").empty()) {
    file = Env("HOME") + "/.aws/credentials";
  }
  std::string profile = sources.profile;
  if (profile.empty()) profile = Env("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  absl::Status why = absl::NotFoundError("no home directory");
  if (!file.empty()) {
    absl::StatusOr<std::map<std::string, std::string>> keys =
        ReadProfile(file, profile);
    if (keys.ok()) {
      Credentials c{(*keys)["aws_access_key_id"],
                    (*keys)["aws_secret_access_key"],
                    (*keys)["aws_session_token"]};
      if (!c.access_key_id.empty() && !c.secret_access_key.empty()) return c;
      return absl::InvalidArgumentError(
          absl::StrCat("S3 credentials: profile [", profile, "] in ", file,
                       " lacks aws_access_key_id or aws_secret_access_key"));
    }
    why = keys.status();
  }
  return absl::NotFoundError(absl::StrCat(
      "no S3 credentials: none in ckptd's configuration, ",
      env.access_key_id.empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
      " is not set, and ", why.message()));
}

}  // namespace ckpt::io::s3
