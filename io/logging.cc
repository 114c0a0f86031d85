#include "io/logging.h"

#include <memory>

#include "spdlog/sinks/stdout_color_sinks.h"

namespace ckpt::io {

spdlog::logger* Logger() {
  static spdlog::logger* const logger = [] {
    std::shared_ptr<spdlog::logger> l = spdlog::get("ckpt");
    if (l == nullptr) {
      l = std::make_shared<spdlog::logger>(
          "ckpt", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
      l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
      try {
        // Registered: the global level (spdlog::set_level) applies to it.
        spdlog::initialize_logger(l);
        l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
      } catch (const spdlog::spdlog_ex&) {
        // Registered a moment ago by another copy of the library: use its.
        if (std::shared_ptr<spdlog::logger> there = spdlog::get("ckpt")) {
          l = there;
        }
      }
    }
    // The registry holds it for the life of the process.
    return l.get();
  }();
  return logger;
}

}  // namespace ckpt::io
