// A safetensors reader for the tests, written from the format's
// specification, independent of the exporter (tools/safetensors.h).
#ifndef CKPT_TESTS_TOOLS_SAFETENSORS_FILE_H_
#define CKPT_TESTS_TOOLS_SAFETENSORS_FILE_H_

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ckpt::testing {

// A safetensors reader written from the specification: 8-byte little-endian
// header size N, N bytes of JSON, then the data; every tensor's data_offsets
// are relative to the data, in bounds, and the data is fully covered.
struct SafetensorsFile {
  nlohmann::json header;
  std::string data;
  static SafetensorsFile Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), {});
    SafetensorsFile f;
    EXPECT_GE(all.size(), 8u);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i)
      n = (n << 8) | static_cast<uint8_t>(all[static_cast<size_t>(i)]);
    EXPECT_LE(8 + n, all.size());
    EXPECT_EQ((8 + n) % 8, 0u) << "data should start 8-aligned";
    f.header = nlohmann::json::parse(all.substr(8, n));
    f.data = all.substr(8 + n);
    uint64_t covered = 0;
    for (auto& [name, t] : f.header.items()) {
      if (name == "__metadata__") continue;
      uint64_t b = t["data_offsets"][0], e = t["data_offsets"][1];
      EXPECT_LE(b, e) << name;
      EXPECT_LE(e, f.data.size()) << name;
      covered += e - b;
    }
    EXPECT_EQ(covered, f.data.size()) << "every data byte belongs to a tensor";
    return f;
  }
  std::string Bytes(const std::string& name) const {
    const nlohmann::json& t = header.at(name);
    uint64_t b = t["data_offsets"][0], e = t["data_offsets"][1];
    return data.substr(b, e - b);
  }
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TOOLS_SAFETENSORS_FILE_H_
