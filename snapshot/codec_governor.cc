#include "snapshot/codec_governor.h"

#include <algorithm>
#include <cmath>

namespace ckpt::snapshot {

CodecGovernor::CodecGovernor(const CodecGovernorOptions& options)
    : options_(options),
      effort_(std::clamp(options.initial_effort, 0.0,
                         std::max(options.max_effort, 0.0))) {}

CodecChoice CodecGovernor::Choose() {
  absl::MutexLock lock(&mu_);
  CodecChoice choice;
  choice.level = options_.base_level;
  if (effort_ < 1.0) {
    compress_credit_ += effort_;
    choice.compress = compress_credit_ >= 1.0;
    if (choice.compress) compress_credit_ -= 1.0;
  } else {
    const double above = effort_ - 1.0;
    const double whole = std::floor(above);
    choice.level += static_cast<int>(whole);
    level_credit_ += above - whole;
    if (level_credit_ >= 1.0) {
      level_credit_ -= 1.0;
      ++choice.level;
    }
  }
  if (choice.compress) {
    ++stats_.compressed;
  } else {
    ++stats_.stored_raw;
  }
  return choice;
}

void CodecGovernor::Observe(Signal signal) {
  absl::MutexLock lock(&mu_);
  ++stats_.observations;
  switch (signal) {
    case Signal::kAhead:
      effort_ = std::min(options_.max_effort, effort_ + options_.step_up);
      break;
    case Signal::kDiskBusy:
      break;
    case Signal::kDiskStarved:
      ++stats_.starved;
      effort_ = std::max(0.0, effort_ - options_.step_down);
      break;
  }
}

CodecGovernor::Stats CodecGovernor::stats() const {
  absl::MutexLock lock(&mu_);
  Stats s = stats_;
  s.effort = effort_;
  return s;
}

}  // namespace ckpt::snapshot
