#include "io/s3/http_transport.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace ckpt::io::s3 {
namespace {

// One exchange's state, as libcurl's callbacks see it.
struct Transfer {
  CURL* curl = nullptr;
  const HttpExchange* exchange = nullptr;
  HttpResponse* response = nullptr;
  size_t sent = 0;
  uint64_t landed = 0;
  bool overflow = false;
};

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t len = size * n;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  const absl::Span<uint8_t> into = t->exchange->into;
  if (!into.empty() && status / 100 == 2) {
    if (len > into.size() - t->landed) {
      t->overflow = true;
      return 0;  // aborts the transfer
    }
    std::memcpy(into.data() + t->landed, data, len);
    t->landed += len;
    return len;
  }
  t->response->body.append(data, len);
  return len;
}

size_t OnUpload(char* buffer, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const absl::Span<const uint8_t> body = t->exchange->body;
  const size_t len = std::min(size * n, body.size() - t->sent);
  std::memcpy(buffer, body.data() + t->sent, len);
  t->sent += len;
  return len;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  absl::string_view line(data, size * n);
  if (absl::StartsWith(line, "HTTP/")) {
    t->response->headers.clear();  // a new response (after 100 Continue)
    return size * n;
  }
  const size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    t->response->headers[absl::AsciiStrToLower(line.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return size * n;
}

// libcurl's error space, converted here only.
absl::Status CurlError(CURLcode code, const char* detail,
                       const std::string& what) {
  std::string message = absl::StrCat(what, ": ", curl_easy_strerror(code));
  if (detail[0] != '\0') absl::StrAppend(&message, " (", detail, ")");
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

struct SlistFree {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

}  // namespace

HttpTransport::HttpTransport(HttpTimeouts timeouts) : timeouts_(timeouts) {
  static const CURLcode initialized = curl_global_init(CURL_GLOBAL_DEFAULT);
  (void)initialized;
}

HttpTransport::~HttpTransport() {
  absl::MutexLock lock(&mu_);
  for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* HttpTransport::TakeHandle() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      void* h = idle_.back();
      idle_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void HttpTransport::GiveBack(void* handle) {
  absl::MutexLock lock(&mu_);
  idle_.push_back(handle);
}

absl::StatusOr<HttpResponse> HttpTransport::Send(const HttpExchange& exchange,
                                                 const std::string& what) {
  CURL* curl = static_cast<CURL*>(TakeHandle());
  if (curl == nullptr) return absl::InternalError(what + ": curl_easy_init");
  curl_easy_reset(curl);  // keeps the connections open
  HttpResponse response;
  Transfer t{curl, &exchange, &response};
  std::unique_ptr<curl_slist, SlistFree> headers;
  for (const auto& [name, value] : exchange.headers) {
    headers.reset(curl_slist_append(headers.release(),
                                    absl::StrCat(name, ": ", value).c_str()));
  }
  // No 100-continue round trip before a body.
  headers.reset(curl_slist_append(headers.release(), "Expect:"));
  char detail[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_URL, exchange.url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, detail);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(
      curl, CURLOPT_CONNECTTIMEOUT_MS,
      static_cast<long>(absl::ToInt64Milliseconds(timeouts_.connect)));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, timeouts_.low_speed_bytes);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                   static_cast<long>(absl::ToInt64Seconds(timeouts_.stall)));
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 512L << 10);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  if (exchange.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (exchange.method == "PUT" || exchange.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_UPLOAD_BUFFERSIZE, 2L << 20);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE,
                     static_cast<curl_off_t>(exchange.body.size()));
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, OnUpload);
    curl_easy_setopt(curl, CURLOPT_READDATA, &t);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, exchange.method.c_str());
  } else if (exchange.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, exchange.method.c_str());
  }
  const CURLcode code = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  if (code != CURLE_OK) {
    // A handle whose exchange failed is not reused.
    curl_easy_cleanup(curl);
    if (t.overflow) {
      return absl::DataLossError(absl::StrCat(what, ": more than the ",
                                              exchange.into.size(),
                                              " bytes asked for arrived"));
    }
    return CurlError(code, detail, what);
  }
  GiveBack(curl);
  response.landed = t.landed;
  return response;
}

}  // namespace ckpt::io::s3
