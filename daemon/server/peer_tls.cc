#include "daemon/server/peer_tls.h"

#include <grpcpp/grpcpp.h>

#include "daemon/peer/replicator.h"
#include "io/status_macros.h"

namespace ckpt::daemon {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PeerServerCredentials(
    const std::string& ca_file, const std::string& cert_file,
    const std::string& key_file) {
  grpc::SslServerCredentialsOptions o(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ASSIGN_OR_RETURN(o.pem_root_certs, ReadPeerTlsFile(ca_file));
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.private_key, ReadPeerTlsFile(key_file));
  ASSIGN_OR_RETURN(pair.cert_chain, ReadPeerTlsFile(cert_file));
  o.pem_key_cert_pairs.push_back(pair);
  return grpc::SslServerCredentials(o);
}

std::vector<std::string> CertificateNames(const grpc::ServerContext& ctx) {
  std::vector<std::string> names;
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr) return names;
  for (const char* property :
       {GRPC_X509_SAN_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME}) {
    for (const grpc::string_ref& v : auth->FindPropertyValues(property)) {
      names.emplace_back(v.data(), v.size());
    }
  }
  return names;
}

}  // namespace ckpt::daemon
