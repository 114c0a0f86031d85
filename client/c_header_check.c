/* Compiled as C so the header stays valid C. */
#include "client/ckpt.h"

int ckpt_c_header_is_c(void) { return CKPT_TIER_LOCAL_DISK + CKPT_DTYPE_FLOAT32; }
