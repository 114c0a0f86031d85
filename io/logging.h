// Logging for the whole project goes through one spdlog logger, "ckpt", whose
// sink is stderr: stdout stays for what a command prints (tables, --json
// documents), and a trainer's stdout gets nothing from libckpt. The logger is
// registered with spdlog, so spdlog::set_level applies to it.
//
// Thread-safety: the logger is thread-safe; log from any thread.
#ifndef CKPT_IO_LOGGING_H_
#define CKPT_IO_LOGGING_H_

#include <spdlog/spdlog.h>

namespace ckpt::io {

// The "ckpt" logger, made on first use (or the one already registered under
// that name, by another copy of the library in the same process).
spdlog::logger* Logger();

}  // namespace ckpt::io

#define CKPT_LOG_DEBUG(...) ::ckpt::io::Logger()->debug(__VA_ARGS__)
#define CKPT_LOG_INFO(...) ::ckpt::io::Logger()->info(__VA_ARGS__)
#define CKPT_LOG_WARN(...) ::ckpt::io::Logger()->warn(__VA_ARGS__)
#define CKPT_LOG_ERROR(...) ::ckpt::io::Logger()->error(__VA_ARGS__)

#endif  // CKPT_IO_LOGGING_H_
