// AWS Signature Version 4, as S3 requests carry it in their Authorization
// header: the one part of the S3 protocol written here (Debian has no C++ S3
// SDK). A request is put in canonical form (method, URI path, sorted query,
// sorted lowercase headers, the payload's SHA-256), hashed into a string to
// sign with the date and the credential scope (date/region/service), and
// signed with a key derived from the secret by HMAC-SHA256 through the
// scope. Checked against the examples AWS publishes (tests/io/s3).
//
// Thread-safety: pure functions.
#ifndef CKPT_IO_S3_SIGV4_H_
#define CKPT_IO_S3_SIGV4_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt::io::s3 {

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials' token, or empty
};

// One HTTP request as it is signed.
struct HttpRequest {
  std::string method;  // "GET", "PUT", ...
  std::string host;    // the Host header's value (with ":port" if not default)
  std::string path;    // the URI path as sent: begins with '/', URI-encoded
  // Query parameters, names and values as they are (encoded when signed and
  // sent); a parameter without a value has an empty one.
  std::vector<std::pair<std::string, std::string>> query;
  // Headers besides Host, signed and sent (names in any case).
  std::vector<std::pair<std::string, std::string>> headers;
};

// RFC 3986 unreserved characters kept, every other byte as %XX (uppercase);
// '/' kept unless `encode_slash` (a key in a path keeps its slashes, a query
// value does not).
std::string UriEncode(absl::string_view s, bool encode_slash);

// Lowercase hex of the SHA-256 of `data`; of the empty string, the hash of an
// empty payload.
std::string Sha256Hex(absl::string_view data);

// "20130524T000000Z", the x-amz-date of time `t` (UTC).
std::string AmzDate(absl::Time t);

// The canonical request of `r` with payload hash `payload_sha256` (hex, or
// "UNSIGNED-PAYLOAD"); `signed_headers` gets the signed headers' names
// ("host;range;x-amz-date").
std::string CanonicalRequest(const HttpRequest& r,
                             absl::string_view payload_sha256,
                             std::string* signed_headers);

// The Authorization header's value for `r`, which carries x-amz-date
// `amz_date` among its headers already.
std::string Authorization(const Credentials& credentials, const HttpRequest& r,
                          absl::string_view payload_sha256,
                          absl::string_view amz_date, absl::string_view region,
                          absl::string_view service);

// Signs `r` for S3 at time `now`: adds x-amz-date, x-amz-content-sha256
// (`payload_sha256`), x-amz-security-token (temporary credentials), then
// Authorization.
void SignS3(const Credentials& credentials, absl::string_view region,
            absl::Time now, absl::string_view payload_sha256, HttpRequest* r);

}  // namespace ckpt::io::s3

#endif  // CKPT_IO_S3_SIGV4_H_
