#include "tests/io/s3/test_server.h"

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::io::s3 {
namespace {

tools::LocalS3* server = nullptr;

class S3ServerEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    server = new tools::LocalS3(dir_.path());
    ASSERT_TRUE(server->Start())
        << "SeaweedFS did not start (binary \"" << tools::LocalS3::Binary()
        << "\"; tools/torch-venv.sh installs it): "
        << testing::ReadAll(server->log_path());
  }
  void TearDown() override {
    delete server;
    server = nullptr;
  }

 private:
  testing::TempDir dir_;
};
const ::testing::Environment* const kServer =
    ::testing::AddGlobalTestEnvironment(new S3ServerEnvironment);

}  // namespace

tools::LocalS3& TestServer() { return *server; }

S3Options TestOptions() {
  S3Options o;
  o.endpoint = server->endpoint();
  o.credentials = {server->access_key(), server->secret_key()};
  return o;
}

}  // namespace ckpt::io::s3
