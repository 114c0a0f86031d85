#include "client/elastic.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/daemon_admin.h"
#include "io/status_macros.h"

namespace ckpt::client {

absl::StatusOr<Epoch> Rejoin(const RejoinOptions& options) {
  std::string participant = options.participant;
  if (participant.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    participant = absl::StrCat(host, "-", ::getpid());
  }
  proto::RendezvousRequest req;
  req.set_job(options.job);
  req.set_participant(participant);
  req.set_min_members(options.min_ranks);
  req.set_max_members(options.max_ranks);
  req.set_settle_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(options.settle)));
  req.set_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(options.timeout)));
  req.set_resume_tier(options.resume_tier);
  const std::string socket =
      options.socket_path.empty() ? DefaultSocketPath() : options.socket_path;
  ASSIGN_OR_RETURN(
      proto::RendezvousResponse resp,
      (CallDaemon<proto::RendezvousRequest, proto::RendezvousResponse>(
          socket, &proto::CkptDaemon::Stub::Rendezvous, req,
          absl::StrCat("rejoining job ", options.job),
          std::chrono::milliseconds(absl::ToInt64Milliseconds(options.timeout) +
                                    10000))));
  const proto::EpochRecord& e = resp.epoch();
  Epoch out;
  out.epoch = e.epoch();
  out.world_size = static_cast<uint32_t>(e.members_size());
  out.nccl_unique_id = e.unique_id();
  out.members.assign(e.members().begin(), e.members().end());
  if (e.has_resume_step()) out.resume_step = e.resume_step();
  out.rank = static_cast<uint32_t>(
      std::find(out.members.begin(), out.members.end(), participant) -
      out.members.begin());
  return out;
}

}  // namespace ckpt::client
