// Mutual TLS between ckptd processes in the tests: a CA and its nodes'
// certificates made by the shipped tools/ckpt-certs, the flags and client
// credentials that use them, and a node's peer address from its log.
#ifndef CKPT_TESTS_CLIENT_PEER_TLS_H_
#define CKPT_TESTS_CLIENT_PEER_TLS_H_

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/test_util.h"

namespace ckpt::client {

// A CA and its nodes' certificates, made by the shipped tools/ckpt-certs:
// each names its node id (and 127.0.0.1).
struct Pki {
  testing::TempDir dir;
  // Makes CA `ca` (a directory of its own) and certificates for `nodes`.
  bool Make(const std::string& ca, const std::vector<std::string>& nodes) {
    std::string cmd =
        absl::StrCat(CKPT_CERTS_TOOL, " ca ", dir.File(ca), " >/dev/null");
    for (const std::string& node : nodes) {
      absl::StrAppend(&cmd, " && ", CKPT_CERTS_TOOL, " node ", dir.File(ca),
                      " ", node, " 127.0.0.1 >/dev/null");
    }
    return std::system(cmd.c_str()) == 0;
  }
  std::string File(const std::string& ca, const std::string& f) const {
    return dir.File(ca + "/" + f);
  }
  std::vector<std::string> Args(const std::string& ca,
                                const std::string& node) const {
    return {"--peer-tls-ca",   File(ca, "ca.pem"),
            "--peer-tls-cert", File(ca, node + ".pem"),
            "--peer-tls-key",  File(ca, node + ".key")};
  }
  grpc::SslCredentialsOptions Client(const std::string& ca,
                                     const std::string& node) const {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = testing::ReadAll(File(ca, "ca.pem"));
    o.pem_cert_chain = testing::ReadAll(File(ca, node + ".pem"));
    o.pem_private_key = testing::ReadAll(File(ca, node + ".key"));
    return o;
  }
};

// The port node `log` said its peer service listens on.
inline std::string PeerAddress(const std::string& log) {
  const std::string mark = "peer service on ";
  const size_t at = log.find(mark);
  if (at == std::string::npos) return "";
  const size_t end = log.find_first_of(" \n", at + mark.size());
  return log.substr(at + mark.size(), end - at - mark.size());
}

// A channel to a node's peer service whose certificate must name `node`.
inline std::shared_ptr<grpc::Channel> TlsChannel(
    const std::string& address, const grpc::SslCredentialsOptions& o,
    const std::string& node) {
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(node);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(o), args);
}

}  // namespace ckpt::client

#endif  // CKPT_TESTS_CLIENT_PEER_TLS_H_
