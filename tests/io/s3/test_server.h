// The S3 server of an S3 test binary: one SeaweedFS on loopback
// (tools/local_s3.h), started before the first test and killed after the
// last, and a client's options that reach it with its credentials.
#ifndef CKPT_TESTS_IO_S3_TEST_SERVER_H_
#define CKPT_TESTS_IO_S3_TEST_SERVER_H_

#include "io/s3/s3_client.h"
#include "tools/local_s3.h"

namespace ckpt::io::s3 {

tools::LocalS3& TestServer();
S3Options TestOptions();

}  // namespace ckpt::io::s3

#endif  // CKPT_TESTS_IO_S3_TEST_SERVER_H_
