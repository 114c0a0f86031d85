// `ckpt-bench publish`: a committed step's weights (bf16, --mib MiB) published
// to subscriber ckptds on this machine (issue #37), each daemon's sends capped
// at --rate-mib MiB/s so that each link, not the two cores, is the limit, as on
// a real network. Measured, from the publish call's return to the last
// subscriber holding the version (every file verified):
//   fanout_n8_vs_n1: reaching 8 subscribers (a chain) over reaching 1;
//   vs_star_n8: over the source sending to all 8 itself (--fanout-degree 8),
//     at the same cap;
//   vs_gloo_broadcast_n4: uncapped, 4 subscribers, over
//     torch.distributed.broadcast of the same bytes with gloo among 5
//     processes (tools/bench_publish.py), in the same run;
//   load_into_vs_memcpy: ckpt.torch.Subscriber.load_into of the local copy
//     into a module over a copy of the same bytes between tensors (speed).
// Each reach is the median of --runs versions.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/daemon_admin.h"
#include "client/subscriber.h"
#include "io/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/bench_cluster.h"
#include "tools/bench_stats.h"
#include "tools/ckpt_bench.h"
#include "tools/metrics_text.h"
#include "tools/process.h"

using ckpt::tools::Median;

namespace ckpt::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Setup {
  std::string dir;
  uint64_t bytes = 0;
  std::string rate;  // --peer-send-rate; empty: uncapped
  int degree = 1;
  int subscribers = 8;
  int runs = 3;
};

// Saves step 1 of a bf16 tensor "model/w" of `bytes` on the source.
absl::Status SaveWeights(const BenchNode& source, uint64_t bytes) {
  std::vector<uint16_t> w(bytes / 2);
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = static_cast<uint16_t>(0x3c00 + (i * 2654435761u >> 20) % 0x300);
  }
  ASSIGN_OR_RETURN(auto trainer, client::Checkpointer::Connect(
                                     {"weights", 0, 1, source.socket()}));
  RETURN_IF_ERROR(trainer->RegisterTensor(
      "model/w", proto::DTYPE_BFLOAT16, w.data(),
      {static_cast<int64_t>(w.size())}, {0}, {static_cast<int64_t>(w.size())}));
  ASSIGN_OR_RETURN(auto save, trainer->SaveAsync(1));
  return save->WaitCommitted(proto::TIER_LOCAL_DISK, absl::Seconds(600));
}

// Subscribes `subscribers` to `topic` and waits until the source lists them.
absl::Status Subscribe(const BenchNode& source,
                       std::vector<BenchNode*> subscribers,
                       const std::string& topic) {
  for (BenchNode* n : subscribers) {
    RETURN_IF_ERROR(client::Subscribe(n->socket(), topic).status());
  }
  for (int i = 0; i < 600; ++i) {
    ASSIGN_OR_RETURN(proto::ListTopicsResponse topics,
                     client::ListTopics(source.socket()));
    for (const proto::TopicSummary& t : topics.topics()) {
      if (t.topic() == topic &&
          t.subscribers_size() >= static_cast<int>(subscribers.size())) {
        return absl::OkStatus();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the subscribers of ", topic, " did not record themselves"));
}

// Publishes step 1 as the next version of `topic`; seconds from the call's
// return until every subscriber holds it.
absl::StatusOr<double> Reach(const BenchNode& source,
                             const std::vector<BenchNode*>& subscribers,
                             const std::string& topic, uint64_t after) {
  proto::PublishRequest request;
  request.set_job("weights");
  request.set_step(1);
  request.set_topic(topic);
  ASSIGN_OR_RETURN(proto::VersionRecord version,
                   client::Publish(source.socket(), request));
  const Clock::time_point published = Clock::now();
  std::vector<absl::Status> results(subscribers.size());
  std::vector<std::thread> waits;
  for (size_t i = 0; i < subscribers.size(); ++i) {
    waits.emplace_back([&, i] {
      auto sub = client::Subscriber::Connect(subscribers[i]->socket(), topic);
      results[i] =
          sub.ok() ? (*sub)->WaitForVersion(after, absl::Seconds(600)).status()
                   : sub.status();
    });
  }
  for (std::thread& t : waits) t.join();
  const double seconds =
      std::chrono::duration<double>(Clock::now() - published).count();
  for (const absl::Status& s : results) RETURN_IF_ERROR(s);
  (void)version;
  return seconds;
}

// MiB of versions `node` was asked to send (its share of the fan-out).
double ServedMib(const BenchNode& node) {
  absl::StatusOr<std::string> text = client::GetMetricsText(node.socket());
  if (!text.ok()) return -1;
  return tools::SumOf(tools::ParseMetricsText(*text),
                      "ckpt_version_bytes_served_total", {})
             .value_or(0) /
         (1 << 20);
}

// A cluster of a source and `setup.subscribers` subscribers; for each count
// in `counts`, the median reach of `setup.runs` versions of a topic of its
// own, subscribed to by the first `count` subscribers.
// The last figure: the MiB the source was asked to send in all.
absl::StatusOr<std::vector<double>> Measure(
    const Setup& setup, const std::string& name, const std::vector<int>& counts,
    const std::function<absl::Status(const BenchNode&)>& after) {
  std::vector<std::string> args = {
      "--fanout-degree", std::to_string(setup.degree), "--memory-budget",
      absl::StrCat(setup.bytes * 3 / (1 << 20) + 256, "M"), "--keep-versions",
      "1",
      // Every topic's newest version stays: room for all of them.
      "--publish-budget",
      absl::StrCat(setup.bytes * 16 / (1 << 20) + 256, "M")};
  if (!setup.rate.empty()) {
    args.insert(args.end(), {"--peer-send-rate", setup.rate});
  }
  std::vector<BenchCluster::Spec> specs = {{"node-src", args}};
  for (int i = 1; i <= setup.subscribers; ++i) {
    specs.push_back({absl::StrCat("sub-", i), args});
  }
  BenchCluster cluster(setup.dir + "/" + name, name, specs);
  if (!cluster.error().empty()) return absl::UnavailableError(cluster.error());
  std::vector<BenchNode>& nodes = cluster.nodes();
  RETURN_IF_ERROR(SaveWeights(nodes[0], setup.bytes));
  std::vector<double> reach;
  for (int count : counts) {
    const std::string topic = absl::StrCat(name, "-n", count);
    std::vector<BenchNode*> subscribers;
    for (int i = 1; i <= count; ++i) subscribers.push_back(&nodes[i]);
    RETURN_IF_ERROR(Subscribe(nodes[0], subscribers, topic));
    std::vector<double> runs;
    for (int run = 0; run < setup.runs; ++run) {
      ASSIGN_OR_RETURN(double s, Reach(nodes[0], subscribers, topic, run));
      runs.push_back(s);
    }
    reach.push_back(Median(runs));
  }
  if (after) RETURN_IF_ERROR(after(nodes[0]));
  // The source's share of the fan-out last.
  reach.push_back(ServedMib(nodes[0]));
  return reach;
}

// tools/bench_publish.py's JSON object: gloo's broadcast and load_into.
absl::StatusOr<nlohmann::json> RunPython(const std::vector<std::string>& args) {
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  const std::string python_dir =
      (self.parent_path() / "../python").lexically_normal().string();
  const std::string venv =
      (self.parent_path() / "../torch-venv/bin/python").lexically_normal();
  const std::string python =
      ::access(venv.c_str(), X_OK) == 0 ? venv : CKPT_PYTHON;
  const std::string out =
      absl::StrCat("/tmp/ckpt-bench-publish-", ::getpid(), ".json");
  std::vector<std::string> argv = {python, python_dir + "/bench_publish.py",
                                   "--out", out};
  argv.insert(argv.end(), args.begin(), args.end());
  ::setenv("PYTHONPATH", python_dir.c_str(), 1);
  pid_t pid = tools::Spawn(argv, out + ".log");
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::ifstream in(out);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !in.good()) {
    return absl::InternalError(
        absl::StrCat("tools/bench_publish.py failed; see ", out, ".log"));
  }
  nlohmann::json result = nlohmann::json::parse(in);
  std::filesystem::remove(out);
  return result;
}

}  // namespace

int RunPublish(const std::string& dir, uint64_t mib, uint64_t rate_mib,
               int runs, bool json) {
  Setup capped{dir, mib << 20, absl::StrCat(rate_mib, "M"), 1, 8, runs};
  nlohmann::json python;
  auto chain = Measure(capped, "chain", {1, 2, 4, 8}, nullptr);
  Setup star = capped;
  star.degree = 8;
  auto star_n8 =
      chain.ok() ? Measure(star, "star", {8}, nullptr) : chain.status();
  Setup uncapped = capped;
  uncapped.rate.clear();
  uncapped.subscribers = 4;
  absl::Status py_status;
  auto free_n4 =
      star_n8.ok()
          ? Measure(uncapped, "free", {4},
                    [&](const BenchNode& source) {
                      auto r = RunPython(
                          {"--socket", source.socket(), "--topic", "free-n4",
                           "--bytes", std::to_string(capped.bytes), "--world",
                           "5", "--runs", std::to_string(runs)});
                      if (r.ok()) python = *std::move(r);
                      py_status = r.status();
                      return absl::OkStatus();
                    })
          : star_n8.status();
  if (!free_n4.ok()) {
    std::cerr << "ckpt-bench publish: " << free_n4.status() << "\n";
    return 1;
  }
  const std::vector<double>& c = *chain;
  nlohmann::json out = {{"bytes", capped.bytes},
                        {"peer_send_rate_mib", rate_mib},
                        {"runs", runs},
                        {"reach_s_n1", c[0]},
                        {"reach_s_n2", c[1]},
                        {"reach_s_n4", c[2]},
                        {"reach_s_n8", c[3]},
                        {"reach_s_star_n8", (*star_n8)[0]},
                        {"reach_s_uncapped_n4", (*free_n4)[0]},
                        {"fanout_n8_vs_n1", c[3] / c[0]},
                        {"vs_star_n8", c[3] / (*star_n8)[0]},
                        {"source_sent_mib_chain", c[4]},
                        {"source_sent_mib_star", (*star_n8)[1]}};
  if (py_status.ok()) {
    out["gloo_broadcast_s_n4"] = python["gloo_broadcast_s"];
    out["vs_gloo_broadcast_n4"] =
        (*free_n4)[0] / python["gloo_broadcast_s"].get<double>();
    out["load_into_s"] = python["load_into_s"];
    out["memcpy_s"] = python["memcpy_s"];
    out["load_into_open_s"] = python["load_into_open_s"];
    out["load_into_view_s"] = python["load_into_view_s"];
    out["load_into_vs_memcpy"] =
        python["memcpy_s"].get<double>() / python["load_into_s"].get<double>();
  } else {
    out["python_error"] = py_status.ToString();
  }
  if (json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << "publish " << (capped.bytes >> 20) << " MiB, sends capped at "
              << rate_mib << " MiB/s\n";
    for (const auto& [key, value] : out.items()) {
      std::cout << "  " << key << ": " << value << "\n";
    }
  }
  return 0;
}

}  // namespace ckpt::bench
