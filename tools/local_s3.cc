#include "tools/local_s3.h"

#include <sys/random.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "tools/process.h"

namespace ckpt::tools {
namespace {

// A free loopback port whose port + 10000 (weed's gRPC port for it) is free
// as well.
int FreePortPair() {
  for (int i = 0; i < 100; ++i) {
    const int p = FreeLoopbackPort();
    if (p > 0 && p + 10000 < 65536 && !ListeningOnLoopback(p + 10000)) {
      return p;
    }
  }
  return FreeLoopbackPort();
}

std::string RandomHex(size_t bytes) {
  std::string hex;
  for (size_t i = 0; i < bytes; ++i) {
    unsigned char b = 0;
    if (::getrandom(&b, 1, 0) != 1) b = static_cast<unsigned char>(rand());
    char two[3];
    std::snprintf(two, sizeof(two), "%02x", b);
    hex += two;
  }
  return hex;
}

}  // namespace

std::string LocalS3::Binary() {
  std::error_code ec;
  if (const char* forced = std::getenv("CKPT_WEED");
      forced != nullptr && forced[0] != '\0') {
    return forced;
  }
#ifdef CKPT_WEED_BINARY
  if (std::filesystem::exists(CKPT_WEED_BINARY, ec)) return CKPT_WEED_BINARY;
#endif
  if (const char* path = std::getenv("PATH")) {
    std::string dirs = path;
    size_t at = 0;
    while (at <= dirs.size()) {
      const size_t end = std::min(dirs.find(':', at), dirs.size());
      const std::string candidate = dirs.substr(at, end - at) + "/weed";
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
      at = end + 1;
    }
  }
  return "";
}

LocalS3::LocalS3(std::string dir)
    : dir_(std::move(dir)),
      access_key_("ckpt" + RandomHex(8)),
      secret_key_(RandomHex(20)) {
  PickPorts();
}

void LocalS3::PickPorts() {
  std::set<int> taken;
  for (int* port : {&master_port_, &volume_port_, &filer_port_, &s3_port_}) {
    int p = FreePortPair();
    for (int i = 0;
         i < 100 && (taken.count(p) > 0 || taken.count(p + 10000) > 0); ++i) {
      p = FreePortPair();
    }
    *port = p;
    taken.insert(p);
    taken.insert(p + 10000);
  }
}

LocalS3::~LocalS3() { Kill(); }

std::string LocalS3::endpoint() const {
  return "http://127.0.0.1:" + std::to_string(s3_port_);
}

bool LocalS3::Start() {
  if (pid_ > 0) return true;
  for (int attempt = 1;; ++attempt) {
    if (StartOnce()) {
      came_up_ = true;
      return true;
    }
    if (came_up_ || attempt == 3 || Binary().empty()) return false;
    std::fprintf(stderr,
                 "local_s3: weed did not start (see %s); trying other ports\n",
                 log_path().c_str());
    std::error_code ec;
    std::filesystem::rename(log_path(),
                            log_path() + "." + std::to_string(attempt), ec);
    PickPorts();
  }
}

bool LocalS3::StartOnce() {
  const std::string binary = Binary();
  if (binary.empty()) return false;
  std::error_code ec;
  std::filesystem::create_directories(dir_ + "/data", ec);
  const std::string config = dir_ + "/s3.json";
  {
    std::ofstream out(config);
    out << R"({"identities":[{"name":"ckpt","credentials":[{"accessKey":")"
        << access_key_ << R"(","secretKey":")" << secret_key_
        << R"("}],"actions":["Admin","Read","Write","List","Tagging"]}]})";
    if (!out) return false;
  }
  auto port = [](const char* flag, int p) {
    return std::string(flag) + "=" + std::to_string(p);
  };
  const std::vector<std::string> args = {binary,
                                         "server",
                                         "-dir=" + dir_ + "/data",
                                         "-ip=127.0.0.1",
                                         "-ip.bind=127.0.0.1",
                                         port("-master.port", master_port_),
                                         port("-volume.port", volume_port_),
                                         port("-filer.port", filer_port_),
                                         "-s3",
                                         port("-s3.port", s3_port_),
                                         "-s3.port.iceberg=0",
                                         "-s3.port.lance=0",
                                         "-s3.config=" + config,
                                         "-volume.max=200",
                                         "-master.volumeSizeLimitMB=256"};
  pid_ = Spawn(args, log_path());
  if (pid_ <= 0) return false;
  // Every part up (S3 answers 500 until its filer's gRPC port is).
  const bool up = AwaitChild(
      &pid_,
      [this] {
        return ListeningOnLoopback(s3_port_) &&
               ListeningOnLoopback(filer_port_) &&
               ListeningOnLoopback(filer_port_ + 10000) &&
               ListeningOnLoopback(volume_port_) &&
               ListeningOnLoopback(master_port_);
      },
      2400);
  if (!up) Kill();
  return up;
}

void LocalS3::Kill() { KillChild(&pid_); }

}  // namespace ckpt::tools
