// The peer service's side of mutual TLS: the server's credentials, made from
// the CA that signed every node's certificate and this node's certificate and
// key, and the names a caller's verified certificate gives (what
// PeerAuthorization checks).
//
// Thread-safety: free functions.
#ifndef CKPT_DAEMON_SERVER_PEER_TLS_H_
#define CKPT_DAEMON_SERVER_PEER_TLS_H_

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::daemon {

// Server credentials that require and verify a client certificate signed by
// the CA in `ca_file`; each file is read here and a missing one is named.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PeerServerCredentials(
    const std::string& ca_file, const std::string& cert_file,
    const std::string& key_file);

// The names a TLS caller's certificate gives: its subject alternative names,
// then its common name. Empty for a caller without one.
std::vector<std::string> CertificateNames(const grpc::ServerContext& ctx);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVER_PEER_TLS_H_
