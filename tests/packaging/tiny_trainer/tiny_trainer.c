/* A trainer of one rank through the installed C API: saves a tensor at step
 * 1 and 2, waits until step 2 is on disk, overwrites the tensor, restores
 * the latest disk commit and checks every element. Exit 0 when all is well.
 *
 *   tiny_trainer SOCKET JOB */
#include <ckpt/ckpt.h>
#include <stdio.h>
#include <string.h>

#define N 4096

static int fail(const char* what) {
  fprintf(stderr, "tiny_trainer: %s: %s\n", what, ckpt_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s SOCKET JOB\n", argv[0]);
    return 2;
  }
  static float w[N];
  ckpt_checkpointer* c = NULL;
  if (ckpt_connect(argv[2], 0, 1, argv[1], &c) != 0) return fail("connect");
  const int64_t shape = N, offset = 0, length = N;
  if (ckpt_register_tensor(c, "w", CKPT_DTYPE_FLOAT32, w, 1, &shape, &offset,
                           &length) != 0)
    return fail("register");
  ckpt_save* save = NULL;
  for (uint64_t step = 1; step <= 2; ++step) {
    for (int i = 0; i < N; ++i) w[i] = (float)(step * N + i);
    if (ckpt_save_async(c, step, &save) != 0) return fail("save");
    if (ckpt_save_wait_staged(save) != 0) return fail("staging");
    if (step == 2 &&
        ckpt_save_wait_committed(save, CKPT_TIER_LOCAL_DISK, 60000) != 0)
      return fail("committing");
    ckpt_save_free(save);
  }
  memset(w, 0, sizeof w);
  uint64_t latest = 0;
  int found = 0;
  if (ckpt_latest_committed(c, CKPT_TIER_LOCAL_DISK, &latest, &found) != 0)
    return fail("latest");
  if (!found || latest != 2) {
    fprintf(stderr, "tiny_trainer: latest disk commit %d/%llu, not 2\n", found,
            (unsigned long long)latest);
    return 1;
  }
  if (ckpt_restore(c, latest) != 0) return fail("restore");
  for (int i = 0; i < N; ++i) {
    if (w[i] != (float)(2 * N + i)) {
      fprintf(stderr, "tiny_trainer: element %d restored as %f\n", i, w[i]);
      return 1;
    }
  }
  ckpt_close(c);
  printf("tiny_trainer: step 2 saved, committed on disk and restored\n");
  return 0;
}
