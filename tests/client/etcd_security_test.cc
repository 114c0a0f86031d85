// ckptd and etcd with TLS and auth, as real processes: etcd serving https with
// auth on refuses a ckptd without credentials and one with a wrong password,
// each with an error that says what is wrong; with the right password (or a
// client certificate etcd's auth knows) ckptd joins and commits; an etcd
// endpoint off loopback is never reached in plaintext unless the operator
// says so.
#include <sys/stat.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/daemon_process.h"
#include "tests/client/peer_ranks.h"
#include "tests/daemon/etcd_process.h"
#include "tests/test_util.h"

namespace ckpt::client {
namespace {

using ::testing::HasSubstr;

// A CA, etcd's server certificate (127.0.0.1) and a client certificate whose
// common name is `client`, made by the shipped tools/ckpt-certs.
struct EtcdPki {
  testing::TempDir dir;
  bool Make(const std::string& client) {
    const std::string cmd = absl::StrCat(
        CKPT_CERTS_TOOL, " ca ", dir.path(), " >/dev/null && ", CKPT_CERTS_TOOL,
        " node ", dir.path(), " etcd 127.0.0.1 >/dev/null && ", CKPT_CERTS_TOOL,
        " node ", dir.path(), " ", client, " >/dev/null");
    return std::system(cmd.c_str()) == 0;
  }
  std::string File(const std::string& f) const { return dir.File(f); }
};

std::vector<std::string> Coordinator(const testing::EtcdProcess& etcd,
                                     std::vector<std::string> more) {
  std::vector<std::string> args = {"--coordinator", "etcd://" + etcd.endpoint(),
                                   "--node-id",     "node-a",
                                   "--lease-ttl",   "2"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST(EtcdSecurityTest, PasswordAuthOverTls) {
  EtcdPki pki;
  ASSERT_TRUE(pki.Make("ckpt")) << "tools/ckpt-certs failed";
  testing::EtcdProcess etcd(
      {.cert_file = pki.File("etcd.pem"), .key_file = pki.File("etcd.key")});
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  ASSERT_TRUE(
      etcd.EnableAuth("--cacert " + pki.File("ca.pem"), "ckpt", "s3cret"))
      << etcd.log();
  const std::string good = pki.File("password");
  testing::WriteAll(good, "s3cret\n");
  ::chmod(good.c_str(), 0600);
  const std::string bad = pki.File("wrong");
  testing::WriteAll(bad, "guess\n");
  ::chmod(bad.c_str(), 0600);
  const std::vector<std::string> tls = {"--etcd-ca", pki.File("ca.pem")};

  // No credentials: refused by etcd's auth, and ckptd says what to give.
  testing::DaemonProcess anonymous(Coordinator(etcd, tls));
  EXPECT_FALSE(anonymous.Start());
  EXPECT_THAT(anonymous.log(), HasSubstr("requires authentication"));
  EXPECT_THAT(anonymous.log(), HasSubstr("--etcd-user"));
  // A wrong password.
  std::vector<std::string> wrong = tls;
  wrong.insert(wrong.end(),
               {"--etcd-user", "ckpt", "--etcd-password-file", bad});
  testing::DaemonProcess guessing(Coordinator(etcd, wrong));
  EXPECT_FALSE(guessing.Start());
  EXPECT_THAT(guessing.log(),
              HasSubstr("authenticating to etcd as user \"ckpt\": etcd: "
                        "etcdserver: authentication failed, invalid user ID "
                        "or password"));
  // A password file others may read is refused before it is used.
  ::chmod(good.c_str(), 0644);
  std::vector<std::string> right = tls;
  right.insert(right.end(),
               {"--etcd-user", "ckpt", "--etcd-password-file", good});
  testing::DaemonProcess careless(Coordinator(etcd, right));
  EXPECT_FALSE(careless.Start());
  EXPECT_THAT(careless.log(), HasSubstr("is readable by other users (mode "
                                        "0644): chmod 600 it"));
  ::chmod(good.c_str(), 0600);
  // The right password over TLS: ckptd joins, and a save commits through
  // its votes in etcd.
  testing::DaemonProcess a(Coordinator(etcd, right));
  ASSERT_TRUE(a.Start()) << a.log();
  Rank r(a.socket(), "secure", 0, 1, 1 << 12);
  ASSERT_TRUE(r.ckpt);
  absl::Status saved = SaveAll({&r}, 1, proto::TIER_LOCAL_DISK);
  ASSERT_TRUE(saved.ok()) << saved << "\n" << a.log();
  EXPECT_THAT(a.log(), HasSubstr("joined etcd"));
}

TEST(EtcdSecurityTest, ClientCertificateAuth) {
  EtcdPki pki;
  ASSERT_TRUE(pki.Make("ckpt")) << "tools/ckpt-certs failed";
  testing::EtcdProcess etcd({.cert_file = pki.File("etcd.pem"),
                             .key_file = pki.File("etcd.key"),
                             .client_ca_file = pki.File("ca.pem")});
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  // etcdctl itself needs a certificate now: root's (etcd's auth takes a
  // certificate's common name as the user).
  const std::string root_cert = absl::StrCat(
      CKPT_CERTS_TOOL, " node ", pki.dir.path(), " root >/dev/null");
  ASSERT_EQ(std::system(root_cert.c_str()), 0);
  ASSERT_TRUE(etcd.EnableAuth(
      absl::StrCat("--cacert ", pki.File("ca.pem"), " --cert ",
                   pki.File("root.pem"), " --key ", pki.File("root.key")),
      "ckpt", "unused"))
      << etcd.log();
  // Without a client certificate etcd refuses the handshake.
  testing::DaemonProcess anonymous(
      Coordinator(etcd, {"--etcd-ca", pki.File("ca.pem")}));
  EXPECT_FALSE(anonymous.Start());
  // With one, etcd's auth lets it in as its common name: user ckpt.
  testing::DaemonProcess a(Coordinator(
      etcd, {"--etcd-ca", pki.File("ca.pem"), "--etcd-cert",
             pki.File("ckpt.pem"), "--etcd-key", pki.File("ckpt.key")}));
  ASSERT_TRUE(a.Start()) << a.log();
  Rank r(a.socket(), "cert", 0, 1, 1 << 12);
  ASSERT_TRUE(r.ckpt);
  absl::Status saved = SaveAll({&r}, 1, proto::TIER_LOCAL_DISK);
  ASSERT_TRUE(saved.ok()) << saved << "\n" << a.log();
}

TEST(EtcdSecurityTest, AnEtcdOffLoopbackIsNeverReachedInPlaintext) {
  // TEST-NET-1: nothing is dialed; the flags are refused first.
  testing::DaemonProcess open(
      {"--coordinator", "etcd://192.0.2.1:2379", "--node-id", "node-a"});
  EXPECT_FALSE(open.Start());
  EXPECT_THAT(open.log(), HasSubstr("etcd at 192.0.2.1:2379 would be reached "
                                    "without TLS"));
  EXPECT_THAT(open.log(), HasSubstr("--etcd-insecure"));
  testing::DaemonProcess password({"--coordinator", "etcd://192.0.2.1:2379",
                                   "--node-id", "node-a", "--etcd-user", "ckpt",
                                   "--etcd-password-file", "/nonexistent"});
  EXPECT_FALSE(password.Start());
  EXPECT_THAT(password.log(),
              HasSubstr("would send the password in plaintext"));
}

}  // namespace
}  // namespace ckpt::client
