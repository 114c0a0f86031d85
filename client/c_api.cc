// The C API (ckpt.h) over Checkpointer: status codes out, messages in a
// thread-local string.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/ckpt.h"

namespace {

thread_local std::string g_last_error;

int Fail(const absl::Status& s) {
  if (s.ok()) return 0;
  g_last_error = std::string(s.message());
  return static_cast<int>(s.code());
}

struct Buffer {
  void* data;
  size_t size;
  std::string value;  // what Checkpointer saves and restores
};

}  // namespace

struct ckpt_checkpointer {
  std::unique_ptr<ckpt::client::Checkpointer> impl;
  std::vector<std::unique_ptr<Buffer>> buffers;
};

struct ckpt_save {
  std::shared_ptr<ckpt::client::SaveHandle> impl;
};

extern "C" {

namespace {

int Connect(const char* job, uint32_t rank, uint32_t world_size,
            const char* socket_path, int cuda_device, void* compute_stream,
            unsigned flags, ckpt_checkpointer** out) {
  if (job == nullptr || out == nullptr)
    return Fail(absl::InvalidArgumentError("null argument"));
  if ((flags & ~CKPT_CUDA_NO_STREAM_ORDER) != 0) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("unknown flags ", flags & ~CKPT_CUDA_NO_STREAM_ORDER)));
  }
  ckpt::client::CheckpointerOptions options;
  options.job = job;
  options.rank = rank;
  options.world_size = world_size;
  if (socket_path != nullptr) options.socket_path = socket_path;
  if (cuda_device >= 0) {
    options.device = ckpt::client::DeviceKind::kCuda;
    options.cuda_device = cuda_device;
    options.compute_stream = compute_stream;
    options.order_compute_stream = (flags & CKPT_CUDA_NO_STREAM_ORDER) == 0;
  }
  auto impl = ckpt::client::Checkpointer::Connect(options);
  if (!impl.ok()) return Fail(impl.status());
  *out = new ckpt_checkpointer{*std::move(impl), {}};
  return 0;
}

}  // namespace

int ckpt_connect(const char* job, uint32_t rank, uint32_t world_size,
                 const char* socket_path, ckpt_checkpointer** out) {
  return Connect(job, rank, world_size, socket_path, -1, nullptr, 0, out);
}

int ckpt_connect_cuda(const char* job, uint32_t rank, uint32_t world_size,
                      const char* socket_path, int cuda_device,
                      void* compute_stream, ckpt_checkpointer** out) {
  return ckpt_connect_cuda_flags(job, rank, world_size, socket_path,
                                 cuda_device, compute_stream, 0, out);
}

int ckpt_connect_cuda_flags(const char* job, uint32_t rank, uint32_t world_size,
                            const char* socket_path, int cuda_device,
                            void* compute_stream, unsigned flags,
                            ckpt_checkpointer** out) {
  if (cuda_device < 0) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", cuda_device, " is negative")));
  }
  return Connect(job, rank, world_size, socket_path, cuda_device,
                 compute_stream, flags, out);
}

void ckpt_close(ckpt_checkpointer* ckpt) { delete ckpt; }

int ckpt_register_tensor(ckpt_checkpointer* ckpt, const char* name, int dtype,
                         void* data, int ndim, const int64_t* global_shape,
                         const int64_t* box_offset, const int64_t* box_length) {
  if (ckpt == nullptr || name == nullptr || data == nullptr || ndim < 0 ||
      (ndim > 0 && (global_shape == nullptr || box_offset == nullptr ||
                    box_length == nullptr))) {
    return Fail(absl::InvalidArgumentError(
        "ckpt_register_tensor: null or negative argument"));
  }
  return Fail(ckpt->impl->RegisterTensor(
      name, static_cast<ckpt::proto::DType>(dtype), data,
      std::vector<int64_t>(global_shape, global_shape + ndim),
      std::vector<int64_t>(box_offset, box_offset + ndim),
      std::vector<int64_t>(box_length, box_length + ndim)));
}

int ckpt_register_buffer(ckpt_checkpointer* ckpt, const char* name, void* data,
                         size_t size) {
  if (ckpt == nullptr || name == nullptr || (data == nullptr && size > 0)) {
    return Fail(
        absl::InvalidArgumentError("ckpt_register_buffer: null argument"));
  }
  auto buffer = std::make_unique<Buffer>(Buffer{data, size, {}});
  absl::Status s = ckpt->impl->RegisterBytes(name, &buffer->value);
  if (s.ok()) ckpt->buffers.push_back(std::move(buffer));
  return Fail(s);
}

int ckpt_save_async(ckpt_checkpointer* ckpt, uint64_t step, ckpt_save** out) {
  if (ckpt == nullptr || out == nullptr)
    return Fail(absl::InvalidArgumentError("null argument"));
  for (auto& b : ckpt->buffers)
    b->value.assign(static_cast<const char*>(b->data), b->size);
  auto handle = ckpt->impl->SaveAsync(step);
  if (!handle.ok()) return Fail(handle.status());
  *out = new ckpt_save{*std::move(handle)};
  return 0;
}

int ckpt_save_wait_staged(ckpt_save* save) {
  if (save == nullptr) return Fail(absl::InvalidArgumentError("null save"));
  return Fail(save->impl->WaitStaged());
}

int ckpt_save_wait_committed(ckpt_save* save, int tier, int64_t timeout_ms) {
  if (save == nullptr) return Fail(absl::InvalidArgumentError("null save"));
  return Fail(save->impl->WaitCommitted(static_cast<ckpt::proto::Tier>(tier),
                                        absl::Milliseconds(timeout_ms)));
}

int ckpt_save_order_stream(ckpt_save* save, void* stream) {
  if (save == nullptr) return Fail(absl::InvalidArgumentError("null save"));
  return Fail(save->impl->OrderStream(stream));
}

void ckpt_save_free(ckpt_save* save) { delete save; }

int ckpt_latest_committed(ckpt_checkpointer* ckpt, int tier, uint64_t* step,
                          int* found) {
  if (ckpt == nullptr || step == nullptr || found == nullptr) {
    return Fail(absl::InvalidArgumentError("null argument"));
  }
  auto latest =
      ckpt->impl->LatestCommitted(static_cast<ckpt::proto::Tier>(tier));
  if (!latest.ok()) return Fail(latest.status());
  *found = latest->has_value() ? 1 : 0;
  *step = latest->value_or(0);
  return 0;
}

int ckpt_restore(ckpt_checkpointer* ckpt, uint64_t step) {
  if (ckpt == nullptr) return Fail(absl::InvalidArgumentError("null argument"));
  absl::Status s = ckpt->impl->Restore(step);
  if (!s.ok()) return Fail(s);
  for (auto& b : ckpt->buffers) {
    if (b->value.size() != b->size) {
      return Fail(absl::FailedPreconditionError(
          "a registered buffer was saved with " +
          std::to_string(b->value.size()) + " bytes but is " +
          std::to_string(b->size) + " bytes now"));
    }
    std::memcpy(b->data, b->value.data(), b->size);
  }
  return 0;
}

const char* ckpt_last_error(void) { return g_last_error.c_str(); }

}  // extern "C"
