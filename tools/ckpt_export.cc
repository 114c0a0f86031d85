// ckpt export: a step as safetensors.

#include <cstdio>
#include <iostream>
#include <string>

#include "nlohmann/json.hpp"
#include "tools/ckpt_cli.h"
#include "tools/data_dir_view.h"
#include "tools/export.h"

namespace ckpt::cli {

bool KnownExportFormat(const std::string& format) {
  if (format == "safetensors") return true;
  std::cerr << "ckpt export: unknown format \"" << format
            << "\" (supported: safetensors)\n";
  return false;
}

int Export(const std::string& data_dir, const std::string& job,
           const std::string& step_text, const std::string& format,
           const std::string& out, bool json) {
  auto step = ParseStep(step_text);
  if (!step.ok()) return UsageError("export", step.status());
  if (!KnownExportFormat(format)) return kExitUsage;
  auto view = ckpt::tools::DataDirView::Open(data_dir);
  if (!view.ok()) return Fail("export", view.status());
  Progress progress("export");
  auto stats = ckpt::tools::ExportSafetensors(
      **view, job, *step, out,
      [&](int done, int total) { progress.Update(done, total); });
  if (!stats.ok()) return Fail("export", stats.status());
  if (json) {
    nlohmann::json j;
    j["job"] = job;
    j["step"] = *step;
    j["path"] = out;
    j["tensors"] = stats->tensors;
    j["bytes"] = stats->bytes;
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("exported job %s step %lu: %d tensors, %s -> %s\n", job.c_str(),
                static_cast<unsigned long>(*step), stats->tensors,
                HumanBytes(stats->bytes).c_str(), out.c_str());
  }
  return 0;
}

}  // namespace ckpt::cli
