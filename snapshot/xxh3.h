// XXH3 (xxHash), the checksum of the shard format, at the widest vectors this
// CPU has. Debian's libxxhash is built for SSE2 and exports, beside it,
// variants that pick AVX2 or AVX-512 at run time; xxh_x86dispatch.h puts them
// in place of the plain names (XXH3_64bits, XXH3_64bits_update). On this
// project's machines that is 26 GB/s a core against 14, bit for bit the same
// hash. Code that hashes includes this, never <xxhash.h> alone.
#ifndef CKPT_SNAPSHOT_XXH3_H_
#define CKPT_SNAPSHOT_XXH3_H_

#include <xxhash.h>

#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif

#endif  // CKPT_SNAPSHOT_XXH3_H_
