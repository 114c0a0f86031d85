// ckpt publish, ckpt topics and ckpt subscribe: publication of committed steps
// to readers (issue #37), through the node's ckptd.
#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/subscriber.h"
#include "tools/ckpt_cli.h"

namespace ckpt::cli {
namespace {

nlohmann::json VersionJson(const proto::VersionRecord& v) {
  nlohmann::json files = nlohmann::json::array();
  for (const proto::VersionFile& f : v.files()) {
    files.push_back(
        {{"rank", f.rank()}, {"bytes", f.file_bytes()}, {"node", f.node()}});
  }
  return {
      {"topic", v.topic()},
      {"version", v.version()},
      {"job", v.job()},
      {"step", v.step()},
      {"world_size", v.world_size()},
      {"items", std::vector<std::string>(v.items().begin(), v.items().end())},
      {"cast", v.cast()},
      {"bytes", v.bytes()},
      {"source_node", v.source_node()},
      {"created_unix_micros", v.created_unix_micros()},
      {"files", files}};
}

// Versions a subscriber is behind the newest (its newest held).
uint64_t Lag(uint64_t newest, const proto::SubscriberRecord& s) {
  uint64_t held = 0;
  for (uint64_t v : s.held()) held = std::max(held, v);
  return newest - std::min(newest, held);
}

nlohmann::json SubscribersJson(const proto::TopicSummary& t) {
  nlohmann::json out = nlohmann::json::array();
  for (const proto::SubscriberRecord& s : t.subscribers()) {
    out.push_back(
        {{"node", s.node()},
         {"held", std::vector<uint64_t>(s.held().begin(), s.held().end())},
         {"lag", Lag(t.newest(), s)}});
  }
  return out;
}

}  // namespace

int Publish(const std::string& socket_path, const std::string& job,
            const std::string& step_text, const std::string& topic,
            const std::vector<std::string>& items, const std::string& cast,
            bool json) {
  absl::StatusOr<uint64_t> step = ParseStep(step_text);
  if (!step.ok()) return UsageError("publish", step.status());
  proto::PublishRequest request;
  request.set_job(job);
  request.set_step(*step);
  request.set_topic(topic);
  for (const std::string& glob : items) request.add_items(glob);
  request.set_cast(cast);
  absl::StatusOr<proto::VersionRecord> version =
      client::Publish(socket_path, request);
  if (!version.ok()) return Fail("publish", version.status());
  if (json) {
    std::cout << VersionJson(*version).dump(2) << "\n";
    return 0;
  }
  std::cout << "topic " << topic << " version " << version->version()
            << ": step " << version->step() << " of job " << version->job()
            << ", " << version->world_size() << " ranks, "
            << HumanBytes(version->bytes())
            << (cast.empty() ? "" : ", cast to " + cast) << "\n";
  return 0;
}

int Topics(const std::string& socket_path, bool json) {
  absl::StatusOr<proto::ListTopicsResponse> topics =
      client::ListTopics(socket_path);
  if (!topics.ok()) return Fail("topics", topics.status());
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const proto::TopicSummary& t : topics->topics()) {
      out.push_back(
          {{"topic", t.topic()},
           {"newest", t.newest()},
           {"versions", t.versions()},
           {"held", std::vector<uint64_t>(t.held().begin(), t.held().end())},
           {"subscribed", t.subscribed()},
           {"subscribers", SubscribersJson(t)},
           {"newest_record", VersionJson(t.newest_record())}});
    }
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (topics->topics_size() == 0) {
    std::cout << "no topics (ckpt publish JOB STEP --topic T makes one)\n";
    return 0;
  }
  std::cout << "TOPIC  NEWEST  FROM  SIZE  HELD HERE  SUBSCRIBERS (LAG)\n";
  for (const proto::TopicSummary& t : topics->topics()) {
    const proto::VersionRecord& v = t.newest_record();
    std::vector<std::string> subscribers;
    for (const proto::SubscriberRecord& s : t.subscribers()) {
      subscribers.push_back(
          absl::StrCat(s.node(), " (", Lag(t.newest(), s), ")"));
    }
    std::cout << t.topic() << "  " << t.newest() << "  " << v.job() << "@"
              << v.step() << "  " << HumanBytes(v.bytes()) << "  "
              << (t.held_size() == 0 ? "-" : absl::StrJoin(t.held(), ","))
              << "  "
              << (subscribers.empty() ? "-" : absl::StrJoin(subscribers, ", "))
              << "\n";
  }
  return 0;
}

int Subscribe(const std::string& socket_path, const std::string& topic,
              bool json) {
  absl::StatusOr<bool> added = client::Subscribe(socket_path, topic);
  if (!added.ok()) return Fail("subscribe", added.status());
  if (json) {
    std::cout << nlohmann::json{{"topic", topic}, {"already", !*added}}.dump(2)
              << "\n";
    return 0;
  }
  std::cout << (*added ? "subscribed to topic "
                       : "already subscribed to topic ")
            << topic << "\n";
  return 0;
}

}  // namespace ckpt::cli
