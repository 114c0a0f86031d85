#include "tools/bench_training_state.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "nlohmann/json.hpp"

namespace ckpt::bench {

[[noreturn]] void Die(const std::string& what) {
  std::cerr << "ckpt-bench codec: " << what << "\n";
  std::exit(1);
}

std::vector<Snapshot> LoadRun(const std::string& dir, const std::string& run,
                              const std::string& skip) {
  std::ifstream in(dir + "/index.json");
  if (!in) {
    Die(dir +
        "/index.json is missing: make the data with "
        "build/torch-venv/bin/python tools/gen_training_state.py --out " +
        dir);
  }
  nlohmann::json index = nlohmann::json::parse(in);
  if (!index["runs"].contains(run)) Die("index.json has no run " + run);
  std::vector<Snapshot> out;
  for (const nlohmann::json& s : index["runs"][run]) {
    Snapshot snap;
    snap.step = s["step"].get<uint64_t>();
    const std::string path = dir + "/" + s["file"].get<std::string>();
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) Die("cannot read " + path);
    const size_t size = static_cast<size_t>(f.tellg());
    snap.bytes = io::AlignedBuffer(io::AlignUp(std::max<size_t>(size, 1)));
    f.seekg(0);
    f.read(reinterpret_cast<char*>(snap.bytes.data()),
           static_cast<std::streamsize>(size));
    for (const nlohmann::json& t : s["tensors"]) {
      const std::string name = t["name"].get<std::string>();
      if (!skip.empty() && name.rfind(skip, 0) == 0) continue;
      const std::string dtype = t["dtype"].get<std::string>();
      const uint64_t offset = t["offset"].get<uint64_t>();
      const uint64_t bytes = t["bytes"].get<uint64_t>();
      if (offset + bytes > size) Die(path + ": tensor " + name + " overflows");
      snap.tensors.push_back(
          {name,
           dtype == "bfloat16" ? proto::DTYPE_BFLOAT16 : proto::DTYPE_FLOAT32,
           t["shape"].get<std::vector<int64_t>>(),
           snap.bytes.span().subspan(offset, bytes)});
    }
    out.push_back(std::move(snap));
  }
  if (out.empty()) Die("run " + run + " has no snapshots");
  return out;
}

}  // namespace ckpt::bench
