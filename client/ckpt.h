/* libckpt's C API, for trainers written in other languages (and
 * foreign-function interfaces). It wraps ckpt::client::Checkpointer
 * (checkpointer.h); see there for the semantics.
 *
 * Every function returning int returns 0 on success, else an error code (the
 * absl::StatusCode numbers: 3 invalid argument, 5 not found, 7 permission
 * denied, 8 resource exhausted, 14 unavailable, ...). ckpt_last_error() then
 * describes the error of the calling thread's last failed call. Objects are
 * used by one thread at a time. */
#ifndef CKPT_CLIENT_CKPT_H_
#define CKPT_CLIENT_CKPT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ckpt_checkpointer ckpt_checkpointer;
typedef struct ckpt_save ckpt_save;

/* Tiers (DESIGN.md §3). */
enum {
  CKPT_TIER_MEMORY = 1,
  CKPT_TIER_PEER = 2,
  CKPT_TIER_LOCAL_DISK = 3,
  CKPT_TIER_SHARED = 4
};

/* Element types; the values of proto/manifest.proto's DType. */
enum {
  CKPT_DTYPE_BOOL = 1,
  CKPT_DTYPE_UINT8 = 2,
  CKPT_DTYPE_INT8 = 3,
  CKPT_DTYPE_UINT16 = 4,
  CKPT_DTYPE_INT16 = 5,
  CKPT_DTYPE_UINT32 = 6,
  CKPT_DTYPE_INT32 = 7,
  CKPT_DTYPE_UINT64 = 8,
  CKPT_DTYPE_INT64 = 9,
  CKPT_DTYPE_FLOAT16 = 10,
  CKPT_DTYPE_BFLOAT16 = 11,
  CKPT_DTYPE_FLOAT32 = 12,
  CKPT_DTYPE_FLOAT64 = 13,
  CKPT_DTYPE_FLOAT8_E4M3 = 14,
  CKPT_DTYPE_FLOAT8_E5M2 = 15
};

/* socket_path NULL: ckptd's default socket for this uid. */
int ckpt_connect(const char* job, uint32_t rank, uint32_t world_size,
                 const char* socket_path, ckpt_checkpointer** out);
/* Tensors registered later are device memory of GPU `cuda_device`; saves copy
 * them on their own stream after the work queued on `compute_stream` (a
 * cudaStream_t, NULL = the default stream), and work queued there after
 * ckpt_save_async waits for the copy, so the host need not wait. */
int ckpt_connect_cuda(const char* job, uint32_t rank, uint32_t world_size,
                      const char* socket_path, int cuda_device,
                      void* compute_stream, ckpt_checkpointer** out);
/* ckpt_connect_cuda with `flags`: CKPT_CUDA_NO_STREAM_ORDER leaves work
 * queued on `compute_stream` after ckpt_save_async free to run while the save
 * copies (a forward and backward pass); the trainer then calls
 * ckpt_save_order_stream before the step that overwrites the state. */
#define CKPT_CUDA_NO_STREAM_ORDER 1u
int ckpt_connect_cuda_flags(const char* job, uint32_t rank, uint32_t world_size,
                            const char* socket_path, int cuda_device,
                            void* compute_stream, unsigned flags,
                            ckpt_checkpointer** out);
/* Waits for saves in flight to be handed to the daemon, then frees. NULL is
 * ignored. */
void ckpt_close(ckpt_checkpointer* ckpt);

/* A tensor in the checkpointer's memory (host, or the GPU of
 * ckpt_connect_cuda): this rank's box of a global tensor, row-major,
 * `ndim` dims. */
int ckpt_register_tensor(ckpt_checkpointer* ckpt, const char* name, int dtype,
                         void* data, int ndim, const int64_t* global_shape,
                         const int64_t* box_offset, const int64_t* box_length);
/* A fixed-size byte buffer (RNG state, data-loader position): saved as is; a
 * restore must find exactly `size` bytes. */
int ckpt_register_buffer(ckpt_checkpointer* ckpt, const char* name, void* data,
                         size_t size);

int ckpt_save_async(ckpt_checkpointer* ckpt, uint64_t step, ckpt_save** out);
/* After this returns 0 the registered memory may change again. */
int ckpt_save_wait_staged(ckpt_save* save);
int ckpt_save_wait_committed(ckpt_save* save, int tier, int64_t timeout_ms);
/* Work queued later on `stream` (a cudaStream_t) waits for this save's copy on
 * the device, without blocking the host. Host tensors: ckpt_save_wait_staged.
 */
int ckpt_save_order_stream(ckpt_save* save, void* stream);
void ckpt_save_free(ckpt_save* save);

/* *found is 0 when no step is committed at `tier` yet. */
int ckpt_latest_committed(ckpt_checkpointer* ckpt, int tier, uint64_t* step,
                          int* found);
int ckpt_restore(ckpt_checkpointer* ckpt, uint64_t step);

/* The calling thread's last error message ("" if none). Valid until its next
 * failing call. */
const char* ckpt_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_CLIENT_CKPT_H_ */
