#include "tests/test_util.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "gtest/gtest.h"

namespace ckpt::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string templ =
      std::string(base != nullptr ? base : "/tmp") + "/ckpt-test-XXXXXX";
  char* made = ::mkdtemp(templ.data());
  if (made == nullptr) {
    ADD_FAILURE() << "mkdtemp " << templ << " failed";
    return;
  }
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

uint64_t TestSeed() {
  uint64_t seed;
  if (const char* forced = std::getenv("CKPT_TEST_SEED")) {
    seed = std::strtoull(forced, nullptr, 10);
  } else {
    seed = std::random_device{}();
  }
  std::cout << "[ seed ] " << seed << " (replay with CKPT_TEST_SEED=" << seed
            << ")" << std::endl;
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  EXPECT_TRUE(out.good()) << "cannot write " << path;
}

io::AlignedBuffer Text(absl::string_view s) {
  io::AlignedBuffer b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

}  // namespace ckpt::testing
