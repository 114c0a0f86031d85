#include "snapshot/codec_governor.h"

#include <algorithm>
#include <cmath>

namespace ckpt::snapshot {

CodecGovernor::CodecGovernor(const CodecGovernorOptions& options)
    : options_(options),
      effort_(std::clamp(options.initial_effort, 0.0,
                         std::max(options.max_effort, 0.0))) {
  absl::MutexLock lock(&mu_);
  probe_every_ = std::max(options_.probe_every, 0);
  stats_.probe_every = probe_every_;
  stats_.effort = effort_;
  Open();
}

void CodecGovernor::Open() {
  Window w;
  w.number = windows_.empty() ? 1 : windows_.back().number + 1;
  w.probe = probe_every_ > 0 && effort_ > 0.0 && w.number >= next_probe_;
  if (w.probe) next_probe_ = w.number + static_cast<uint64_t>(probe_every_);
  w.effort = w.probe ? 0.0 : effort_;
  windows_.push_back(w);
  while (windows_.size() > kMaxOpenWindows) windows_.pop_front();
}

CodecChoice CodecGovernor::Choose(uint64_t raw_bytes) {
  absl::MutexLock lock(&mu_);
  Window& w = windows_.back();
  CodecChoice choice;
  choice.level = options_.base_level;
  choice.window = w.number;
  if (w.effort < 1.0) {
    compress_credit_ += w.effort;
    choice.compress = compress_credit_ >= 1.0;
    if (choice.compress) compress_credit_ -= 1.0;
  } else {
    const double above = w.effort - 1.0;
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
  w.chosen_bytes += raw_bytes;
  if (w.chosen_bytes >= std::max<uint64_t>(options_.window_bytes, 1)) {
    w.closed = true;
    Open();
  }
  return choice;
}

void CodecGovernor::Written(const CodecChoice& choice, uint64_t raw_bytes,
                            double seconds) {
  absl::MutexLock lock(&mu_);
  auto it =
      std::find_if(windows_.begin(), windows_.end(),
                   [&](const Window& w) { return w.number == choice.window; });
  if (it == windows_.end()) return;  // long gone
  it->reported_bytes += raw_bytes;
  it->seconds += std::max(seconds, 0.0);
  if (it->closed && it->reported_bytes >= it->chosen_bytes) {
    const Window w = *it;
    windows_.erase(it);
    Measure(w);
  }
}

void CodecGovernor::Measure(const Window& w) {
  if (w.seconds <= 0 || w.reported_bytes == 0) return;
  const double rate =
      static_cast<double>(w.reported_bytes) / w.seconds / (1 << 20);
  ++stats_.windows;
  stats_.last_mib_s = rate;
  if (w.effort == 0.0) {
    stats_.raw_mib_s =
        stats_.raw_mib_s == 0 ? rate : 0.5 * (stats_.raw_mib_s + rate);
  }
  if (w.probe) {
    ++stats_.probes;
    // Compressing won against this probe: the next one moves out (twice the
    // interval), else it comes as often as at first.
    const bool compressing_wins =
        last_ordinary_mib_s_ > rate * (1.0 + options_.tolerance);
    const int before = probe_every_;
    probe_every_ =
        compressing_wins
            ? std::min(2 * probe_every_,
                       std::max(options_.max_probe_every, options_.probe_every))
            : options_.probe_every;
    next_probe_ = next_probe_ - static_cast<uint64_t>(before) +
                  static_cast<uint64_t>(probe_every_);
    stats_.probe_every = probe_every_;
    return;
  }
  last_ordinary_mib_s_ = rate;
  const double raw = stats_.raw_mib_s;
  if (raw == 0) return;
  if (rate < raw * (1.0 - options_.tolerance)) {
    effort_ = std::min(effort_, w.effort * rate / raw);
    ++stats_.lowered;
  } else {
    effort_ = std::min(std::max(options_.max_effort, 0.0),
                       effort_ + options_.step_up);
  }
  stats_.effort = effort_;
}

CodecGovernor::Stats CodecGovernor::stats() const {
  absl::MutexLock lock(&mu_);
  Stats s = stats_;
  s.effort = effort_;
  return s;
}

}  // namespace ckpt::snapshot
