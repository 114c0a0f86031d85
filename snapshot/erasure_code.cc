#include "snapshot/erasure_code.h"

#include <isa-l/erasure_code.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "io/parallel.h"
#include "io/status_macros.h"

namespace ckpt::snapshot {
namespace {

// Rebuild decodes this much of every block at a time.

std::string BlockName(int index, int k) {
  return index < k ? absl::StrCat("data block ", index)
                   : absl::StrCat("parity block ", index - k);
}

std::string BlockNames(const std::vector<int>& blocks, int k) {
  return absl::StrJoin(blocks, ", ", [k](std::string* out, int b) {
    out->append(BlockName(b, k));
  });
}

}  // namespace

absl::StatusOr<ErasureCode> ErasureCode::Create(int k, int m) {
  if (k < 1 || k > kMaxData) {
    return absl::InvalidArgumentError(absl::StrCat(
        "erasure code: ", k, " data blocks per group; give 1 to ", kMaxData));
  }
  if (m < 1 || m > kMaxParity) {
    return absl::InvalidArgumentError(
        absl::StrCat("erasure code: ", m,
                     " parity blocks per group; give 1 to ", kMaxParity));
  }
  return ErasureCode(k, m);
}

absl::StatusOr<ErasureCode> ErasureCode::Parse(absl::string_view spec) {
  absl::string_view rest = spec;
  int k = 0, m = 0;
  const bool consumed = absl::ConsumePrefix(&rest, "rs:");
  const size_t plus = rest.find('+');
  if (!consumed || plus == absl::string_view::npos ||
      !absl::SimpleAtoi(rest.substr(0, plus), &k) ||
      !absl::SimpleAtoi(rest.substr(plus + 1), &m)) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer redundancy \"", spec,
                     "\" is not rs:K+M (K data and M parity blocks per group, "
                     "e.g. rs:4+2)"));
  }
  absl::StatusOr<ErasureCode> code = Create(k, m);
  if (!code.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer redundancy \"", spec, "\": ", code.status().message()));
  }
  return code;
}

ErasureCode::ErasureCode(int k, int m) : k_(k), m_(m) {
  const int n = k + m;
  matrix_.resize(static_cast<size_t>(n) * k);
  gf_gen_cauchy1_matrix(matrix_.data(), n, k);
  // Each column of the Cauchy rows scaled so that the first is all ones:
  // parity block 0 is the XOR of the data blocks. Scaling a column by a
  // non-zero factor scales the determinant of every square submatrix that
  // has it, so every one of them stays invertible.
  for (int i = 0; i < k; ++i) {
    const uint8_t inverse = gf_inv(matrix_[k * k + i]);
    for (int j = 0; j < m; ++j) {
      uint8_t& a = matrix_[(k + j) * k + i];
      a = gf_mul(a, inverse);
    }
  }
  parity_tables_.resize(32u * k * m);
  ec_init_tables(k, m, &matrix_[static_cast<size_t>(k) * k],
                 parity_tables_.data());
  column_tables_.resize(k);
  coefficient_tables_.resize(static_cast<size_t>(k) * m);
  for (int i = 0; i < k; ++i) {
    std::vector<uint8_t> column(m);
    for (int j = 0; j < m; ++j) {
      column[j] = matrix_[(k + j) * k + i];
      std::vector<uint8_t>& one = coefficient_tables_[i * m + j];
      one.resize(32);
      ec_init_tables(1, 1, &column[j], one.data());
    }
    column_tables_[i].resize(32u * m);
    ec_init_tables(1, m, column.data(), column_tables_[i].data());
  }
}

std::string ErasureCode::ToString() const {
  return absl::StrCat("rs:", k_, "+", m_);
}

void ErasureCode::Contribute(int index, absl::Span<const uint8_t> data,
                             absl::Span<uint8_t* const> out) const {
  if (data.empty()) return;
  auto* source = const_cast<uint8_t*>(data.data());
  ec_encode_data(static_cast<int>(data.size()), 1, m_,
                 const_cast<uint8_t*>(column_tables_[index].data()), &source,
                 const_cast<uint8_t**>(out.data()));
}

bool ErasureCode::Plain(int index, int j) const {
  return matrix_[(k_ + j) * k_ + index] == 1;
}

void ErasureCode::ContributeTo(int index, int j, absl::Span<const uint8_t> data,
                               uint8_t* out) const {
  if (data.empty()) return;
  if (Plain(index, j)) {
    std::memcpy(out, data.data(), data.size());
    return;
  }
  auto* source = const_cast<uint8_t*>(data.data());
  ec_encode_data(
      static_cast<int>(data.size()), 1, 1,
      const_cast<uint8_t*>(coefficient_tables_[index * m_ + j].data()), &source,
      &out);
}

void ErasureCode::Accumulate(absl::Span<const uint8_t> contribution,
                             uint8_t* parity) {
  const uint8_t* in = contribution.data();
  size_t n = contribution.size();
  while (n >= 8) {
    uint64_t a, b;
    std::memcpy(&a, parity, 8);
    std::memcpy(&b, in, 8);
    a ^= b;
    std::memcpy(parity, &a, 8);
    parity += 8;
    in += 8;
    n -= 8;
  }
  while (n-- > 0) *parity++ ^= *in++;
}

void ErasureCode::Encode(absl::Span<const absl::Span<const uint8_t>> data,
                         absl::Span<uint8_t* const> parity) const {
  size_t stripe = 0;
  bool equal = true;
  for (const auto& block : data) {
    equal = equal && block.size() == data[0].size();
    stripe = std::max(stripe, block.size());
  }
  if (stripe == 0) return;
  if (equal) {
    std::vector<uint8_t*> sources;
    for (const auto& block : data) {
      sources.push_back(const_cast<uint8_t*>(block.data()));
    }
    ec_encode_data(static_cast<int>(stripe), k_, m_,
                   const_cast<uint8_t*>(parity_tables_.data()), sources.data(),
                   const_cast<uint8_t**>(parity.data()));
    return;
  }
  for (int j = 0; j < m_; ++j) std::memset(parity[j], 0, stripe);
  for (int i = 0; i < k_; ++i) {
    if (data[i].empty()) continue;
    ec_encode_data_update(static_cast<int>(data[i].size()), k_, m_, i,
                          const_cast<uint8_t*>(parity_tables_.data()),
                          const_cast<uint8_t*>(data[i].data()),
                          const_cast<uint8_t**>(parity.data()));
  }
}

absl::StatusOr<ErasureCode::Decoder> ErasureCode::MakeDecoder(
    std::vector<int> available, std::vector<int> wanted) const {
  const int n = k_ + m_;
  std::sort(available.begin(), available.end());
  available.erase(std::unique(available.begin(), available.end()),
                  available.end());
  for (int b : available) {
    if (b < 0 || b >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "erasure decode: block ", b, " out of range for ", ToString()));
    }
  }
  if (wanted.empty()) {
    return absl::InvalidArgumentError("erasure decode: no block wanted");
  }
  std::set<int> seen;
  for (int w : wanted) {
    if (w < 0 || w >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("erasure decode: wanted block ", w, " out of range for ",
                       ToString()));
    }
    if (!seen.insert(w).second ||
        std::binary_search(available.begin(), available.end(), w)) {
      return absl::InvalidArgumentError(
          absl::StrCat("erasure decode: ", BlockName(w, k_),
                       " is wanted twice or is available already"));
    }
  }
  if (static_cast<int>(available.size()) < k_) {
    std::vector<int> missing;
    for (int b = 0; b < n; ++b) {
      if (!std::binary_search(available.begin(), available.end(), b)) {
        missing.push_back(b);
      }
    }
    return absl::FailedPreconditionError(absl::StrCat(
        ToString(), ": ", missing.size(), " of ", n, " blocks are missing (",
        BlockNames(missing, k_), "), more than the ", m_, " it can rebuild"));
  }
  Decoder d;
  d.k_ = k_;
  d.sources_.assign(available.begin(), available.begin() + k_);
  d.wanted_ = std::move(wanted);
  // The rows of the sources, inverted, map the sources back to the data.
  std::vector<uint8_t> rows(static_cast<size_t>(k_) * k_);
  for (int r = 0; r < k_; ++r) {
    std::memcpy(&rows[r * k_], &matrix_[d.sources_[r] * k_], k_);
  }
  std::vector<uint8_t> inverse(rows.size());
  if (gf_invert_matrix(rows.data(), inverse.data(), k_) != 0) {
    return absl::InternalError(absl::StrCat(
        ToString(), ": the rows of blocks ", absl::StrJoin(d.sources_, ","),
        " are singular (cannot happen with a Cauchy matrix)"));
  }
  const size_t nw = d.wanted_.size();
  std::vector<uint8_t> decode(nw * k_, 0);
  for (size_t w = 0; w < nw; ++w) {
    const int block = d.wanted_[w];
    if (block < k_) {
      std::memcpy(&decode[w * k_], &inverse[block * k_], k_);
      continue;
    }
    // A parity block: its encoding row applied to the rebuilt data.
    for (int c = 0; c < k_; ++c) {
      uint8_t v = 0;
      for (int t = 0; t < k_; ++t) {
        v ^= gf_mul(matrix_[block * k_ + t], inverse[t * k_ + c]);
      }
      decode[w * k_ + c] = v;
    }
  }
  d.tables_.resize(32u * k_ * nw);
  ec_init_tables(k_, static_cast<int>(nw), decode.data(), d.tables_.data());
  return d;
}

void ErasureCode::Decoder::Decode(size_t len,
                                  absl::Span<const uint8_t* const> sources,
                                  absl::Span<uint8_t* const> out) const {
  if (len == 0) return;
  ec_encode_data(static_cast<int>(len), k_, static_cast<int>(wanted_.size()),
                 const_cast<uint8_t*>(tables_.data()),
                 const_cast<uint8_t**>(sources.data()),
                 const_cast<uint8_t**>(out.data()));
}

absl::StatusOr<std::vector<std::vector<uint8_t>>> ErasureCode::Rebuild(
    absl::Span<const absl::Span<const uint8_t>> blocks,
    const std::vector<bool>& present, const std::vector<uint64_t>& lengths,
    std::vector<int> wanted) const {
  std::vector<std::vector<uint8_t>> out(wanted.size());
  std::vector<absl::Span<uint8_t>> spans(wanted.size());
  for (size_t w = 0; w < wanted.size(); ++w) {
    if (wanted[w] >= 0 && static_cast<size_t>(wanted[w]) < lengths.size()) {
      out[w].resize(lengths[wanted[w]]);
    }
    spans[w] = absl::MakeSpan(out[w]);
  }
  absl::Status st = RebuildInto(blocks, present, lengths, std::move(wanted),
                                spans, /*threads=*/1);
  if (!st.ok()) return st;
  return out;
}

namespace {
// Whole blocks in memory, or arriving in order (`ready`).
class SpanFeed : public ErasureCode::SegmentFeed {
 public:
  SpanFeed(absl::Span<const absl::Span<const uint8_t>> blocks,
           const ErasureCode::Ready& ready)
      : blocks_(blocks), ready_(ready) {}
  absl::StatusOr<absl::Span<const uint8_t>> Acquire(int b,
                                                    uint64_t seg) override {
    const uint64_t off = seg * ErasureCode::kSegment;
    if (ready_) {
      absl::Status st = ready_(off + ErasureCode::kSegment);
      if (!st.ok()) return st;
    }
    const absl::Span<const uint8_t> block = blocks_[b];
    if (off >= block.size()) return absl::Span<const uint8_t>();
    return block.subspan(off, ErasureCode::kSegment);
  }
  void Release(uint64_t) override {}

 private:
  const absl::Span<const absl::Span<const uint8_t>> blocks_;
  const ErasureCode::Ready& ready_;
};

// Into the caller's buffers.
class SpanSink : public ErasureCode::SegmentSink {
 public:
  explicit SpanSink(absl::Span<const absl::Span<uint8_t>> out) : out_(out) {}
  absl::Status Put(size_t w, uint64_t off,
                   absl::Span<const uint8_t> bytes) override {
    std::memcpy(out_[w].data() + off, bytes.data(), bytes.size());
    return absl::OkStatus();
  }

 private:
  const absl::Span<const absl::Span<uint8_t>> out_;
};
}  // namespace

absl::StatusOr<uint64_t> ErasureCode::StripeOf(
    const std::vector<uint64_t>& lengths) const {
  const uint64_t stripe =
      *std::max_element(lengths.begin(), lengths.begin() + k_);
  for (int b = k_; b < k_ + m_; ++b) {
    if (lengths[b] != stripe) {
      return absl::InvalidArgumentError(
          absl::StrCat(ToString(), ": ", BlockName(b, k_), " is ", lengths[b],
                       " bytes, not the stripe's ", stripe));
    }
  }
  return stripe;
}

absl::Status ErasureCode::RebuildInto(
    absl::Span<const absl::Span<const uint8_t>> blocks,
    const std::vector<bool>& present, const std::vector<uint64_t>& lengths,
    std::vector<int> wanted, absl::Span<const absl::Span<uint8_t>> out,
    int threads, const Ready& ready) const {
  const int n = k_ + m_;
  if (static_cast<int>(blocks.size()) != n ||
      static_cast<int>(present.size()) != n ||
      static_cast<int>(lengths.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        ToString(), ": rebuild needs ", n,
        " blocks, presence flags and lengths"
        " (got ",
        blocks.size(), ", ", present.size(), ", ", lengths.size(), ")"));
  }
  RETURN_IF_ERROR(StripeOf(lengths).status());
  for (int b = 0; b < n; ++b) {
    if (present[b] && blocks[b].size() != lengths[b]) {
      return absl::InvalidArgumentError(absl::StrCat(
          ToString(), ": ", BlockName(b, k_), " has ", blocks[b].size(),
          " bytes, its record says ", lengths[b]));
    }
  }
  if (out.size() != wanted.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToString(), ": ", wanted.size(), " blocks wanted, ",
                     out.size(), " buffers"));
  }
  for (size_t w = 0; w < wanted.size(); ++w) {
    if (wanted[w] >= 0 && wanted[w] < n &&
        out[w].size() != lengths[wanted[w]]) {
      return absl::InvalidArgumentError(absl::StrCat(
          ToString(), ": the buffer for ", BlockName(wanted[w], k_), " holds ",
          out[w].size(), " bytes, the block is ", lengths[wanted[w]]));
    }
  }
  SpanFeed feed(blocks, ready);
  SpanSink sink(out);
  return RebuildStreamed(present, lengths, std::move(wanted), threads, feed,
                         sink);
}

absl::Status ErasureCode::RebuildStreamed(const std::vector<bool>& present,
                                          const std::vector<uint64_t>& lengths,
                                          std::vector<int> wanted, int threads,
                                          SegmentFeed& feed,
                                          SegmentSink& sink) const {
  const int n = k_ + m_;
  if (static_cast<int>(present.size()) != n ||
      static_cast<int>(lengths.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        ToString(), ": rebuild needs ", n, " presence flags and lengths (got ",
        present.size(), ", ", lengths.size(), ")"));
  }
  ASSIGN_OR_RETURN(const uint64_t stripe, StripeOf(lengths));
  std::vector<int> available;
  for (int b = 0; b < n; ++b) {
    if (present[b]) available.push_back(b);
  }
  absl::StatusOr<Decoder> decoder = MakeDecoder(available, std::move(wanted));
  if (!decoder.ok()) return decoder.status();
  const std::vector<int>& sources = decoder->sources();
  const size_t nw = decoder->wanted().size();
  const uint64_t segments = (stripe + kSegment - 1) / kSegment;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> stopped{false};
  absl::Mutex mu;
  absl::Status failed;
  auto fail = [&](absl::Status st) {
    absl::MutexLock lock(&mu);
    if (failed.ok()) failed = std::move(st);
    stopped = true;
  };
  // Segment after segment; a source shorter than a segment goes through a
  // zero-padded copy.
  auto work = [&] {
    std::vector<std::vector<uint8_t>> padded(k_),
        scratch(nw, std::vector<uint8_t>(std::min<uint64_t>(kSegment, stripe)));
    std::vector<const uint8_t*> in(k_);
    std::vector<uint8_t*> dest(nw);
    for (uint64_t seg = next++; seg < segments && !stopped; seg = next++) {
      const uint64_t off = seg * kSegment;
      const size_t len = std::min<uint64_t>(kSegment, stripe - off);
      for (int s = 0; s < k_; ++s) {
        absl::StatusOr<absl::Span<const uint8_t>> bytes =
            feed.Acquire(sources[s], seg);
        if (!bytes.ok()) return fail(bytes.status());
        if (bytes->size() >= len) {
          in[s] = bytes->data();
          continue;
        }
        padded[s].assign(len, 0);
        if (!bytes->empty()) {
          std::memcpy(padded[s].data(), bytes->data(), bytes->size());
        }
        in[s] = padded[s].data();
      }
      for (size_t w = 0; w < nw; ++w) dest[w] = scratch[w].data();
      decoder->Decode(len, in, dest);
      feed.Release(seg);
      for (size_t w = 0; w < nw; ++w) {
        const uint64_t length = lengths[decoder->wanted()[w]];
        if (off >= length) continue;
        absl::Status put =
            sink.Put(w, off,
                     absl::MakeConstSpan(
                         dest[w], std::min<uint64_t>(len, length - off)));
        if (!put.ok()) return fail(std::move(put));
      }
    }
  };
  io::RunOnThreads(static_cast<int>(std::min<int64_t>(threads, segments)) - 1,
                   work);
  absl::MutexLock lock(&mu);
  return failed;
}

}  // namespace ckpt::snapshot
