// ErasureCode is the Reed-Solomon code of the erasure-coded peer tier
// (DESIGN.md §2, tier T1 with `--peer-redundancy rs:K+M`): k data blocks (the
// shard files of one parity group) and m parity blocks, any k of the k+m
// rebuild the others. It is systematic (data blocks are stored as they are)
// and works over GF(2^8) with a Cauchy matrix, whose every square submatrix is
// invertible, through Intel ISA-L. Its columns are scaled so that parity block
// 0 is the plain XOR of the data blocks: a data block's contribution to it is
// the block itself, and only the other m-1 cost multiplications.
//
// Blocks of one group may differ in length: a shorter data block counts as
// padded with zeros to the group's stripe length (its longest block), so
// parity blocks are as long as the longest data block and no padding is ever
// held or sent. Parity is linear, so it is built in pieces: each data node
// computes its block's contribution to every parity block (Contribute), and a
// parity holder XORs the contributions it receives into its block
// (Accumulate), in any order, over any byte ranges.
//
// Thread-safety: an ErasureCode and a Decoder are immutable once made; their
// methods may be called from several threads at once.
#ifndef CKPT_SNAPSHOT_ERASURE_CODE_H_
#define CKPT_SNAPSHOT_ERASURE_CODE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ckpt::snapshot {

class ErasureCode {
 public:
  // Limits: k+m blocks in GF(2^8) would allow 255; more than this many nodes
  // per group only slows encoding and widens what one loss touches.
  static constexpr int kMaxData = 32;
  static constexpr int kMaxParity = 8;

  // InvalidArgument naming the bad value when k or m is out of range.
  static absl::StatusOr<ErasureCode> Create(int k, int m);
  // "rs:K+M", as `--peer-redundancy` takes it.
  static absl::StatusOr<ErasureCode> Parse(absl::string_view spec);

  int k() const { return k_; }
  int m() const { return m_; }
  // "rs:K+M".
  std::string ToString() const;

  // Data block `index`'s contribution to each parity block: out[j] (m
  // buffers of data.size() bytes) = coefficient(j, index) * data. The bytes
  // at offset o of a contribution belong at offset o of parity block j.
  void Contribute(int index, absl::Span<const uint8_t> data,
                  absl::Span<uint8_t* const> out) const;
  // True when data block `index`'s contribution to parity block `j` is its
  // bytes themselves (coefficient 1: always for j == 0), to send as they are.
  bool Plain(int index, int j) const;
  // Its contribution to parity block j alone (data.size() bytes at `out`).
  void ContributeTo(int index, int j, absl::Span<const uint8_t> data,
                    uint8_t* out) const;
  // parity ^= contribution, byte by byte.
  static void Accumulate(absl::Span<const uint8_t> contribution,
                         uint8_t* parity);
  // All m parity blocks of k data blocks, each parity block as long as the
  // longest data block (its buffer must hold that many bytes; it is
  // overwritten).
  void Encode(absl::Span<const absl::Span<const uint8_t>> data,
              absl::Span<uint8_t* const> parity) const;

  // Rebuilds blocks from any k others. Block indices: 0..k-1 data, k..k+m-1
  // parity.
  class Decoder {
   public:
    // The k blocks it reads, in the order Decode takes them.
    const std::vector<int>& sources() const { return sources_; }
    // The blocks it rebuilds, in the order Decode writes them.
    const std::vector<int>& wanted() const { return wanted_; }
    // Rebuilds `len` bytes at one offset of every wanted block from the
    // same range of each source (a source shorter than the range reads as
    // zeros there: the caller passes zeros).
    void Decode(size_t len, absl::Span<const uint8_t* const> sources,
                absl::Span<uint8_t* const> out) const;

   private:
    friend class ErasureCode;
    int k_ = 0;
    std::vector<int> sources_;
    std::vector<int> wanted_;
    std::vector<uint8_t> tables_;
  };
  // A decoder that rebuilds `wanted` from the first k blocks of `available`
  // (in ascending order). FailedPrecondition, naming what is missing, when
  // fewer than k blocks are available; InvalidArgument for an index out of
  // range or a wanted block that is also available.
  absl::StatusOr<Decoder> MakeDecoder(std::vector<int> available,
                                      std::vector<int> wanted) const;

  // Rebuilds whole blocks. `blocks` has k+m entries: the available ones with
  // their bytes (each exactly as long as the block: a data block its own
  // length, a parity block the stripe length), missing ones as empty spans
  // with `present` false. `lengths` gives every block's length (data blocks'
  // from the group's record). Returns the wanted blocks, in `wanted` order.
  absl::StatusOr<std::vector<std::vector<uint8_t>>> Rebuild(
      absl::Span<const absl::Span<const uint8_t>> blocks,
      const std::vector<bool>& present, const std::vector<uint64_t>& lengths,
      std::vector<int> wanted) const;
  // The same into the caller's buffers: out[w] is exactly as long as block
  // wanted[w] (a file mapped where it is to be kept, say). `threads` decode
  // disjoint segments at once. `ready`, when given, is called (from any of
  // them) before a segment is decoded, with the segment's end offset: it
  // returns once every available block holds its bytes up to there (blocks
  // still arriving), or an error that stops the rebuild and is returned.
  using Ready = std::function<absl::Status(uint64_t end)>;
  absl::Status RebuildInto(absl::Span<const absl::Span<const uint8_t>> blocks,
                           const std::vector<bool>& present,
                           const std::vector<uint64_t>& lengths,
                           std::vector<int> wanted,
                           absl::Span<const absl::Span<uint8_t>> out,
                           int threads = 1, const Ready& ready = nullptr) const;

  // Rebuilds decode segment after segment, kSegment bytes each (fewer at the
  // stripe's end).
  static constexpr size_t kSegment = 1 << 20;
  // The sources of a rebuild as they stream in, of which only a window need
  // be held at once.
  class SegmentFeed {
   public:
    virtual ~SegmentFeed() = default;
    // Waits for segment `seg` of available block `b` and returns its bytes:
    // the segment's length, or fewer (none) where the block ends in (before)
    // it; the decoder reads zeros past them. An error stops the rebuild.
    virtual absl::StatusOr<absl::Span<const uint8_t>> Acquire(int b,
                                                              uint64_t seg) = 0;
    // Segment `seg` is decoded: what Acquire gave for it may be reused.
    virtual void Release(uint64_t seg) = 0;
  };
  // Where a streamed rebuild's blocks go, segment by segment, from any of
  // its threads (each segment once; they come in no particular order).
  class SegmentSink {
   public:
    virtual ~SegmentSink() = default;
    // Bytes [off, off + bytes.size()) of the w-th wanted block.
    virtual absl::Status Put(size_t w, uint64_t off,
                             absl::Span<const uint8_t> bytes) = 0;
  };
  // RebuildInto, reading the available blocks (`present`) through `feed` and
  // writing the wanted ones through `sink`: each segment is decoded into a
  // buffer of the thread's own, in the cache, and handed over from there.
  absl::Status RebuildStreamed(const std::vector<bool>& present,
                               const std::vector<uint64_t>& lengths,
                               std::vector<int> wanted, int threads,
                               SegmentFeed& feed, SegmentSink& sink) const;

 private:
  ErasureCode(int k, int m);
  // The longest data block's length, which every parity block must have.
  absl::StatusOr<uint64_t> StripeOf(const std::vector<uint64_t>& lengths) const;
  int k_;
  int m_;
  // (k+m) x k: identity over the Cauchy rows.
  std::vector<uint8_t> matrix_;
  // Per data block, the m x 1 tables of its column (Contribute).
  std::vector<std::vector<uint8_t>> column_tables_;
  // Per data block and parity block, the 1 x 1 table of its coefficient.
  std::vector<std::vector<uint8_t>> coefficient_tables_;
  // m x k tables of the parity rows (Encode).
  std::vector<uint8_t> parity_tables_;
};

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_ERASURE_CODE_H_
