#include "io/s3/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::io::s3 {
namespace {

std::string Hmac(absl::string_view key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out,
       &n);
  return std::string(reinterpret_cast<const char*>(out), n);
}

// Trimmed, inner runs of spaces as one (the canonical header value).
std::string CanonicalValue(absl::string_view v) {
  v = absl::StripAsciiWhitespace(v);
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == ' ' && !out.empty() && out.back() == ' ') continue;
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::string UriEncode(absl::string_view s, bool encode_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (c == '/' && !encode_slash)) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), digest, &n, EVP_sha256(), nullptr);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), n));
}

std::string AmzDate(absl::Time t) {
  return absl::FormatTime("%Y%m%dT%H%M%SZ", t, absl::UTCTimeZone());
}

std::string CanonicalRequest(const HttpRequest& r,
                             absl::string_view payload_sha256,
                             std::string* signed_headers) {
  // Query: names and values encoded, sorted by name then value.
  std::vector<std::pair<std::string, std::string>> query;
  for (const auto& [name, value] : r.query) {
    query.emplace_back(UriEncode(name, true), UriEncode(value, true));
  }
  std::sort(query.begin(), query.end());
  std::vector<std::string> params;
  for (const auto& [name, value] : query) {
    params.push_back(absl::StrCat(name, "=", value));
  }
  // Headers: lowercase names, sorted; repeated ones joined by commas.
  std::map<std::string, std::string> headers;
  headers["host"] = r.host;
  for (const auto& [name, value] : r.headers) {
    std::string& v = headers[absl::AsciiStrToLower(name)];
    absl::StrAppend(&v, v.empty() ? "" : ",", CanonicalValue(value));
  }
  std::string canonical_headers;
  std::vector<absl::string_view> names;
  for (const auto& [name, value] : headers) {
    absl::StrAppend(&canonical_headers, name, ":", value, "\n");
    names.push_back(name);
  }
  *signed_headers = absl::StrJoin(names, ";");
  return absl::StrCat(r.method, "\n", r.path, "\n", absl::StrJoin(params, "&"),
                      "\n", canonical_headers, "\n", *signed_headers, "\n",
                      payload_sha256);
}

std::string Authorization(const Credentials& credentials, const HttpRequest& r,
                          absl::string_view payload_sha256,
                          absl::string_view amz_date, absl::string_view region,
                          absl::string_view service) {
  std::string signed_headers;
  const std::string canonical =
      CanonicalRequest(r, payload_sha256, &signed_headers);
  const absl::string_view date = amz_date.substr(0, 8);
  const std::string scope =
      absl::StrCat(date, "/", region, "/", service, "/aws4_request");
  const std::string to_sign = absl::StrCat("AWS4-HMAC-SHA256\n", amz_date, "\n",
                                           scope, "\n", Sha256Hex(canonical));
  std::string key =
      Hmac(absl::StrCat("AWS4", credentials.secret_access_key), date);
  key = Hmac(key, region);
  key = Hmac(key, service);
  key = Hmac(key, "aws4_request");
  const std::string signature = absl::BytesToHexString(Hmac(key, to_sign));
  return absl::StrCat("AWS4-HMAC-SHA256 Credential=", credentials.access_key_id,
                      "/", scope, ",SignedHeaders=", signed_headers,
                      ",Signature=", signature);
}

void SignS3(const Credentials& credentials, absl::string_view region,
            absl::Time now, absl::string_view payload_sha256, HttpRequest* r) {
  const std::string amz_date = AmzDate(now);
  r->headers.emplace_back("x-amz-date", amz_date);
  r->headers.emplace_back("x-amz-content-sha256", std::string(payload_sha256));
  if (!credentials.session_token.empty()) {
    r->headers.emplace_back("x-amz-security-token", credentials.session_token);
  }
  r->headers.emplace_back(
      "Authorization",
      Authorization(credentials, *r, payload_sha256, amz_date, region, "s3"));
}

}  // namespace ckpt::io::s3
