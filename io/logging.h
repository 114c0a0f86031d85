// Logging for the whole project goes through spdlog; these macros keep call
// sites short and let the library choose the sink (stderr by default).
//
// Thread-safety: spdlog's default logger is thread-safe; log from any thread.
#ifndef CKPT_IO_LOGGING_H_
#define CKPT_IO_LOGGING_H_

#include <spdlog/spdlog.h>

#define CKPT_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define CKPT_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define CKPT_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define CKPT_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)

#endif  // CKPT_IO_LOGGING_H_
