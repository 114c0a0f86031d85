// EtcdCoordinator: connection, lease and keep-alive, fencing, transactions,
// membership and the key-value store. Votes and commit records are in
// etcd_coordinator_steps.cc.
#include "daemon/coord/etcd_coordinator.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "daemon/coord/etcd_ops.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/names.h"

namespace ckpt::daemon {

using etcd_ops::Compare;
using etcd_ops::CreatedNever;
using etcd_ops::EtcdError;
using etcd_ops::PrefixEnd;
using etcd_ops::PutOp;

absl::StatusOr<std::vector<std::string>> ParseEtcdUrl(absl::string_view url) {
  constexpr absl::string_view kScheme = "etcd://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator \"", url, "\" is not etcd://host:port[,host:port...]"));
  }
  std::vector<std::string> endpoints =
      absl::StrSplit(url.substr(kScheme.size()), ',', absl::SkipEmpty());
  if (endpoints.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator \"", url, "\" names no etcd endpoint"));
  }
  for (const std::string& e : endpoints) {
    std::pair<std::string, std::string> host_port = absl::StrSplit(e, ':');
    int port = 0;
    if (host_port.first.empty() || !absl::SimpleAtoi(host_port.second, &port) ||
        port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "coordinator \"", url, "\": \"", e, "\" is not host:port"));
    }
  }
  return endpoints;
}

namespace {

// The bytes of a credential file; the error names the file and what it is.
absl::StatusOr<std::string> ReadCredential(const std::string& file,
                                           absl::string_view what) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("etcd: cannot read the ", what, " ", file));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// The password of `file` (its first line): a file only its owner can read.
absl::StatusOr<std::string> ReadPassword(const std::string& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "etcd: the password file ", file, " is readable by other users (mode ",
        absl::StrFormat("%04o", st.st_mode & 0777), "): chmod 600 it"));
  }
  ASSIGN_OR_RETURN(std::string text, ReadCredential(file, "password file"));
  std::string password = text.substr(0, text.find('\n'));
  if (password.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd: the password file ", file, " is empty"));
  }
  return password;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> EtcdCredentials(
    const EtcdOptions& o) {
  if (o.ca_file.empty()) {
    if (!o.cert_file.empty() || !o.key_file.empty()) {
      return absl::InvalidArgumentError(
          "an etcd client certificate needs the CA of etcd's server "
          "certificate too (--etcd-ca)");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (o.cert_file.empty() != o.key_file.empty()) {
    return absl::InvalidArgumentError(
        "an etcd client certificate needs its key, and a key its certificate "
        "(--etcd-cert and --etcd-key)");
  }
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadCredential(o.ca_file, "CA file"));
  if (!o.cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                     ReadCredential(o.cert_file, "client certificate"));
    ASSIGN_OR_RETURN(ssl.pem_private_key,
                     ReadCredential(o.key_file, "client key"));
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

EtcdCoordinator::EtcdCoordinator(const EtcdOptions& options)
    : options_(options) {}

absl::StatusOr<std::unique_ptr<EtcdCoordinator>> EtcdCoordinator::Connect(
    const EtcdOptions& options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("no etcd endpoint given");
  }
  RETURN_IF_ERROR(snapshot::ValidateJobId(options.node_id));
  if (options.lease_ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError("the etcd lease TTL must be >= 1 s");
  }
  std::unique_ptr<EtcdCoordinator> c(new EtcdCoordinator(options));
  const std::string target =
      options.endpoints.size() == 1
          ? options.endpoints[0]
          : absl::StrCat("ipv4:", absl::StrJoin(options.endpoints, ","));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   EtcdCredentials(options));
  c->channel_ = grpc::CreateCustomChannel(target, credentials, args);
  c->kv_ = etcdserverpb::KV::NewStub(c->channel_);
  c->lease_stub_ = etcdserverpb::Lease::NewStub(c->channel_);
  c->watch_stub_ = etcdserverpb::Watch::NewStub(c->channel_);
  c->auth_stub_ = etcdserverpb::Auth::NewStub(c->channel_);
  RETURN_IF_ERROR(c->Authenticate());
  if (absl::Status s = c->Register(); !s.ok()) {
    if (options.user.empty() &&
        (absl::IsPermissionDenied(s) || absl::IsUnauthenticated(s) ||
         absl::StrContains(s.message(), "user name is empty"))) {
      return absl::PermissionDeniedError(absl::StrCat(
          s.message(), " (etcd at ", target,
          " requires authentication: give "
          "--etcd-user and --etcd-password-file, or a client certificate its "
          "auth knows: --etcd-cert and --etcd-key)"));
    }
    return s;
  }
  if (absl::Status s = c->ForgetDepartures(options.node_id); !s.ok()) {
    CKPT_LOG_WARN("ckptd: dropping node {}'s earlier departures: {}",
                  options.node_id, s.ToString());
  }
  c->keep_alive_ = std::thread([p = c.get()] { p->KeepAliveLoop(); });
  CKPT_LOG_INFO("ckptd: node {} joined etcd at {} (lease {:x}, TTL {} s)",
                options.node_id, target, c->lease_id(),
                absl::ToInt64Seconds(options.lease_ttl));
  return c;
}

EtcdCoordinator::~EtcdCoordinator() {
  int64_t lease;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    lease = lease_;
  }
  if (keep_alive_.joinable()) keep_alive_.join();
  if (lease != 0) {
    // Stopping is no loss: the departure is claimed before anyone counts it.
    absl::StatusOr<bool> claimed =
        ClaimDeparture(options_.node_id, lease, options_.node_id + " stopped");
    if (!claimed.ok()) {
      CKPT_LOG_WARN("ckptd: claiming node {}'s own departure: {}",
                    options_.node_id, claimed.status().ToString());
    }
    grpc::ClientContext context;
    Authorize(&context);
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(2));
    etcdserverpb::LeaseRevokeRequest req;
    req.set_id(lease);
    etcdserverpb::LeaseRevokeResponse resp;
    (void)lease_stub_->LeaseRevoke(&context, req, &resp);
  }
}

void EtcdCoordinator::PauseKeepAliveForTesting(bool paused) {
  absl::MutexLock lock(&mu_);
  paused_ = paused;
}

int64_t EtcdCoordinator::lease_id() const {
  absl::MutexLock lock(&mu_);
  return lease_;
}

absl::Status EtcdCoordinator::Authenticate() {
  if (options_.user.empty()) return absl::OkStatus();
  etcdserverpb::AuthenticateRequest req;
  req.set_name(options_.user);
  ASSIGN_OR_RETURN(*req.mutable_password(),
                   ReadPassword(options_.password_file));
  etcdserverpb::AuthenticateResponse resp;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  RETURN_IF_ERROR(EtcdError(
      auth_stub_->Authenticate(&context, req, &resp),
      absl::StrCat("authenticating to etcd as user \"", options_.user, "\"")));
  absl::MutexLock lock(&mu_);
  token_ = resp.token();
  token_at_ = absl::Now();
  return absl::OkStatus();
}

void EtcdCoordinator::RefreshToken() {
  {
    absl::MutexLock lock(&mu_);
    if (options_.user.empty() ||
        absl::Now() - token_at_ < options_.token_refresh) {
      return;
    }
  }
  absl::Status s = Authenticate();
  if (!s.ok())
    CKPT_LOG_WARN("ckptd: renewing the etcd token: {}", s.ToString());
}

absl::Status EtcdCoordinator::Checked(const grpc::Status& s,
                                      absl::string_view what) {
  absl::Status status = EtcdError(s, what);
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED &&
      !options_.user.empty() &&
      absl::StrContains(s.error_message(), "invalid auth token")) {
    // One renewal for the calls that failed together: a token taken after
    // this failure was seen serves them all.
    const absl::Time failed_at = absl::Now();
    absl::MutexLock renewing(&renew_mu_);
    bool renewed_since = false;
    {
      absl::MutexLock lock(&mu_);
      renewed_since = token_at_ >= failed_at;
    }
    if (!renewed_since) {
      if (absl::Status renewed = Authenticate(); !renewed.ok()) {
        CKPT_LOG_WARN("ckptd: renewing the etcd token etcd forgot: {}",
                      renewed.ToString());
      }
    }
  }
  return status;
}

void EtcdCoordinator::Authorize(grpc::ClientContext* context) const {
  absl::MutexLock lock(&mu_);
  if (!token_.empty()) context->AddMetadata("token", token_);
}

grpc::ClientContext* EtcdCoordinator::Prepare(
    grpc::ClientContext* context) const {
  Authorize(context);
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  return context;
}

absl::Status EtcdCoordinator::Register() {
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(absl::ToInt64Seconds(options_.lease_ttl));
  etcdserverpb::LeaseGrantResponse granted;
  grpc::ClientContext c1;
  RETURN_IF_ERROR(Checked(
      lease_stub_->LeaseGrant(Prepare(&c1), grant, &granted), "lease grant"));
  if (!granted.error().empty()) {
    return absl::UnavailableError("etcd lease grant: " + granted.error());
  }
  etcdserverpb::PutRequest put;
  put.set_key(MemberKey());
  put.set_value(MemberValue());
  put.set_lease(granted.id());
  etcdserverpb::PutResponse put_resp;
  grpc::ClientContext c2;
  RETURN_IF_ERROR(Checked(kv_->Put(Prepare(&c2), put, &put_resp),
                          "registering node " + options_.node_id));
  absl::MutexLock lock(&mu_);
  lease_ = granted.id();
  return absl::OkStatus();
}

void EtcdCoordinator::KeepAliveLoop() {
  const absl::Duration period =
      std::max(absl::Milliseconds(200), options_.lease_ttl / 3);
  auto stopping = [this] {
    absl::MutexLock lock(&mu_);
    return stopping_;
  };
  // Sleeps `d` unless the coordinator stops first; false when it stops.
  auto nap = [this](absl::Duration d) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
    return !stopping_;
  };
  auto paused = [this] {
    absl::MutexLock lock(&mu_);
    return paused_;
  };
  while (!stopping()) {
    if (paused()) {
      if (!nap(absl::Milliseconds(50))) return;
      continue;
    }
    int64_t lease = lease_id();
    if (lease == 0) {
      absl::Status s = Register();
      if (!s.ok()) {
        if (!nap(absl::Milliseconds(500))) return;
        continue;
      }
      rejoins_++;
      CKPT_LOG_WARN("ckptd: node {} rejoined with a new etcd lease {:x}",
                    options_.node_id, lease_id());
      continue;
    }
    RefreshToken();
    grpc::ClientContext context;
    Authorize(&context);
    auto stream = lease_stub_->LeaseKeepAlive(&context);
    while (true) {
      etcdserverpb::LeaseKeepAliveRequest req;
      req.set_id(lease);
      etcdserverpb::LeaseKeepAliveResponse resp;
      if (paused()) break;
      if (!stream->Write(req) || !stream->Read(&resp)) break;  // reconnect
      if (resp.ttl() <= 0) {
        // Expired while this process could not renew it (paused, or etcd
        // unreachable for longer than the TTL): fenced until it rejoins.
        absl::MutexLock lock(&mu_);
        if (lease_ == lease) lease_ = 0;
        CKPT_LOG_WARN("ckptd: node {} lost its etcd lease {:x}; fenced",
                      options_.node_id, lease);
        break;
      }
      if (!nap(period)) break;
      RefreshToken();
    }
    context.TryCancel();
    (void)Checked(stream->Finish(), "lease keep-alive");
    if (!nap(absl::Milliseconds(200))) return;
  }
}

Compare EtcdCoordinator::HoldsLease(int64_t lease) const {
  Compare c;
  c.set_key(MemberKey());
  c.set_target(Compare::LEASE);
  c.set_result(Compare::EQUAL);
  c.set_lease(lease);
  return c;
}

absl::Status EtcdCoordinator::FencedOr(int64_t lease, absl::Status other) {
  auto member = Range(MemberKey(), false);
  if (!member.ok()) return member.status();
  if (member->kvs_size() == 1 && member->kvs(0).lease() == lease) return other;
  {
    absl::MutexLock lock(&mu_);
    if (lease_ == lease) lease_ = 0;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "node ", options_.node_id,
      " is fenced: its etcd lease expired (paused past its TTL of ",
      absl::ToInt64Seconds(options_.lease_ttl),
      " s?); it neither commits nor collects until it has rejoined"));
}

absl::StatusOr<etcdserverpb::RangeResponse> EtcdCoordinator::Range(
    const std::string& key, bool prefix) {
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  if (prefix) req.set_range_end(PrefixEnd(key));
  etcdserverpb::RangeResponse resp;
  grpc::ClientContext context;
  RETURN_IF_ERROR(Checked(kv_->Range(Prepare(&context), req, &resp),
                          absl::StrCat("reading ", key)));
  return resp;
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdCoordinator::Txn(
    const etcdserverpb::TxnRequest& request, const std::string& what) {
  etcdserverpb::TxnResponse resp;
  grpc::ClientContext context;
  RETURN_IF_ERROR(Checked(kv_->Txn(Prepare(&context), request, &resp), what));
  return resp;
}

etcdserverpb::WatchResponse EtcdCoordinator::WaitForChange(
    const std::string& key, bool prefix, int64_t after_revision,
    absl::Duration timeout, bool prev_kv) {
  grpc::ClientContext context;
  Authorize(&context);
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  auto stream = watch_stub_->Watch(&context);
  etcdserverpb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key(key);
  if (prefix) create->set_range_end(PrefixEnd(key));
  create->set_start_revision(after_revision + 1);
  create->set_prev_kv(prev_kv);
  etcdserverpb::WatchResponse resp;
  if (stream->Write(req)) {
    while (stream->Read(&resp)) {
      if (!resp.events().empty() || resp.canceled()) break;
    }
  }
  context.TryCancel();
  (void)stream->Finish();
  return resp;
}

absl::Status EtcdCoordinator::WaitForVersionAfter(const std::string& topic,
                                                  uint64_t after,
                                                  absl::Duration timeout) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(topic));
  // Versions are created in order: the next one's key is the one to watch.
  const std::string key = VersionKey(topic, after + 1);
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r, Range(key, false));
  if (r.kvs_size() > 0) return absl::OkStatus();
  WaitForChange(key, false, r.header().revision(), timeout);
  return absl::OkStatus();
}

absl::StatusOr<absl::optional<std::string>> EtcdCoordinator::StoreGet(
    const std::string& key) {
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r, Range(key, false));
  if (r.kvs_size() == 0) return absl::optional<std::string>();
  return absl::optional<std::string>(r.kvs(0).value());
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
EtcdCoordinator::StoreScan(const std::string& prefix) {
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r, Range(prefix, true));
  std::vector<std::pair<std::string, std::string>> out;
  for (const etcdserverpb::KeyValue& kv : r.kvs()) {
    out.emplace_back(kv.key().substr(prefix.size()), kv.value());
  }
  return out;
}

absl::Status EtcdCoordinator::StorePut(const std::string& key,
                                       const std::string& value,
                                       bool ephemeral) {
  // Ephemeral keys live on this node's lease: a participant whose daemon
  // died leaves the rendezvous with it.
  const int64_t lease = lease_id();
  if (lease == 0) return FencedOr(lease, absl::OkStatus());
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = HoldsLease(lease);
  *txn.add_success() = PutOp(key, value);
  if (ephemeral)
    txn.mutable_success(0)->mutable_request_put()->set_lease(lease);
  ASSIGN_OR_RETURN(etcdserverpb::TxnResponse done,
                   Txn(txn, absl::StrCat("writing ", key)));
  if (done.succeeded()) return absl::OkStatus();
  return FencedOr(lease, absl::AbortedError("writing " + key + " raced"));
}

absl::Status EtcdCoordinator::StoreDelete(const std::string& key) {
  const int64_t lease = lease_id();
  if (lease == 0) return FencedOr(lease, absl::OkStatus());
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = HoldsLease(lease);
  txn.add_success()->mutable_request_delete_range()->set_key(key);
  ASSIGN_OR_RETURN(etcdserverpb::TxnResponse done,
                   Txn(txn, absl::StrCat("removing ", key)));
  if (done.succeeded()) return absl::OkStatus();
  return FencedOr(lease, absl::AbortedError("removing " + key + " raced"));
}

absl::StatusOr<bool> EtcdCoordinator::StoreCreate(const std::string& key,
                                                  const std::string& value) {
  const int64_t lease = lease_id();
  if (lease == 0) return FencedOr(lease, absl::OkStatus());
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = HoldsLease(lease);
  *txn.add_compare() = CreatedNever(key);
  *txn.add_success() = PutOp(key, value);
  ASSIGN_OR_RETURN(etcdserverpb::TxnResponse done,
                   Txn(txn, absl::StrCat("creating ", key)));
  if (done.succeeded()) return true;
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r, Range(key, false));
  if (r.kvs_size() == 1) return false;
  return FencedOr(lease, absl::AbortedError("creating " + key + " raced"));
}

}  // namespace ckpt::daemon
