#include "io/s3/s3_client.h"

#include <algorithm>
#include <cctype>
#include <pugixml.hpp>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "io/s3/crc32c.h"
#include "io/status_macros.h"

namespace ckpt::io::s3 {

// One S3 operation's request.
struct S3Client::Call {
  std::string op;  // "PutObject", as S3's API names it
  std::string method;
  std::string bucket;
  std::string key;  // empty: the bucket itself
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::pair<std::string, std::string>> headers;
  absl::Span<const uint8_t> body;
  // Small bodies (XML) are signed with their SHA-256; data travels as
  // UNSIGNED-PAYLOAD (our own checksums cover it, end to end).
  bool sign_body = false;
  absl::Span<uint8_t> into;  // a ranged GET's destination
  uint64_t offset = 0;       // and where in the object it begins
  std::string shown;         // a listing's prefix, named in its errors
  std::string What() const {
    const std::string& named = key.empty() ? shown : key;
    return absl::StrCat(op, " s3://", bucket, named.empty() ? "" : "/", named);
  }
};

namespace {

constexpr absl::string_view kUnsigned = "UNSIGNED-PAYLOAD";

bool ValidBucket(absl::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '-' ||
          c == '.')) {
      return false;
    }
  }
  return std::isalnum(static_cast<unsigned char>(b.front())) &&
         std::isalnum(static_cast<unsigned char>(b.back()));
}

std::string Text(const pugi::xml_node& n, const char* child) {
  return n.child(child).text().as_string();
}

// S3's error space, converted here only.
absl::Status S3Error(const std::string& what, const HttpResponse& r) {
  pugi::xml_document doc;
  std::string code, message;
  if (!r.body.empty() && doc.load_buffer(r.body.data(), r.body.size())) {
    code = Text(doc.child("Error"), "Code");
    message = Text(doc.child("Error"), "Message");
  }
  std::string text = absl::StrCat(what, ": HTTP ", r.status);
  if (!code.empty()) absl::StrAppend(&text, " ", code);
  if (!message.empty()) absl::StrAppend(&text, ": ", message);
  // BadDigest: the bytes were damaged on the way; sent again, they may not.
  if (r.status >= 500 || r.status == 429 || code == "BadDigest" ||
      code == "InvalidDigest") {
    return absl::UnavailableError(text);
  }
  switch (r.status) {
    case 404:
      return absl::NotFoundError(text);
    case 401:
    case 403:
      return absl::PermissionDeniedError(text);
    case 416:
      return absl::OutOfRangeError(text);
    case 400:
      // An expired token is a credentials problem, not a bad request.
      if (code == "ExpiredToken" || code == "InvalidAccessKeyId" ||
          code == "SignatureDoesNotMatch") {
        return absl::PermissionDeniedError(text);
      }
      return absl::InvalidArgumentError(text);
    case 409:
    case 412:
      return absl::FailedPreconditionError(text);
    default:
      return absl::UnknownError(text);
  }
}

// A ranged GET answered with fewer bytes than asked: past the object's end
// (its size, from Content-Range, says so) is OutOfRange; else the transfer
// was cut, which a retry may cure.
absl::Status ShortRange(const std::string& what, absl::Span<uint8_t> into,
                        uint64_t offset, const HttpResponse& r) {
  if (into.empty() || r.landed == into.size()) return absl::OkStatus();
  auto range = r.headers.find("content-range");
  uint64_t total = 0;
  const size_t slash =
      range == r.headers.end() ? std::string::npos : range->second.rfind('/');
  if (slash != std::string::npos &&
      absl::SimpleAtoi(range->second.substr(slash + 1), &total) &&
      total < offset + into.size()) {
    return absl::OutOfRangeError(
        absl::StrCat(what, ": bytes ", offset, " to ", offset + into.size(),
                     " were asked of an object of ", total, " bytes"));
  }
  return absl::UnavailableError(absl::StrCat(what, ": ", r.landed, " of ",
                                             into.size(), " bytes arrived"));
}

absl::Status ParseXml(const HttpResponse& r, const std::string& what,
                      pugi::xml_document* doc) {
  if (!doc->load_buffer(r.body.data(), r.body.size())) {
    return absl::DataLossError(absl::StrCat(
        what, ": the server's answer is not XML: ", r.body.substr(0, 200)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string S3Uri::ToString() const {
  return absl::StrCat("s3://", bucket, prefix.empty() ? "" : "/", prefix);
}

absl::StatusOr<S3Uri> ParseS3Uri(absl::string_view uri) {
  absl::string_view rest = uri;
  if (!absl::ConsumePrefix(&rest, "s3://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", uri, "\" is not an s3://bucket/prefix URI"));
  }
  const size_t slash = rest.find('/');
  S3Uri out;
  out.bucket = std::string(rest.substr(0, slash));
  if (!ValidBucket(out.bucket)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", uri, "\": \"", out.bucket,
        "\" is not a bucket name (3 to 63 lowercase letters, digits, dots "
        "and hyphens, beginning and ending with a letter or digit)"));
  }
  if (slash != absl::string_view::npos) {
    absl::string_view prefix = rest.substr(slash + 1);
    while (absl::ConsumeSuffix(&prefix, "/")) {
    }
    for (char c : prefix) {
      if (static_cast<unsigned char>(c) < 0x20) {
        return absl::InvalidArgumentError(
            absl::StrCat("\"", absl::CHexEscape(uri),
                         "\": a control character in the prefix"));
      }
    }
    out.prefix = std::string(prefix);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(S3Options options) {
  std::string endpoint = options.endpoint;
  if (endpoint.empty()) {
    endpoint = absl::StrCat("https://s3.", options.region, ".amazonaws.com");
  }
  absl::string_view rest = endpoint;
  std::string scheme;
  if (absl::ConsumePrefix(&rest, "http://")) {
    scheme = "http";
  } else if (absl::ConsumePrefix(&rest, "https://")) {
    scheme = "https";
  }
  while (absl::ConsumeSuffix(&rest, "/")) {
  }
  if (scheme.empty() || rest.empty() ||
      rest.find_first_of("/?#@ ") != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 endpoint \"", options.endpoint,
                     "\" is not http://host[:port] or https://host[:port]"));
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError("S3: max_attempts must be at least 1");
  }
  return std::unique_ptr<S3Client>(
      new S3Client(std::move(options), scheme, std::string(rest)));
}

S3Client::S3Client(S3Options options, std::string scheme, std::string authority)
    : options_(std::move(options)),
      scheme_(std::move(scheme)),
      authority_(std::move(authority)),
      transport_(options_.timeouts) {}

absl::StatusOr<HttpResponse> S3Client::Attempt(const Call& call) {
  HttpRequest r;
  r.method = call.method;
  std::string path;
  if (options_.path_style || call.bucket.empty()) {
    r.host = authority_;
    path = call.bucket.empty() ? "" : "/" + call.bucket;
  } else {
    r.host = absl::StrCat(call.bucket, ".", authority_);
  }
  r.path = absl::StrCat(path, "/", UriEncode(call.key, false));
  r.query = call.query;
  r.headers = call.headers;
  const std::string payload =
      call.sign_body ? Sha256Hex(absl::string_view(
                           reinterpret_cast<const char*>(call.body.data()),
                           call.body.size()))
                     : std::string(kUnsigned);
  SignS3(options_.credentials, options_.region, absl::Now(), payload, &r);
  std::vector<std::string> params;
  for (const auto& [name, value] : call.query) {
    params.push_back(value.empty() ? UriEncode(name, true)
                                   : absl::StrCat(UriEncode(name, true), "=",
                                                  UriEncode(value, true)));
  }
  HttpExchange exchange;
  exchange.method = call.method;
  exchange.url =
      absl::StrCat(scheme_, "://", r.host, r.path, params.empty() ? "" : "?",
                   absl::StrJoin(params, "&"));
  exchange.headers = std::move(r.headers);
  exchange.headers.emplace_back("Host", r.host);
  exchange.body = call.body;
  exchange.into = call.into;
  return transport_.Send(exchange, call.What());
}

absl::StatusOr<HttpResponse> S3Client::Run(Call& call) {
  absl::BitGen jitter;
  absl::Status last;
  int attempt = 1;
  for (;; ++attempt) {
    absl::StatusOr<HttpResponse> r = Attempt(call);
    if (r.ok() && r->status / 100 == 2) {
      last = ShortRange(call.What(), call.into, call.offset, *r);
      if (last.ok()) return r;
    } else {
      last = r.ok() ? S3Error(call.What(), *r) : r.status();
    }
    if (!absl::IsUnavailable(last) || attempt >= options_.max_attempts) break;
    // Full jitter: a random pause up to the capped exponential step.
    const absl::Duration step = std::min(
        options_.max_backoff,
        options_.first_backoff * (int64_t{1} << std::min(attempt - 1, 20)));
    absl::SleepFor(absl::Nanoseconds(absl::Uniform<int64_t>(
        jitter, 0, std::max<int64_t>(1, absl::ToInt64Nanoseconds(step)))));
  }
  if (attempt == 1) return last;
  return absl::Status(last.code(), absl::StrCat(last.message(), " (after ",
                                                attempt, " attempts)"));
}

absl::Status S3Client::CreateBucket(const std::string& bucket) {
  std::string config;
  if (options_.region != "us-east-1") {
    config = absl::StrCat("<CreateBucketConfiguration><LocationConstraint>",
                          options_.region,
                          "</LocationConstraint></CreateBucketConfiguration>");
  }
  Call call{"CreateBucket", "PUT", bucket};
  call.body = absl::MakeConstSpan(
      reinterpret_cast<const uint8_t*>(config.data()), config.size());
  call.sign_body = true;
  absl::StatusOr<HttpResponse> r = Run(call);
  if (absl::IsFailedPrecondition(r.status()) &&
      absl::StrContains(r.status().message(), "BucketAlreadyOwnedByYou")) {
    return absl::OkStatus();
  }
  return r.status();
}

absl::Status S3Client::PutObject(const std::string& bucket,
                                 const std::string& key,
                                 absl::Span<const uint8_t> body) {
  Call call{"PutObject", "PUT", bucket, key};
  call.body = body;
  if (options_.checksums) {
    call.headers.emplace_back("x-amz-checksum-crc32c", Crc32cBase64(body));
  }
  return Run(call).status();
}

absl::StatusOr<std::string> S3Client::GetObject(const std::string& bucket,
                                                const std::string& key) {
  Call call{"GetObject", "GET", bucket, key};
  ASSIGN_OR_RETURN(HttpResponse r, Run(call));
  return std::move(r.body);
}

absl::Status S3Client::GetRange(const std::string& bucket,
                                const std::string& key, uint64_t offset,
                                absl::Span<uint8_t> out) {
  if (out.empty()) return absl::OkStatus();
  Call call{"GetObject", "GET", bucket, key};
  call.headers.emplace_back(
      "Range", absl::StrCat("bytes=", offset, "-", offset + out.size() - 1));
  call.into = out;
  call.offset = offset;
  return Run(call).status();
}

absl::StatusOr<ObjectInfo> S3Client::HeadObject(const std::string& bucket,
                                                const std::string& key) {
  Call call{"HeadObject", "HEAD", bucket, key};
  ASSIGN_OR_RETURN(HttpResponse r, Run(call));
  ObjectInfo info;
  info.key = key;
  info.etag = r.headers["etag"];
  if (!absl::SimpleAtoi(r.headers["content-length"], &info.size)) {
    return absl::DataLossError(
        absl::StrCat(call.What(), ": no Content-Length in the answer"));
  }
  return info;
}

absl::Status S3Client::DeleteObject(const std::string& bucket,
                                    const std::string& key) {
  Call call{"DeleteObject", "DELETE", bucket, key};
  absl::Status s = Run(call).status();
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

absl::StatusOr<S3Client::Level> S3Client::List(const std::string& bucket,
                                               const std::string& prefix,
                                               const std::string& delimiter,
                                               int page_size) {
  Level out;
  std::string token;
  for (;;) {
    Call call{"ListObjectsV2", "GET", bucket};
    call.shown = prefix;
    call.query = {{"list-type", "2"},
                  {"max-keys", absl::StrCat(page_size)},
                  {"prefix", prefix}};
    if (!delimiter.empty()) call.query.emplace_back("delimiter", delimiter);
    if (!token.empty()) call.query.emplace_back("continuation-token", token);
    ASSIGN_OR_RETURN(HttpResponse r, Run(call));
    pugi::xml_document doc;
    RETURN_IF_ERROR(ParseXml(r, call.What(), &doc));
    const pugi::xml_node result = doc.child("ListBucketResult");
    for (pugi::xml_node c : result.children("Contents")) {
      ObjectInfo& info = out.objects.emplace_back();
      info.key = Text(c, "Key");
      info.size = c.child("Size").text().as_ullong();
      info.etag = Text(c, "ETag");
    }
    for (pugi::xml_node p : result.children("CommonPrefixes")) {
      out.directories.push_back(Text(p, "Prefix"));
    }
    token = Text(result, "NextContinuationToken");
    if (!result.child("IsTruncated").text().as_bool() || token.empty()) break;
  }
  std::sort(
      out.objects.begin(), out.objects.end(),
      [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  return out;
}

absl::StatusOr<std::vector<ObjectInfo>> S3Client::ListObjects(
    const std::string& bucket, const std::string& prefix, int page_size) {
  ASSIGN_OR_RETURN(Level all, List(bucket, prefix, "", page_size));
  return std::move(all.objects);
}

absl::StatusOr<S3Client::Level> S3Client::ListLevel(const std::string& bucket,
                                                    const std::string& prefix) {
  ASSIGN_OR_RETURN(Level level, List(bucket, prefix, "/", 1000));
  for (ObjectInfo& o : level.objects) o.key = o.key.substr(prefix.size());
  for (std::string& d : level.directories) {
    d = d.substr(prefix.size());
    while (!d.empty() && d.back() == '/') d.pop_back();
  }
  std::sort(level.directories.begin(), level.directories.end());
  level.directories.erase(
      std::unique(level.directories.begin(), level.directories.end()),
      level.directories.end());
  return level;
}

absl::StatusOr<std::string> S3Client::CreateMultipartUpload(
    const std::string& bucket, const std::string& key) {
  Call call{"CreateMultipartUpload", "POST", bucket, key};
  call.query = {{"uploads", ""}};
  if (options_.checksums) {
    call.headers.emplace_back("x-amz-checksum-algorithm", "CRC32C");
  }
  call.sign_body = true;
  ASSIGN_OR_RETURN(HttpResponse r, Run(call));
  pugi::xml_document doc;
  RETURN_IF_ERROR(ParseXml(r, call.What(), &doc));
  std::string id = Text(doc.child("InitiateMultipartUploadResult"), "UploadId");
  if (id.empty()) {
    return absl::DataLossError(absl::StrCat(call.What(), ": no UploadId"));
  }
  return id;
}

absl::StatusOr<UploadedPart> S3Client::UploadPart(
    const std::string& bucket, const std::string& key,
    const std::string& upload_id, int number, absl::Span<const uint8_t> body) {
  Call call{absl::StrCat("UploadPart ", number), "PUT", bucket, key};
  call.query = {{"partNumber", absl::StrCat(number)}, {"uploadId", upload_id}};
  call.body = body;
  UploadedPart part;
  if (options_.checksums) {
    part.crc32c = Crc32cBase64(body);
    call.headers.emplace_back("x-amz-checksum-crc32c", part.crc32c);
  }
  ASSIGN_OR_RETURN(HttpResponse r, Run(call));
  part.etag = r.headers["etag"];
  if (part.etag.empty()) {
    return absl::DataLossError(absl::StrCat(call.What(), ": no ETag"));
  }
  return part;
}

absl::Status S3Client::CompleteMultipartUpload(
    const std::string& bucket, const std::string& key,
    const std::string& upload_id, const std::vector<UploadedPart>& parts) {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < parts.size(); ++i) {
    absl::StrAppend(&xml, "<Part><PartNumber>", i + 1, "</PartNumber><ETag>",
                    parts[i].etag, "</ETag>");
    if (!parts[i].crc32c.empty()) {
      absl::StrAppend(&xml, "<ChecksumCRC32C>", parts[i].crc32c,
                      "</ChecksumCRC32C>");
    }
    absl::StrAppend(&xml, "</Part>");
  }
  absl::StrAppend(&xml, "</CompleteMultipartUpload>");
  Call call{"CompleteMultipartUpload", "POST", bucket, key};
  call.query = {{"uploadId", upload_id}};
  call.body = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(xml.data()),
                                  xml.size());
  call.sign_body = true;
  ASSIGN_OR_RETURN(HttpResponse r, Run(call));
  // A 200 may still carry an error, sent once the parts were assembled.
  pugi::xml_document doc;
  if (doc.load_buffer(r.body.data(), r.body.size()) && doc.child("Error")) {
    r.status = 500;
    return S3Error(call.What(), r);
  }
  return absl::OkStatus();
}

absl::Status S3Client::AbortMultipartUpload(const std::string& bucket,
                                            const std::string& key,
                                            const std::string& upload_id) {
  Call call{"AbortMultipartUpload", "DELETE", bucket, key};
  call.query = {{"uploadId", upload_id}};
  absl::Status s = Run(call).status();
  return absl::IsNotFound(s) ? absl::OkStatus() : s;  // gone already
}

absl::StatusOr<std::vector<MultipartUpload>> S3Client::ListMultipartUploads(
    const std::string& bucket, const std::string& prefix) {
  std::vector<MultipartUpload> out;
  std::string key_marker, id_marker;
  for (;;) {
    Call call{"ListMultipartUploads", "GET", bucket};
    call.shown = prefix;
    call.query = {{"uploads", ""}, {"prefix", prefix}};
    if (!key_marker.empty()) {
      call.query.emplace_back("key-marker", key_marker);
      call.query.emplace_back("upload-id-marker", id_marker);
    }
    ASSIGN_OR_RETURN(HttpResponse r, Run(call));
    pugi::xml_document doc;
    RETURN_IF_ERROR(ParseXml(r, call.What(), &doc));
    const pugi::xml_node result = doc.child("ListMultipartUploadsResult");
    for (pugi::xml_node u : result.children("Upload")) {
      MultipartUpload& up = out.emplace_back();
      up.key = Text(u, "Key");
      up.upload_id = Text(u, "UploadId");
      std::string err;
      if (!absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ", Text(u, "Initiated"),
                           &up.initiated, &err)) {
        up.initiated = absl::InfinitePast();
      }
    }
    key_marker = Text(result, "NextKeyMarker");
    id_marker = Text(result, "NextUploadIdMarker");
    if (!result.child("IsTruncated").text().as_bool() || key_marker.empty()) {
      break;
    }
  }
  return out;
}

}  // namespace ckpt::io::s3
