// Exact tiled (flash-style) attention on CPU: any query/key width E and value width Dv, grouped kv heads,
// causal masking by position with tile skipping, key padding, and a logit bias computed inside the kernel
// from positions (never a Tq x Tk tensor).
//
// Why it exists: CPU SDPA's flash kernel needs equal q/k and v widths (PoPE's q/k are 2d wide against a d-wide
// v) and takes a bias only as a materialised float mask, which it reads in full and with which it skips no
// causal tile. Here every (query tile x key tile) product goes through MKL's sgemm on tiles that stay in
// cache, the softmax is online (running row max and sum; the logsumexp is saved for the backward), tiles past
// a query tile's last visible key are skipped, and the bias of a tile is generated from the positions.
//
// Layout: q (B, H, Tq, E) contiguous, k (B, Hkv, Tk, E) and v (B, Hkv, Tk, Dv) with contiguous rows (their heads
// may lie apart: Problem::k_at); query head h reads kv head h / (H / Hkv). Positions: (P, Tq) and (P, Tk) int64
// with P = 1 (shared by the batch) or B. Causal *by position*: key s is visible to query t iff kpos[s] <= qpos[t];
// the key padding mask (B, Tk) bool hides keys.
//
// Bias forms (what an encoding declares, encodings/kernel_bias.py):
//   none;
//   distance table: table (H, R) fp32 over the distances d = qpos - kpos in [hi - R + 1, hi], added as
//     table[h, d - lo]; its gradient is accumulated in the backward;
//   offset embeddings (relative PE): emb (2M + 1, E) fp32, added as bias_scale * q_t . emb[clamp(d, -M, M) + M];
//     gradients for q and for emb.
// bf16 inputs: on a CPU with AVX512_BF16 (and a library built for AVX-512) the attention's products take bf16
// operands with fp32 accumulation through oneDNN's brgemm, on AMX tiles where the CPU has them ("bf16 products",
// section below): q, k, v and dO as given, the probabilities P and dS rounded to bf16 before their products, as
// bf16 flash-attention kernels (torch's CPU one included) do.
// Otherwise bf16 tiles are widened to fp32 and multiplied by sgemm (on CPUs without native bf16 arithmetic that is
// what every bf16 GEMM does inside). Softmax statistics and accumulators are fp32 either way; products with
// the bias parameters (relative PE's and CoPE's embeddings) stay fp32.
// Built by poskit/attention/kernel_build.py; the sgemm symbol comes from the MKL inside libtorch_cpu.

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#else
#define CPU_CAPABILITY DEFAULT
#endif

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/Context.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <type_traits>
#include <vector>

#ifdef CPU_CAPABILITY_AVX512
#include <immintrin.h>
#endif

extern "C" {
// MKL (LP64) as linked into libtorch_cpu: Fortran sgemm, column major
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
}

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kNone = 0, kTable = 1, kEmbeddings = 2;

// Row-major C (m x n) = alpha * op(A) op(B) + beta * C, op = transpose when the flag is set.
// (A row-major product is the column-major product of the transposes with the operands swapped.)
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // sgemm leaves C untouched for k = 0 only when beta = 1
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) c[r * ldc + j] = beta == 0.f ? 0.f : beta * c[r * ldc + j];
    return;
  }
  const char opa = ta ? 'T' : 'N', opb = tb ? 'T' : 'N';
  const int M = (int)m, N = (int)n, K = (int)k, LDA = (int)lda, LDB = (int)ldb, LDC = (int)ldc;
  sgemm_(&opb, &opa, &N, &M, &K, &alpha, b, &LDB, a, &LDA, &beta, c, &LDC);
}

// An input tile as fp32: itself for fp32 inputs, widened into `scratch` for bf16.
const float* widen(const float* src, int64_t, float*) { return src; }
// ... and back: an fp32 result stored in the output's dtype (a copy for fp32, rounded once for bf16).
void narrow(const float* src, int64_t n, float* dst) { std::memcpy(dst, src, n * sizeof(float)); }
void narrow(const float* src, int64_t n, at::BFloat16* dst) { at::vec::convert(src, dst, n); }
const float* widen(const at::BFloat16* src, int64_t n, float* scratch) {
  at::vec::convert(src, scratch, n);
  return scratch;
}

// Scratch memory that grows with the sequence (a head's keys, values and their gradients), taken from torch's CPU
// allocator rather than the heap, so that the memory torch's profiler reports for a call (the benchmarks' peak_MB)
// includes it. Not zeroed.
template <typename E>
class Scratch {
 public:
  explicit Scratch(int64_t n = 0) { grow(n); }
  E* grow(int64_t n) {
    if (n > size_) {
      buffer_ = at::empty({n * (int64_t)sizeof(E)}, at::TensorOptions().dtype(at::kByte));
      size_ = n;
    }
    return data();
  }
  E* data() { return size_ ? reinterpret_cast<E*>(buffer_.data_ptr()) : nullptr; }

 private:
  at::Tensor buffer_;
  int64_t size_ = 0;
};

// An operand in the bf16 products' packed layout (below), kept for many products: none (data null: each product
// packs its own), or a view of its columns from c0, a multiple of kBlockColumns (at_column), or of its pair rows
// from an even row r0 (at_row).
constexpr int64_t kBlockColumns = 64;
struct Packed {
  Scratch<uint32_t> store;
  const uint32_t* data = nullptr;
  int64_t block = 0;  // words from one block of kBlockColumns columns to the next
};
struct PackedView {
  const uint32_t* data = nullptr;
  int64_t block = 0;
};
inline PackedView at_column(const Packed& x, int64_t c0) {  // c0 % kBlockColumns == 0
  return x.data ? PackedView{x.data + c0 / kBlockColumns * x.block, x.block} : PackedView{};
}
inline PackedView at_row(const Packed& x, int64_t r0) {  // r0 even: a pair row starts there
  return x.data ? PackedView{x.data + r0 / 2 * kBlockColumns, x.block} : PackedView{};
}

// ---------------------------------------------------------------------------------------------------------------
// bf16 products: row-major C (m x n) = alpha op(A) op(B) + beta C with A and B rounded to bf16 (round to nearest
// even; exact for values that came from bf16) and accumulated in fp32 by oneDNN's brgemm micro-kernel, as torch
// exports it (at::native::cpublas::brgemm): it runs on AMX tiles where the CPU has them and on AVX512_BF16's
// dot products otherwise, the same instructions torch's own bf16 matrix products take there. brgemm wants A
// row-major and B in pairs along the inner dimension ("VNNI"): B is packed as blocks of kBlockColumns columns, each
// [inner pair][column]; A as [row][inner pair] (bf16 row-major with the inner size made even by a zero). The
// packing costs O((m + n) k) against the product's O(m n k). Compiled only into an AVX-512 library, for these
// functions alone (AVX512_BF16 is not part of x86-64-v4), and used only where the CPU reports it.
//
// oneDNN generates one micro-kernel per shape (rows, columns, inner size, strides) and torch keeps them per
// thread for the process's life; here the columns are always kBlockColumns, a tile's keys as an inner size are
// taken in whole groups of kInnerPairs pairs and C's stride directly only when a multiple of 16
// (gemm_bf16_packed), so their number stays bounded by the tiles even where a tile's size changes at every call
// (a decode step's last key tile).

// The distinct shapes the products pass to brgemm, recorded while asked (brgemm_shapes; tests count them).
std::atomic<bool> g_recording_shapes{false};
std::mutex g_shapes_mutex;
std::set<std::array<int64_t, 7>> g_shapes;

// The count of distinct shapes recorded since the last call, then recording on or off.
int64_t brgemm_shapes(bool record) {
  std::lock_guard<std::mutex> lock(g_shapes_mutex);
  const int64_t count = g_shapes.size();
  g_shapes.clear();
  g_recording_shapes = record;
  return count;
}

#ifdef CPU_CAPABILITY_AVX512
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// at::native::cpublas::brgemm on bf16 pairs ("VNNI") B, the shape recorded while brgemm_shapes asks.
void brgemm_bf16(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, bool add,
                 const at::BFloat16* a, const at::BFloat16* b, float* c) {
  if (g_recording_shapes.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(g_shapes_mutex);
    g_shapes.insert({m, n, k, lda, ldb, ldc, add});
  }
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, add, a, b, c, true);
}

// Whether torch's brgemm takes bf16 here: its oneDNN was built with the micro-kernels and accepts this CPU. Tried
// once on a 2 x 2 product (torch refuses with an error where it cannot).
bool brgemm_takes_bf16() {
  static const bool works = [] {
    try {
      const at::BFloat16 a[4] = {1.f, 2.f, 3.f, 4.f}, b[kBlockColumns * 2] = {};
      float c[2 * kBlockColumns];
      at::native::cpublas::brgemm(2, kBlockColumns, 2, 2, kBlockColumns, kBlockColumns, false, a, b, c, true);
      at::native::cpublas::brgemm_release(true);
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }();
  return works;
}

// AVX512_BF16 (without it a CPU has no bf16 arithmetic, and widening serves it; AMX CPUs have it), brgemm's
// micro-kernels, and oneDNN not switched off by the user (torch.backends.mkldnn.enabled, read per call as torch
// does).
bool cpu_has_bf16_products() {
  return __builtin_cpu_supports("avx512bf16") && at::globalContext().userEnabledMkldnn() && brgemm_takes_bf16();
}

// 16 values as bf16 bits (rounded from fp32, or as they are), lanes past the mask zero.
BF16_TARGET inline __m256i bf16_bits(const float* x, __mmask16 mask) {
  return (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x));
}
BF16_TARGET inline __m256i bf16_bits(const at::BFloat16* x, __mmask16 mask) {
  return _mm256_maskz_loadu_epi16(mask, x);
}

// 16 pairs (x0[i], x1[i]) as bf16, x1 = null: zeros (an odd inner size's last pair); lanes past the mask zero.
template <typename S>
BF16_TARGET inline __m512i bf16_pairs(const S* x0, const S* x1, __mmask16 mask) {
  const __m512i lo = _mm512_cvtepu16_epi32(bf16_bits(x0, mask));
  if (!x1) return lo;
  return _mm512_or_si512(lo, _mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16_bits(x1, mask)), 16));
}

inline __mmask16 lanes_mask(int64_t count) {
  const int64_t w = std::max<int64_t>(0, std::min<int64_t>(16, count));
  return (__mmask16)((1u << w) - 1);
}

// out[j * width + c] = (x[2j][c], x[2j + 1][c]) for a (k x n) row-major x with stride ld, c < width (a multiple of
// 16; zeros past n and past k).
template <typename S>
BF16_TARGET void pack_pairs_down(const S* x, int64_t ld, int64_t k, int64_t n, int64_t width, uint32_t* out) {
  for (int64_t j = 0; j < (k + 1) / 2; ++j) {
    const S* r0 = x + 2 * j * ld;
    const S* r1 = 2 * j + 1 < k ? r0 + ld : nullptr;
    for (int64_t c = 0; c < width; c += 16)
      _mm512_storeu_si512(out + j * width + c, bf16_pairs(r0 + c, r1 ? r1 + c : nullptr, lanes_mask(n - c)));
  }
}

// out[r * ldo + j] = (x[r][2j], x[r][2j + 1]) for rows of k values with stride ld (each row's values in pairs as
// they lie; a zero after an odd k, and zero pairs from (k + 1) / 2 to ldo; ldo 0: (k + 1) / 2).
template <typename S>
BF16_TARGET void pack_pairs_along(const S* x, int64_t ld, int64_t rows, int64_t k, uint32_t* out, int64_t ldo = 0) {
  const int64_t pairs = (k + 1) / 2;
  if (ldo == 0) ldo = pairs;
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* o = reinterpret_cast<uint16_t*>(out + r * ldo);
    for (int64_t c = 0; c < k; c += 16) {
      const __mmask16 mask = lanes_mask(k - c);
      _mm256_mask_storeu_epi16(o + c, mask, bf16_bits(x + r * ld + c, mask));
    }
    if (k & 1) o[k] = 0;
    std::fill(out + r * ldo + pairs, out + (r + 1) * ldo, 0u);
  }
}

// 16 x 16 words transposed: out[c * ldo + r] = x[r * ldx + c].
BF16_TARGET inline void transpose_16x16(const uint32_t* x, int64_t ldx, uint32_t* out, int64_t ldo) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(x + i * ldx);
  for (int i = 0; i < 16; i += 2) {  // 2 x 2 blocks of words
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4)  // 4 x 4
    for (int j = 0; j < 2; ++j) {
      r[i + j] = _mm512_unpacklo_epi64(t[i + j], t[i + j + 2]);
      r[i + j + 2] = _mm512_unpackhi_epi64(t[i + j], t[i + j + 2]);
    }
  for (int i = 0; i < 16; i += 8)  // 128-bit lanes
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
  // after the three steps, row i of the result sits in r[perm[i]]
  static constexpr int perm[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
  for (int i = 0; i < 16; ++i) _mm512_storeu_si512(out + i * ldo, r[perm[i]]);
}

// A words (rows x cols) with stride ldx transposed into out (cols x rows, stride ldo); rows and cols multiples of 16.
BF16_TARGET void transpose_words(const uint32_t* x, int64_t ldx, int64_t rows, int64_t cols, uint32_t* out,
                                 int64_t ldo) {
  for (int64_t r = 0; r < rows; r += 16)
    for (int64_t c = 0; c < cols; c += 16) transpose_16x16(x + r * ldx + c, ldx, out + c * ldo + r, ldo);
}

struct PackScratch {
  std::vector<uint32_t> a, a_down, rows, tail;
  std::vector<float> c;
  Packed b;
};

// This thread's packing scratch (grown on demand, kept between calls).
PackScratch& pack_scratch() {
  thread_local PackScratch scratch;
  return scratch;
}

// The (k x n) operand op(B) as [pair][column] with `width` columns a pair row: straight down B's rows, or, for B
// stored (n x k), each row in pairs and then the pairs' matrix transposed 16 x 16 words at a time.
template <typename S>
BF16_TARGET void pack_b(bool tb, const S* b, int64_t ldb, int64_t k, int64_t n, int64_t width, uint32_t* out,
                        std::vector<uint32_t>& rows) {
  if (!tb) return pack_pairs_down(b, ldb, k, n, width, out);
  const int64_t pairs = (k + 1) / 2, pairs16 = (pairs + 15) / 16 * 16;
  if ((int64_t)rows.size() < width * pairs16) rows.resize(width * pairs16);
  for (int64_t r = 0; r < width; ++r) {  // row r: B's row r in pairs, zeros past pairs and past n
    uint32_t* o = rows.data() + r * pairs16;
    if (r < n) pack_pairs_along(b + r * ldb, ldb, 1, k, o);
    std::fill(o + (r < n ? pairs : 0), o + pairs16, 0u);
  }
  if (pairs == pairs16) return transpose_words(rows.data(), pairs16, width, pairs16, out, width);
  std::vector<uint32_t>& full = pack_scratch().a_down;  // (pairs16 x width), its first `pairs` rows kept
  if ((int64_t)full.size() < pairs16 * width) full.resize(pairs16 * width);
  transpose_words(rows.data(), pairs16, width, pairs16, full.data(), width);
  std::memcpy(out, full.data(), pairs * width * sizeof(uint32_t));
}

// op(B) (k x n) packed for many products: blocks of kBlockColumns columns (zeros past n), each (k + 1) / 2 pair rows
// of kBlockColumns words.
template <typename S>
BF16_TARGET void pack_operand(bool tb, const S* b, int64_t ldb, int64_t k, int64_t n, Packed* out) {
  const int64_t pairs = (k + 1) / 2, blocks = (n + kBlockColumns - 1) / kBlockColumns;
  out->block = pairs * kBlockColumns;
  uint32_t* store = out->store.grow(std::max<int64_t>(1, blocks * out->block));
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t c0 = i * kBlockColumns;
    pack_b(tb, tb ? b + c0 * ldb : b + c0, ldb, k, std::min(kBlockColumns, n - c0), kBlockColumns,
           store + i * out->block, pack_scratch().rows);
  }
  out->data = store;
}

// The product with op(B) packed (pack_operand, or a view of one): brgemm per block of columns, straight into C when
// it takes the whole block as it is (alpha 1, beta 0 or 1, a leading dimension that is a multiple of 16), else into
// scratch and then C = alpha . + beta C.
//
// oneDNN generates code for every new shape brgemm is called with (inner size, leading dimensions, rows), and torch
// keeps it for the process's life. A decode step's last key tile grows by one key per step, so taken as it is, the
// weighted values' inner size (and the logits' leading dimension, where they go straight into C) were a new shape at
// nearly every step: over the first 512 steps of a bf16 decode the process grew by hundreds of MB, most of it heap
// freed but kept by glibc, less the fewer new shapes (docs/benchmarks.md, "bf16 products through oneDNN's
// brgemm"). So C's leading dimension is taken directly only when it is a multiple of 16, and a product whose inner
// size varies from call to call (`varying_inner`: a tile's keys) takes it as whole groups of kInnerPairs pairs and
// one more group from a zero-padded copy of B's last pair rows (A's packed rows zero-padded to match): at most
// (tile's keys / 64) + 1 shapes. Finer groups left more behind (512 bf16 attention calls at growing key counts, a
// scratch comparison: groups of 8 pairs 94 MB, of 32 pairs 25 MB), and constant inner sizes (head widths) are
// taken whole, as they are, unpadded.
constexpr int64_t kInnerPairs = 32;
BF16_TARGET void gemm_bf16_packed(bool ta, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                                  PackedView b, float beta, float* c, int64_t ldc, bool varying_inner = false) {
  if (m == 0 || n == 0) return;
  PackScratch& scratch = pack_scratch();
  const int64_t pairs = (k + 1) / 2;
  // the pairs taken straight from B, and those from the zero-padded copy of its last pair rows (its padded size)
  const int64_t whole = varying_inner ? pairs / kInnerPairs * kInnerPairs : pairs, rest = pairs - whole;
  const int64_t rest_padded = rest ? kInnerPairs : 0;
  const uint32_t* packed_a;
  int64_t a_pairs;  // A's packed rows are this many pairs apart (brgemm's leading dimension, in pairs)
  if (ta) {  // A stored (k x m): its columns in pairs ([pair][row]), then transposed to rows of a_pairs, read as
    // they lie (the pairs past `pairs` are zeros)
    const int64_t m16 = (m + 15) / 16 * 16;
    a_pairs = std::max((pairs + 15) / 16 * 16, whole + rest_padded);
    if ((int64_t)scratch.a_down.size() < a_pairs * m16) scratch.a_down.resize(a_pairs * m16);
    pack_pairs_down(a, lda, k, m, m16, scratch.a_down.data());
    std::fill(scratch.a_down.begin() + pairs * m16, scratch.a_down.begin() + a_pairs * m16, 0u);
    if ((int64_t)scratch.rows.size() < m16 * a_pairs) scratch.rows.resize(m16 * a_pairs);
    transpose_words(scratch.a_down.data(), m16, a_pairs, m16, scratch.rows.data(), a_pairs);
    packed_a = scratch.rows.data();
  } else {  // rows of pairs, zeros up to the padded rest
    a_pairs = whole + rest_padded;
    if ((int64_t)scratch.a.size() < m * a_pairs) scratch.a.resize(m * a_pairs);
    pack_pairs_along(a, lda, m, k, scratch.a.data(), a_pairs);
    packed_a = scratch.a.data();
  }
  const auto* A = reinterpret_cast<const at::BFloat16*>(packed_a);
  if ((int64_t)scratch.tail.size() < rest_padded * kBlockColumns) scratch.tail.resize(rest_padded * kBlockColumns);
  const bool direct = alpha == 1.f && (beta == 0.f || beta == 1.f) && ldc % 16 == 0;
  // C (m x kBlockColumns, stride ldo) = or += A B for one block of B's columns: the pairs straight from B, then the
  // rest from the zero-padded copy of its last pair rows
  auto block_product = [&](const uint32_t* block, float* out, int64_t ldo, bool add) {
    if (!whole && !rest && !add) {  // an empty inner size: A B = 0
      for (int64_t r = 0; r < m; ++r) std::fill(out + r * ldo, out + r * ldo + kBlockColumns, 0.f);
      return;
    }
    if (whole) {
      brgemm_bf16(m, kBlockColumns, 2 * whole, 2 * a_pairs, kBlockColumns, ldo, add, A,
                  reinterpret_cast<const at::BFloat16*>(block), out);
      add = true;
    }
    if (rest) {
      uint32_t* t = scratch.tail.data();
      std::memcpy(t, block + whole * kBlockColumns, rest * kBlockColumns * sizeof(uint32_t));
      std::fill(t + rest * kBlockColumns, t + rest_padded * kBlockColumns, 0u);
      brgemm_bf16(m, kBlockColumns, 2 * rest_padded, 2 * a_pairs, kBlockColumns, ldo, add, A + 2 * whole,
                  reinterpret_cast<const at::BFloat16*>(t), out);
    }
  };
  for (int64_t c0 = 0; c0 < n; c0 += kBlockColumns) {
    const int64_t cols = std::min(kBlockColumns, n - c0);
    const uint32_t* block = b.data + c0 / kBlockColumns * b.block;
    if (direct && cols == kBlockColumns) {
      block_product(block, c + c0, ldc, beta == 1.f);
      continue;
    }
    if ((int64_t)scratch.c.size() < m * kBlockColumns) scratch.c.resize(m * kBlockColumns);
    float* t = scratch.c.data();
    block_product(block, t, kBlockColumns, false);
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < cols; j += 16) {
        const __mmask16 mask = lanes_mask(cols - j);
        float* out = c + r * ldc + c0 + j;
        __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, t + r * kBlockColumns + j), va);
        if (beta != 0.f) x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask, out), x);  // (beta 0: C is not read)
        _mm512_mask_storeu_ps(out, mask, x);
      }
  }
}

// The same with op(B) packed for this product alone.
BF16_TARGET void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                           bool varying_inner = false) {
  if (m == 0 || n == 0) return;
  Packed& packed = pack_scratch().b;
  pack_operand(tb, b, ldb, k, n, &packed);
  gemm_bf16_packed(ta, m, n, k, alpha, a, lda, at_column(packed, 0), beta, c, ldc, varying_inner);
}

// The tile registers brgemm may have configured (AMX) handed back, at the end of a thread's share of a call.
void release_products(bool used) {
  if (used) at::native::cpublas::brgemm_release(true);
}
#else
bool cpu_has_bf16_products() { return false; }
void gemm_bf16(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float,
               float*, int64_t, bool = false) {
  TORCH_CHECK(false, "cpu_flash: bf16 products need a library built for AVX-512");
}
template <typename S>
void pack_operand(bool, const S*, int64_t, int64_t, int64_t, Packed*) {
  TORCH_CHECK(false, "cpu_flash: bf16 products need a library built for AVX-512");
}
void gemm_bf16_packed(bool, int64_t, int64_t, int64_t, float, const float*, int64_t, PackedView, float, float*,
                      int64_t, bool = false) {
  TORCH_CHECK(false, "cpu_flash: bf16 products need a library built for AVX-512");
}
void release_products(bool) {}
#endif

float lanes_max(const Vec& v) {
  float tmp[Vec::size()];
  v.store(tmp);
  return *std::max_element(tmp, tmp + Vec::size());
}

float lanes_sum(const Vec& v) {
  float tmp[Vec::size()], total = 0.f;
  v.store(tmp);
  for (int i = 0; i < Vec::size(); ++i) total += tmp[i];
  return total;
}

float row_max(const float* x, int64_t n) {
  int64_t c = 0;
  float best = kNegInf;
  if (n >= Vec::size()) {
    Vec acc = Vec::loadu(x);
    for (c = Vec::size(); c + Vec::size() <= n; c += Vec::size()) acc = at::vec::maximum(acc, Vec::loadu(x + c));
    best = lanes_max(acc);
  }
  for (; c < n; ++c) best = std::max(best, x[c]);
  return best;
}

float row_sum(const float* x, int64_t n) {
  Vec acc(0.f);
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) acc = acc + Vec::loadu(x + c);
  float sum = lanes_sum(acc);
  for (; c < n; ++c) sum += x[c];
  return sum;
}

// x[c] = exp(x[c] - shift) in place; returns the sum. exp_u20: the vectorised exp torch's own CPU flash kernel
// uses (about 20 ulp); exp(-inf) is 0, so hidden keys drop out.
float exp_shifted(float* x, int64_t n, float shift) {
  const Vec s(shift);
  Vec acc(0.f);
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) {
    Vec e = (Vec::loadu(x + c) - s).exp_u20();
    e.store(x + c);
    acc = acc + e;
  }
  float sum = lanes_sum(acc);
  for (; c < n; ++c) {
    x[c] = std::exp(x[c] - shift);
    sum += x[c];
  }
  return sum;
}

void scale_row(float* x, int64_t n, float factor) {
  const Vec f(factor);
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) (Vec::loadu(x + c) * f).store(x + c);
  for (; c < n; ++c) x[c] *= factor;
}

void add_row(float* x, const float* y, int64_t n) {  // x += y
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) (Vec::loadu(x + c) + Vec::loadu(y + c)).store(x + c);
  for (; c < n; ++c) x[c] += y[c];
}

void add_scalar(float* x, float y, int64_t n) {
  const Vec v(y);
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) (Vec::loadu(x + c) + v).store(x + c);
  for (; c < n; ++c) x[c] += y;
}

struct Problem {
  int64_t B, H, Hkv, g, Tq, Tk, E, Dv, bq, bk, tiles;
  // k's and v's strides across batches and heads (their rows are contiguous, heads need not be: a KV cache's keys
  // are a view of a buffer with room to grow, its heads `capacity` rows apart, read where they lie)
  int64_t k_batch, k_head, v_batch, v_head;
  float scale;
  bool causal;
  int64_t pos_rows;                  // 1 or B; 0 when no positions are needed
  const int64_t *qpos, *kpos;        // (pos_rows, Tq), (pos_rows, Tk)
  std::vector<uint8_t> sorted, contiguous;  // per position row: keys ascending / kpos[s + 1] == kpos[s] + 1
  const bool* pad;                   // (B, Tk) or null
  int bias;                          // kNone, kTable, kEmbeddings
  // kTable: rev (H, R) with rev[h, j] the bias of distance hi - j (reversed, so that a run of consecutive keys
  // reads it forward)
  std::vector<float> rev;
  int64_t R, hi;
  // kEmbeddings: emb_rev (2M + 1, E), row i the embedding of offset M - i
  std::vector<float> emb_rev;
  int64_t M;
  float bias_scale;
  bool bf16_products = false;  // the attention's products with bf16 operands (bf16 inputs, a CPU with AVX512_BF16)

  const int64_t* qp(int64_t b) const { return qpos + (pos_rows == 1 ? 0 : b) * Tq; }
  const int64_t* kp(int64_t b) const { return kpos + (pos_rows == 1 ? 0 : b) * Tk; }
  int64_t row(int64_t b) const { return pos_rows == 1 ? 0 : b; }
  // where query head h's keys and values start in batch b
  int64_t k_at(int64_t b, int64_t h) const { return b * k_batch + h / g * k_head; }
  int64_t v_at(int64_t b, int64_t h) const { return b * v_batch + h / g * v_head; }
};

// The attention's own products (q k^T, P v and the backward's four), with bf16 operands where the call asks for it;
// products with the bias parameters call gemm (fp32) directly.
// packed: op(B) packed already for the bf16 products (b is then not read; may be null). varying_inner: k is a
// tile's keys, which may change from call to call (gemm_bf16_packed says why that matters).
void product(const Problem& p, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
             int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, PackedView packed = {},
             bool varying_inner = false) {
  if (p.bf16_products && packed.data)
    gemm_bf16_packed(ta, m, n, k, alpha, a, lda, packed, beta, c, ldc, varying_inner);
  else if (p.bf16_products) gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, varying_inner);
  else gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// One thread's share of a call's products: hands brgemm's tile registers back when it ends (even by an exception).
struct ProductsSession {
  explicit ProductsSession(bool bf16_products) : used(bf16_products) {}
  ~ProductsSession() { release_products(used); }
  bool used;
};

// base + n, or null for a null base (a packed head's keys and values are not kept as fp32 rows).
inline const float* offset(const float* base, int64_t n) { return base ? base + n : nullptr; }

// Whether a call's heads are packed once for the bf16 products: with them, and key tiles that start on a block of
// the packing's columns (then also on even keys: a pair row of the values' packing must not straddle two tiles). Even a decode step, which reads each pack once,
// is faster so than packing per product (B=8, H=8, 8192 keys on the AVX-512 AMD EPYC: 14.5-16.3 against
// 18.4-21.9 ms per step, two alternations of benchmarks/attention.py's decode rows, measured with the hand-written
// AVX512_BF16 products that brgemm replaced); the cost is one kv head's packed keys and values per thread.
bool packs_heads(const Problem& p) { return p.bf16_products && p.bk % kBlockColumns == 0; }

// [key_end, full_end) of a query tile: keys past key_end are hidden from the whole tile (skipped), keys before
// full_end are visible to all of it (no causal mask); with unsorted keys every key is scanned and masked.
void tile_keys(const Problem& p, int64_t b, int64_t q0, int64_t rows, int64_t* key_end, int64_t* full_end) {
  if (!p.causal) {
    *key_end = p.Tk;
    *full_end = p.Tk;
    return;
  }
  if (!p.sorted[p.row(b)]) {
    *key_end = p.Tk;
    *full_end = 0;
    return;
  }
  const int64_t* qp = p.qp(b) + q0;
  const int64_t* kp = p.kp(b);
  const int64_t lo = *std::min_element(qp, qp + rows), hi = *std::max_element(qp, qp + rows);
  *key_end = std::upper_bound(kp, kp + p.Tk, hi) - kp;
  *full_end = std::upper_bound(kp, kp + p.Tk, lo) - kp;
}

// Whether any key of [k0, k0 + n) of batch row b is padding.
bool has_padding(const Problem& p, int64_t b, int64_t k0, int64_t n) {
  if (!p.pad) return false;
  const bool* row = p.pad + b * p.Tk + k0;
  for (int64_t c = 0; c < n; ++c)
    if (!row[c]) return true;
  return false;
}

// s (rows x n) for queries [q0, q0 + rows) and keys [k0, k0 + n): -inf where the key is later or padding.
void mask_tile(const Problem& p, int64_t b, float* s, int64_t rows, int64_t n, int64_t q0, int64_t k0,
               bool causal_part, bool padded) {
  const int64_t* qp = p.causal ? p.qp(b) : nullptr;
  const int64_t* kp = p.causal ? p.kp(b) : nullptr;
  const bool* pad = padded ? p.pad + b * p.Tk + k0 : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * n;
    if (causal_part) {
      const int64_t limit = qp[q0 + r];
      for (int64_t c = 0; c < n; ++c)
        if (kp[k0 + c] > limit) row[c] = kNegInf;
    }
    if (pad)
      for (int64_t c = 0; c < n; ++c)
        if (!pad[c]) row[c] = kNegInf;
  }
}

// The table bias of head h added to s (rows x n).
void add_table_bias(const Problem& p, int64_t b, int64_t h, float* s, int64_t rows, int64_t n, int64_t q0,
                    int64_t k0) {
  const float* rev = p.rev.data() + h * p.R;
  const int64_t* qp = p.qp(b) + q0;
  const int64_t* kp = p.kp(b) + k0;
  if (p.contiguous[p.row(b)]) {  // key c has distance qp[r] - kp[0] - c: rev read forward from hi - (qp[r] - kp[0])
    for (int64_t r = 0; r < rows; ++r) add_row(s + r * n, rev + (p.hi - (qp[r] - kp[0])), n);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * n;
    for (int64_t c = 0; c < n; ++c) row[c] += rev[p.hi - (qp[r] - kp[c])];
  }
}

// The table's gradient: the gradient of every logit summed into its distance (rows of head h's reversed table).
void table_grad(const Problem& p, int64_t b, float* drev, const float* ds, int64_t rows, int64_t n, int64_t q0,
                int64_t k0) {
  const int64_t* qp = p.qp(b) + q0;
  const int64_t* kp = p.kp(b) + k0;
  if (p.contiguous[p.row(b)]) {
    for (int64_t r = 0; r < rows; ++r) add_row(drev + (p.hi - (qp[r] - kp[0])), ds + r * n, n);
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) drev[p.hi - (qp[r] - kp[c])] += ds[r * n + c];
}

// Offset embeddings: the offsets of a tile, clamped to [-M, M], span [o_min, o_max]; z (rows x (o_max - o_min + 1))
// holds bias_scale * q_t . emb[o] with column j for offset o_max - j (emb_rev's rows M - o_max on).
struct OffsetSpan {
  int64_t o_min, o_max;
  int64_t width() const { return o_max - o_min + 1; }
};

OffsetSpan offset_span(const Problem& p, int64_t b, int64_t rows, int64_t n, int64_t q0, int64_t k0) {
  const int64_t* qp = p.qp(b) + q0;
  const int64_t* kp = p.kp(b) + k0;
  const auto [qlo, qhi] = std::minmax_element(qp, qp + rows);
  const auto [klo, khi] = std::minmax_element(kp, kp + n);
  const auto clamp = [&](int64_t o) { return std::min(std::max(o, -p.M), p.M); };
  return {clamp(*qlo - *khi), clamp(*qhi - *klo)};
}

// For each row r, calls f(c_begin, c_end, j_at_c_begin, step) over runs of keys: step 1 for a run whose offsets
// (clamped) map to consecutive columns of z, step 0 for a run that all maps to one column.
template <typename F>
void offset_runs(const Problem& p, int64_t b, const OffsetSpan& span, int64_t r, int64_t n, int64_t q0, int64_t k0,
                 F f) {
  const int64_t* qp = p.qp(b);
  const int64_t* kp = p.kp(b) + k0;
  const int64_t t = qp[q0 + r];
  if (p.contiguous[p.row(b)]) {  // offset of key c: o0 - c
    const int64_t o0 = t - kp[0];
    const int64_t c1 = std::min(std::max<int64_t>(o0 - p.M, 0), n);      // c < c1: offset > M
    const int64_t c2 = std::min(std::max<int64_t>(o0 + p.M + 1, c1), n); // c >= c2: offset < -M
    if (c1 > 0) f(0, c1, span.o_max - p.M, 0);
    if (c2 > c1) f(c1, c2, span.o_max - (o0 - c1), 1);
    if (n > c2) f(c2, n, span.o_max + p.M, 0);
    return;
  }
  for (int64_t c = 0; c < n; ++c) {
    const int64_t o = std::min(std::max(t - kp[c], -p.M), p.M);
    f(c, c + 1, span.o_max - o, 0);
  }
}

void add_embedding_bias(const Problem& p, int64_t b, const OffsetSpan& span, const float* z, float* s, int64_t rows,
                        int64_t n, int64_t q0, int64_t k0) {
  const int64_t w = span.width();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * n;
    const float* zr = z + r * w;
    offset_runs(p, b, span, r, n, q0, k0, [&](int64_t c0, int64_t c1, int64_t j, int step) {
      if (step) add_row(row + c0, zr + j, c1 - c0);
      else add_scalar(row + c0, zr[j], c1 - c0);
    });
  }
}

void embedding_grad_z(const Problem& p, int64_t b, const OffsetSpan& span, float* dz, const float* ds, int64_t rows,
                      int64_t n, int64_t q0, int64_t k0) {
  const int64_t w = span.width();
  std::fill(dz, dz + rows * w, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = ds + r * n;
    float* dzr = dz + r * w;
    offset_runs(p, b, span, r, n, q0, k0, [&](int64_t c0, int64_t c1, int64_t j, int step) {
      if (step) add_row(dzr + j, row + c0, c1 - c0);
      else dzr[j] += row_sum(row + c0, c1 - c0);
    });
  }
}

// The bias of head h and the mask applied to the logits s (rows x n) of queries [q0, q0 + rows) and keys
// [k0, k0 + n); qt (rows x E, fp32): the rows' queries (relative PE's bias is bias_scale q_t . e).
void bias_and_mask(const Problem& p, int64_t b, int64_t h, float* s, std::vector<float>& z, const float* qt,
                   int64_t rows, int64_t n, int64_t q0, int64_t k0, int64_t full_end, OffsetSpan* span) {
  if (p.bias == kTable) {
    add_table_bias(p, b, h, s, rows, n, q0, k0);
  } else if (p.bias == kEmbeddings) {
    *span = offset_span(p, b, rows, n, q0, k0);
    const float* emb = p.emb_rev.data() + (p.M - span->o_max) * p.E;
    if ((int64_t)z.size() < rows * span->width()) z.resize(rows * span->width());
    gemm(false, true, rows, span->width(), p.E, p.bias_scale, qt, p.E, emb, p.E, 0.f, z.data(), span->width());
    add_embedding_bias(p, b, *span, z.data(), s, rows, n, q0, k0);
  }
  const bool causal_part = p.causal && k0 + n > full_end;
  const bool padded = has_padding(p, b, k0, n);
  if (causal_part || padded) mask_tile(p, b, s, rows, n, q0, k0, causal_part, padded);
}

// The logits of one tile: scale q k^T, the bias, the mask. qt (rows x E), kt (n x E) fp32, or kpacked: the tile's
// keys packed for the bf16 products (kt then unread).
void tile_logits(const Problem& p, int64_t b, int64_t h, float* s, std::vector<float>& z, const float* qt,
                 const float* kt, int64_t rows, int64_t n, int64_t q0, int64_t k0, int64_t full_end, OffsetSpan* span,
                 PackedView kpacked = {}) {
  product(p, false, true, rows, n, p.E, p.scale, qt, p.E, kt, p.E, 0.f, s, n, kpacked);
  bias_and_mask(p, b, h, s, z, qt, rows, n, q0, k0, full_end, span);
}

// The online softmax over one tile of logits s (rows x n): the running max m and sum l of each row and its
// accumulator acc (rows x Dv) rescaled; s holds the tile's unnormalised weights on return.
void softmax_step(int64_t Dv, float* s, int64_t rows, int64_t n, float* m, float* l, float* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * n;
    const float m_new = std::max(m[r], row_max(row, n));
    if (m_new == kNegInf) {  // nothing visible to this query yet: its weights in this tile are 0
      std::fill(row, row + n, 0.f);
      continue;
    }
    const float rescale = std::exp(m[r] - m_new);  // 0 when m was -inf
    l[r] = l[r] * rescale + exp_shifted(row, n, m_new);
    if (rescale != 1.f) scale_row(acc + r * Dv, Dv, rescale);
    m[r] = m_new;
  }
}

// The output rows acc / l in the output's dtype and their logsumexp; a query that sees no key outputs zeros
// (the engine's convention) with logsumexp -inf.
template <typename T>
void finish_rows(const Problem& p, T* out, float* lse, int64_t rows, const float* m, const float* l,
                 const float* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    T* o = out + r * p.Dv;
    const float* a = acc + r * p.Dv;
    if (l[r] == 0.f) {
      std::fill(o, o + p.Dv, T(0.f));
      lse[r] = kNegInf;
      continue;
    }
    const float inv = 1.f / l[r];
    for (int64_t c = 0; c < p.Dv; ++c) o[c] = T(a[c] * inv);
    lse[r] = m[r] + std::log(l[r]);
  }
}

// What the forward's frame hands the body for one query tile of one head.
struct ForwardTile {
  int64_t b, h, bh, q0, rows, ke, fe;
  const float* qt;  // the tile's queries (fp32)
  const Packed* keys;  // the head's keys packed for the bf16 products (packs_heads), else one with no data
};

// The forward's frame, shared by every form the kernel serves: one task per (batch, query head, query tile), the
// online softmax over its key tiles (walked forwards, or backwards for a body that accumulates over later keys)
// and the output rows with their logsumexp. The body: start(state, t) once per query tile;
// logits(state, t, s, kt, k0, n) fills the logits (rows x n) of keys [k0, k0 + n) in s; done(state, t) after the
// tile's rows are written. make_state() builds one thread's scratch.
template <typename T, typename MakeState, typename Start, typename Logits, typename Done>
void forward_frame(const Problem& p, const T* q, const T* k, const T* v, T* out, float* lse, bool backwards,
                   MakeState make_state, Start start, Logits logits, Done done) {
  constexpr bool wide = !std::is_same<T, float>::value;
  const bool packed = packs_heads(p);
  at::parallel_for(0, p.B * p.H * p.tiles, 1, [&](int64_t begin, int64_t end) {
    const ProductsSession session(p.bf16_products);
    auto state = make_state();
    std::vector<float> s(p.bq * p.bk), acc(p.bq * p.Dv), m(p.bq), l(p.bq);
    std::vector<float> qbuf(wide ? p.bq * p.E : 0), kbuf(wide && !packed ? p.bk * p.E : 0),
        vbuf(wide && !packed ? p.bk * p.Dv : 0);
    // with the bf16 products, this thread's current kv head packed once (a thread's tasks run through the query
    // tiles of one head after another, each reading the same keys and values)
    Packed keys, values;
    int64_t packed_kvh = -1;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / p.tiles, tile = task % p.tiles, b = bh / p.H, h = bh % p.H;
      const int64_t kvh = b * p.Hkv + h / p.g;
      if (packed && kvh != packed_kvh) {
        pack_operand(true, k + p.k_at(b, h), p.E, p.E, p.Tk, &keys);
        pack_operand(false, v + p.v_at(b, h), p.Dv, p.Tk, p.Dv, &values);
        packed_kvh = kvh;
      }
      const int64_t q0 = tile * p.bq, rows = std::min(p.bq, p.Tq - q0);
      int64_t ke, fe;
      tile_keys(p, b, q0, rows, &ke, &fe);
      const ForwardTile t{b, h, bh, q0, rows, ke, fe, widen(q + (bh * p.Tq + q0) * p.E, rows * p.E, qbuf.data()),
                          &keys};
      start(state, t);
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.f);
      const int64_t tiles = (ke + p.bk - 1) / p.bk;
      for (int64_t i = 0; i < tiles; ++i) {
        const int64_t k0 = (backwards ? tiles - 1 - i : i) * p.bk, n = std::min(p.bk, ke - k0);
        const float* kt = packed ? nullptr : widen(k + p.k_at(b, h) + k0 * p.E, n * p.E, kbuf.data());
        logits(state, t, s.data(), kt, k0, n);
        softmax_step(p.Dv, s.data(), rows, n, m.data(), l.data(), acc.data());
        const float* vt = packed ? nullptr : widen(v + p.v_at(b, h) + k0 * p.Dv, n * p.Dv, vbuf.data());
        product(p, false, false, rows, p.Dv, n, 1.f, s.data(), n, vt, p.Dv, 1.f, acc.data(), p.Dv,
                at_row(values, k0), true);
      }
      finish_rows(p, out + (bh * p.Tq + q0) * p.Dv, lse + bh * p.Tq + q0, rows, m.data(), l.data(), acc.data());
      done(state, t);
    }
  });
}

// The forward of the plain and positional-bias forms.
template <typename T>
void forward_kernel(const Problem& p, const T* q, const T* k, const T* v, T* out, float* lse) {
  auto nothing = [](std::vector<float>&, const ForwardTile&) {};
  forward_frame<T>(p, q, k, v, out, lse, false, [] { return std::vector<float>(); },  // z: grown on demand
                   nothing, [&](std::vector<float>& z, const ForwardTile& t, float* s, const float* kt, int64_t k0,
                                int64_t n) {
                     OffsetSpan span{};
                     tile_logits(p, t.b, t.h, s, z, t.qt, kt, t.rows, n, t.q0, k0, t.fe, &span,
                                 at_column(*t.keys, k0));
                   },
                   nothing);
}

// dS = P * (dP - rowsum(dO * O)) over n entries of one row, in place in d (p: the row's P).
void softmax_grad_row(const float* pr, float* d, int64_t n, float delta) {
  const Vec sub(delta);
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) (Vec::loadu(pr + c) * (Vec::loadu(d + c) - sub)).store(d + c);
  for (; c < n; ++c) d[c] = pr[c] * (d[c] - delta);
}

// What the backward's frame hands the body for one query tile of one head: q and dO of the tile and the head's
// keys and values (fp32), its logsumexp and delta rows, and the accumulators of dQ (the tile's, zeroed; the body
// leaves dS's scale applied) and of the head's dK and dV.
struct BackwardTile {
  int64_t b, h, q0, rows, ke, fe;
  const float *qt, *dot, *kh, *vh, *lse, *delta;
  float *dq_acc, *dk_acc, *dv_acc;
  // with the bf16 products (packs_heads), the head packed once: keys as q k^T and values as dO v^T take them
  // (columns: keys), keys as dS k takes them (pair rows: keys); otherwise with no data
  const Packed *keys_across, *values_across, *keys_down;
};

// The backward's frame, shared by every form the kernel serves. One task per (batch, query head): it owns that
// head's dK and dV (summed over the heads of a kv group by the caller), so no accumulation crosses threads except
// the parameters' (per-thread buffers, in the body's state). For every query tile it calls tile(state, t), where
// the body visits the tile's key tiles once each (S recomputed, dV, dP, dQ, dK, as in FlashAttention-2's
// backward), then writes the tile's dQ; dK is scaled by the attention scale at the end of the head.
// O, the gradients' dtype: fp32 (accumulated in place, zeroed by the caller), or the inputs' bf16, written once
// per head from fp32 accumulators of the thread (so that a bf16 call holds no fp32 copy of its gradients).
// make_state() builds one thread's scratch for the body.
template <typename T, typename O, typename MakeState, typename Tile>
void backward_frame(const Problem& p, const T* q, const T* k, const T* v, const T* dout, const float* lse,
                    const float* delta, O* dq, O* dk, O* dv, MakeState make_state, Tile tile) {
  constexpr bool wide = !std::is_same<T, float>::value;
  constexpr bool in_place = std::is_same<O, float>::value;
  const bool packed = packs_heads(p);
  at::parallel_for(0, p.B * p.H, 1, [&](int64_t begin, int64_t end) {
    const ProductsSession session(p.bf16_products);
    auto state = make_state();
    Packed keys_across, values_across, keys_down;
    int64_t packed_kvh = -1;
    std::vector<float> dq_acc(p.bq * p.E);
    std::vector<float> qbuf(wide ? p.bq * p.E : 0), dobuf(wide ? p.bq * p.Dv : 0);
    Scratch<float> kbuf(wide && !packed ? p.Tk * p.E : 0), vbuf(wide && !packed ? p.Tk * p.Dv : 0);
    Scratch<float> dk_own(in_place ? 0 : p.Tk * p.E), dv_own(in_place ? 0 : p.Tk * p.Dv);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / p.H, h = bh % p.H, kvh = b * p.Hkv + h / p.g;
      float* dk_acc = in_place ? reinterpret_cast<float*>(dk + bh * p.Tk * p.E) : dk_own.data();
      float* dv_acc = in_place ? reinterpret_cast<float*>(dv + bh * p.Tk * p.Dv) : dv_own.data();
      if (!in_place) {
        std::fill(dk_acc, dk_acc + p.Tk * p.E, 0.f);
        std::fill(dv_acc, dv_acc + p.Tk * p.Dv, 0.f);
      }
      // packed heads: the products read the packs alone, so the head is not widened to fp32 at all
      const float* kh = packed ? nullptr : widen(k + p.k_at(b, h), p.Tk * p.E, kbuf.data());
      const float* vh = packed ? nullptr : widen(v + p.v_at(b, h), p.Tk * p.Dv, vbuf.data());
      if (packed && kvh != packed_kvh) {
        pack_operand(true, k + p.k_at(b, h), p.E, p.E, p.Tk, &keys_across);
        pack_operand(true, v + p.v_at(b, h), p.Dv, p.Dv, p.Tk, &values_across);
        pack_operand(false, k + p.k_at(b, h), p.E, p.Tk, p.E, &keys_down);
        packed_kvh = kvh;
      }
      for (int64_t tile_index = 0; tile_index < p.tiles; ++tile_index) {
        const int64_t q0 = tile_index * p.bq, rows = std::min(p.bq, p.Tq - q0);
        int64_t ke, fe;
        tile_keys(p, b, q0, rows, &ke, &fe);
        std::fill(dq_acc.begin(), dq_acc.begin() + rows * p.E, 0.f);
        const BackwardTile t{b, h, q0, rows, ke, fe,
                             widen(q + (bh * p.Tq + q0) * p.E, rows * p.E, qbuf.data()),
                             widen(dout + (bh * p.Tq + q0) * p.Dv, rows * p.Dv, dobuf.data()), kh, vh,
                             lse + bh * p.Tq + q0, delta + bh * p.Tq + q0, dq_acc.data(), dk_acc, dv_acc,
                             &keys_across, &values_across, &keys_down};
        tile(state, t);
        narrow(dq_acc.data(), rows * p.E, dq + (bh * p.Tq + q0) * p.E);
      }
      scale_row(dk_acc, p.Tk * p.E, p.scale);
      if (!in_place) {
        narrow(dk_acc, p.Tk * p.E, dk + bh * p.Tk * p.E);
        narrow(dv_acc, p.Tk * p.Dv, dv + bh * p.Tk * p.Dv);
      }
    }
  });
}

// The backward of the plain and positional-bias forms; dbias: per thread, the bias parameters' gradient.
template <typename T, typename O>
void backward_kernel(const Problem& p, const T* q, const T* k, const T* v, const T* dout, const float* lse,
                     const float* delta, O* dq, O* dk, O* dv, float* dbias) {
  const int64_t dbias_size = p.bias == kTable ? p.H * p.R : p.bias == kEmbeddings ? (2 * p.M + 1) * p.E : 0;
  struct State {
    std::vector<float> s, dp, z, dz;  // z, dz: grown on demand
    float* dbias;
  };
  auto make_state = [&] {
    return State{std::vector<float>(p.bq * p.bk), std::vector<float>(p.bq * p.bk), {}, {},
                 dbias ? dbias + at::get_thread_num() * dbias_size : nullptr};
  };
  backward_frame<T, O>(p, q, k, v, dout, lse, delta, dq, dk, dv, make_state, [&](State& st, const BackwardTile& t) {
    float* s = st.s.data();
    float* dp = st.dp.data();
    for (int64_t k0 = 0; k0 < t.ke; k0 += p.bk) {
      const int64_t n = std::min(p.bk, t.ke - k0);
      OffsetSpan span{};
      tile_logits(p, t.b, t.h, s, st.z, t.qt, offset(t.kh, k0 * p.E), t.rows, n, t.q0, k0, t.fe, &span,
                  at_column(*t.keys_across, k0));
      for (int64_t r = 0; r < t.rows; ++r) {  // P = exp(S - logsumexp), recomputed
        float* row = s + r * n;
        if (t.lse[r] == kNegInf) std::fill(row, row + n, 0.f);
        else exp_shifted(row, n, t.lse[r]);
      }
      // dV += P^T dO
      product(p, true, false, n, p.Dv, t.rows, 1.f, s, n, t.dot, p.Dv, 1.f, t.dv_acc + k0 * p.Dv, p.Dv);
      // dP = dO V^T
      product(p, false, true, t.rows, n, p.Dv, 1.f, t.dot, p.Dv, offset(t.vh, k0 * p.Dv), p.Dv, 0.f, dp, n,
              at_column(*t.values_across, k0));
      for (int64_t r = 0; r < t.rows; ++r) softmax_grad_row(s + r * n, dp + r * n, n, t.delta[r]);  // dS, in dp
      if (p.bias == kTable) {
        table_grad(p, t.b, st.dbias + t.h * p.R, dp, t.rows, n, t.q0, k0);
      } else if (p.bias == kEmbeddings) {
        // bias = bias_scale * q . emb[o]: dZ gathers dS by offset; dq += bias_scale dZ emb, demb += bias_scale dZ^T q
        const int64_t w = span.width();
        if ((int64_t)st.dz.size() < t.rows * w) st.dz.resize(t.rows * w);
        embedding_grad_z(p, t.b, span, st.dz.data(), dp, t.rows, n, t.q0, k0);
        const float* emb = p.emb_rev.data() + (p.M - span.o_max) * p.E;
        gemm(false, false, t.rows, p.E, w, p.bias_scale / p.scale, st.dz.data(), w, emb, p.E, 1.f, t.dq_acc, p.E);
        gemm(true, false, w, p.E, t.rows, p.bias_scale, st.dz.data(), w, t.qt, p.E, 1.f,
             st.dbias + (p.M - span.o_max) * p.E, p.E);
      }
      // dQ += dS K
      product(p, false, false, t.rows, p.E, n, 1.f, dp, n, offset(t.kh, k0 * p.E), p.E, 1.f, t.dq_acc, p.E,
              at_row(*t.keys_down, k0));
      product(p, true, false, n, p.E, t.rows, 1.f, dp, n, t.qt, p.E, 1.f, t.dk_acc + k0 * p.E, p.E);  // dK += dS^T Q
    }
    scale_row(t.dq_acc, t.rows * p.E, p.scale);  // dS's scale, once per tile
  });
}

// ---------------------------------------------------------------------------------------------------------------
// CoPE (contextual positions), gates from the keys: g_ts = sigmoid(s_ts) with s_ts = scale q_t . k_s, the position
// p_ts = min(sum of g_ts' over the visible keys s' >= s, P - 1), and the bias interpolated from z_t[j] = q_t . e[:, j]
// between floor(p) and ceil(p) (cope), or -slope_h p (cope-alibi). The forward walks each query tile's keys
// backwards, so that the suffix sums of the gates accumulate tile by tile. Once a row's sum reaches P - 1 every
// earlier key's position is clamped there: its bias is one constant and its gate's gradient 0 (it moves only
// clamped positions), so neither pass computes those gates. The forward saves, per row, the last clamped key
// (-1 if none) and the sum of the gates after it; the backward, walking forwards, rebuilds p = that sum - (the
// gates between) for the keys after the clamped ones and accumulates the prefix sums of dL/dp that the gates'
// gradient needs (dL/dg_ts' = sum over s <= s' of dL/dp_ts).
struct Contextual {
  const float* emb = nullptr;     // (E, P) or null
  const float* slopes = nullptr;  // (H) or null
  int64_t P = 0;
};

float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

// The bias at position pos (clamped already) and its derivative by pos (0 at integer positions, as the
// interpolation's autograd gives, and where the clamp holds).
inline void position_bias(const Contextual& c, float slope, const float* z, float pos, bool clamped, float* bias,
                          float* dbias_dpos, int64_t* fl_out, float* w_out) {
  if (c.slopes) {
    *bias = -slope * pos;
    *dbias_dpos = clamped ? 0.f : -slope;
    *fl_out = 0;
    *w_out = pos;  // (cope-alibi's slope gradient reads the position)
    return;
  }
  const float fl = std::floor(pos);
  const int64_t i = (int64_t)fl;
  const float w = pos - fl;
  *fl_out = i;
  *w_out = w;
  if (w > 0.f) {
    *bias = z[i] * (1.f - w) + z[i + 1] * w;
    *dbias_dpos = z[i + 1] - z[i];
  } else {
    *bias = z[i];
    *dbias_dpos = 0.f;
  }
}

template <typename T>
void contextual_forward_kernel(const Problem& p, const Contextual& c, const T* q, const T* k, const T* v, T* out,
                               float* lse, float* gtot) {
  const float top = (float)(c.P - 1);
  struct State {
    std::vector<float> z, run, unused;  // run: per row, the sum of the gates after its last clamped key;
                                        // unused: tile_logits' scratch for an embedding bias (none here)
    std::vector<int64_t> sat;           // per row, its last clamped key (-1: none yet)
  };
  auto make_state = [&] {
    return State{std::vector<float>(c.emb ? p.bq * c.P : 0), std::vector<float>(p.bq), {},
                 std::vector<int64_t>(p.bq)};
  };
  auto start = [&](State& st, const ForwardTile& t) {
    if (c.emb) gemm(false, false, t.rows, c.P, p.E, 1.f, t.qt, p.E, c.emb, c.P, 0.f, st.z.data(), c.P);
    std::fill(st.run.begin(), st.run.end(), 0.f);
    std::fill(st.sat.begin(), st.sat.end(), -1);
  };
  auto logits = [&](State& st, const ForwardTile& t, float* s, const float* kt, int64_t k0, int64_t n) {
    OffsetSpan span{};
    tile_logits(p, t.b, t.h, s, st.unused, t.qt, kt, t.rows, n, t.q0, k0, t.fe, &span,  // scale q k^T, masked
                at_column(*t.keys, k0));
    const float slope = c.slopes ? c.slopes[t.h] : 0.f;
    for (int64_t r = 0; r < t.rows; ++r) {
      float* row = s + r * n;
      const float* zr = c.emb ? st.z.data() + r * c.P : nullptr;
      const float clamped_bias = c.emb ? zr[c.P - 1] : -slope * top;
      int64_t j = n - 1;
      if (st.sat[r] < 0) {
        float total = st.run[r];
        for (; j >= 0; --j) {
          if (row[j] == kNegInf) continue;  // hidden: no gate, no logit
          total += sigmoid(row[j]);
          if (total >= top) {  // this key and every earlier one: position P - 1
            st.sat[r] = k0 + j;
            break;
          }
          float bias, unused_d, w;
          int64_t fl;
          position_bias(c, slope, zr, total, false, &bias, &unused_d, &fl, &w);
          row[j] += bias;
          st.run[r] = total;
        }
      }
      if (j >= 0) add_scalar(row, clamped_bias, j + 1);  // (-inf stays -inf)
    }
  };
  auto done = [&](State& st, const ForwardTile& t) {
    for (int64_t r = 0; r < t.rows; ++r) {  // (as float: exact for key indices below 2^24)
      gtot[2 * (t.bh * p.Tq + t.q0 + r)] = st.run[r];
      gtot[2 * (t.bh * p.Tq + t.q0 + r) + 1] = (float)st.sat[r];
    }
  };
  forward_frame<T>(p, q, k, v, out, lse, true, make_state, start, logits, done);
}

// dparam: per thread, (E, P) for the embeddings or (H) for the slopes. Gradients as backward_kernel's.
template <typename T, typename O>
void contextual_backward_kernel(const Problem& p, const Contextual& c, const T* q, const T* k, const T* v,
                                const T* dout, const float* lse, const float* delta, const float* gtot, O* dq, O* dk,
                                O* dv, float* dparam) {
  const float top = (float)(c.P - 1);
  const int64_t dparam_size = c.emb ? p.E * c.P : p.H;
  const int64_t tile_size = p.bq * p.bk;
  struct State {
    std::vector<float> s, dp, g, dpos, w, z, dz, before, dbefore, unused;
    std::vector<int64_t> fl, clamped;  // clamped: per row of the tile, its keys [0, clamped) sit at position P - 1
    float* dparam;
  };
  auto make_state = [&] {
    State st;
    for (auto* buf : {&st.s, &st.dp, &st.g, &st.dpos, &st.w}) buf->resize(tile_size);
    st.z.resize(c.emb ? p.bq * c.P : 0);
    st.dz.resize(c.emb ? p.bq * c.P : 0);
    st.before.resize(p.bq);
    st.dbefore.resize(p.bq);
    st.fl.resize(c.emb ? tile_size : 0);
    st.clamped.resize(p.bq);
    st.dparam = dparam + at::get_thread_num() * dparam_size;
    return st;
  };
  backward_frame<T, O>(p, q, k, v, dout, lse, delta, dq, dk, dv, make_state, [&](State& st, const BackwardTile& t) {
    float *s = st.s.data(), *dp = st.dp.data(), *g = st.g.data(), *dpos = st.dpos.data(), *w = st.w.data();
    float *z = st.z.data(), *dz = st.dz.data(), *before = st.before.data(), *dbefore = st.dbefore.data();
    int64_t *fl = st.fl.data(), *clamped = st.clamped.data();
    const int64_t h = t.h, rows = t.rows;
    const float slope = c.slopes ? c.slopes[h] : 0.f;
    const float* saved = gtot + 2 * ((t.b * p.H + h) * p.Tq + t.q0);  // per row: (the gates' sum after the last clamped key, it)
    if (c.emb) {
      gemm(false, false, rows, c.P, p.E, 1.f, t.qt, p.E, c.emb, c.P, 0.f, z, c.P);
      std::fill(st.dz.begin(), st.dz.end(), 0.f);
    }
    std::fill(st.before.begin(), st.before.end(), 0.f);
    std::fill(st.dbefore.begin(), st.dbefore.end(), 0.f);
    for (int64_t k0 = 0; k0 < t.ke; k0 += p.bk) {
      const int64_t n = std::min(p.bk, t.ke - k0);
      OffsetSpan span{};
      tile_logits(p, t.b, h, s, st.unused, t.qt, offset(t.kh, k0 * p.E), rows, n, t.q0, k0, t.fe, &span,  // masked
                  at_column(*t.keys_across, k0));
      for (int64_t r = 0; r < rows; ++r) {  // gates, positions, the bias and P = exp(logit - logsumexp)
        float* row = s + r * n;
        const float* zr = c.emb ? z + r * c.P : nullptr;
        if (t.lse[r] == kNegInf) {  // a query that sees no key
          std::fill(row, row + n, 0.f);
          clamped[r] = n;
          continue;
        }
        // keys up to the last clamped one: constant bias, no gate (P only, vectorised)
        const int64_t cut = std::min<int64_t>(std::max<int64_t>((int64_t)saved[2 * r + 1] + 1 - k0, 0), n);
        clamped[r] = cut;
        if (cut > 0) {
          add_scalar(row, (c.emb ? zr[c.P - 1] : -slope * top) - t.lse[r], cut);
          exp_shifted(row, cut, 0.f);
        }
        for (int64_t j = cut; j < n; ++j) {
          const int64_t e = r * n + j;
          if (row[j] == kNegInf) {
            row[j] = g[e] = dpos[e] = w[e] = 0.f;
            if (c.emb) fl[e] = 0;
            continue;
          }
          const float gate = sigmoid(row[j]);
          // the gates of this key and the later ones (up to the clamped ones); summed in the other order
          // than the forward's, it can round below 0 when they are tiny, which no index may see
          const float raw = std::max(saved[2 * r] - before[r], 0.f);
          before[r] += gate;
          float bias;
          int64_t f;
          position_bias(c, slope, zr, std::min(raw, top), raw >= top, &bias, &dpos[e], &f, &w[e]);
          if (c.emb) fl[e] = f;
          g[e] = gate;
          row[j] = std::exp(row[j] + bias - t.lse[r]);
        }
      }
      product(p, true, false, n, p.Dv, rows, 1.f, s, n, t.dot, p.Dv, 1.f, t.dv_acc + k0 * p.Dv, p.Dv);  // dV += P^T dO
      // dP = dO V^T
      product(p, false, true, rows, n, p.Dv, 1.f, t.dot, p.Dv, offset(t.vh, k0 * p.Dv), p.Dv, 0.f, dp, n,
              at_column(*t.values_across, k0));
      for (int64_t r = 0; r < rows; ++r) {
        float* dzr = c.emb ? dz + r * c.P : nullptr;
        const int64_t cut = clamped[r];
        if (cut > 0) {  // clamped keys: d logit = P (dP - delta), all of it onto the constant bias
          float* d = dp + r * n;
          softmax_grad_row(s + r * n, d, cut, t.delta[r]);
          const float sum = row_sum(d, cut);
          if (c.emb) dzr[c.P - 1] += sum;
          else st.dparam[h] -= sum * top;
        }
        for (int64_t j = cut; j < n; ++j) {
          const int64_t e = r * n + j;
          const float da = s[e] * (dp[e] - t.delta[r]);  // d logit
          if (c.emb) {
            dzr[fl[e]] += da * (1.f - w[e]);
            if (w[e] > 0.f) dzr[fl[e] + 1] += da * w[e];
          } else {
            st.dparam[h] -= da * w[e];  // bias = -slope p
          }
          dbefore[r] += da * dpos[e];  // dL/dp summed over this key and the earlier ones: dL/dg of this key
          dp[e] = da + dbefore[r] * g[e] * (1.f - g[e]);  // through the content logit and through the gate
        }
      }
      product(p, false, false, rows, p.E, n, 1.f, dp, n, offset(t.kh, k0 * p.E), p.E, 1.f, t.dq_acc, p.E,  // dQ += dS K
              at_row(*t.keys_down, k0));
      product(p, true, false, n, p.E, rows, 1.f, dp, n, t.qt, p.E, 1.f, t.dk_acc + k0 * p.E, p.E);  // dK += dS^T Q
    }
    scale_row(t.dq_acc, rows * p.E, p.scale);
    if (c.emb) {  // z = q e: dq += dz e^T, de += q^T dz
      gemm(false, true, rows, p.E, c.P, 1.f, dz, c.P, c.emb, c.P, 1.f, t.dq_acc, p.E);
      gemm(true, false, p.E, c.P, rows, 1.f, t.qt, p.E, dz, c.P, 1.f, st.dparam, c.P);
    }
  });
}

// Whether a (B, heads, T, width) tensor's rows are contiguous, each head's T rows one after another.
bool rows_contiguous(const at::Tensor& x) {
  return (x.size(3) <= 1 || x.stride(3) == 1) && (x.size(2) <= 1 || x.stride(2) == x.size(3));
}

Problem make_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, bool causal,
                     const at::Tensor& q_pos, const at::Tensor& k_pos, const at::Tensor& pad, int64_t bias_kind,
                     const at::Tensor& bias_values, int64_t bias_hi, int64_t bias_max, double bias_scale, int64_t bq,
                     int64_t bk, bool bf16_products) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "cpu_flash: q, k, v must be (B, heads, T, width)");
  TORCH_CHECK(q.is_contiguous() && rows_contiguous(k) && rows_contiguous(v),
              "cpu_flash: q must be contiguous, and k's and v's rows (their heads may lie apart)");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type() &&
              (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
              "cpu_flash: q, k, v must all be float32 or all bfloat16");
  TORCH_CHECK(bq >= 1 && bk >= 1, "cpu_flash: tile sizes must be positive");
  TORCH_CHECK(!bf16_products || (q.scalar_type() == at::kBFloat16 && cpu_has_bf16_products()),
              "cpu_flash: bf16_products needs bf16 inputs and a CPU with AVX512_BF16, with torch's oneDNN enabled "
              "(bf16_products_available())");
  Problem p{};
  p.bf16_products = bf16_products;
  p.B = q.size(0), p.H = q.size(1), p.Tq = q.size(2), p.E = q.size(3);
  p.Hkv = k.size(1), p.Tk = k.size(2), p.Dv = v.size(3);
  TORCH_CHECK(k.size(0) == p.B && v.size(0) == p.B && v.size(1) == p.Hkv && v.size(2) == p.Tk && k.size(3) == p.E &&
              p.Hkv > 0 && p.H % p.Hkv == 0, "cpu_flash: q/k/v shapes disagree");
  p.g = p.H / p.Hkv, p.bq = bq, p.bk = bk, p.tiles = (p.Tq + bq - 1) / bq;
  p.k_batch = k.stride(0), p.k_head = k.stride(1), p.v_batch = v.stride(0), p.v_head = v.stride(1);
  p.scale = (float)scale, p.causal = causal, p.bias = (int)bias_kind, p.bias_scale = (float)bias_scale;
  const bool needs_positions = causal || bias_kind != kNone;
  p.pos_rows = 0;
  if (needs_positions) {
    TORCH_CHECK(q_pos.dim() == 2 && k_pos.dim() == 2 && q_pos.scalar_type() == at::kLong &&
                k_pos.scalar_type() == at::kLong && q_pos.is_contiguous() && k_pos.is_contiguous() &&
                q_pos.size(0) == k_pos.size(0) && (q_pos.size(0) == 1 || q_pos.size(0) == p.B) &&
                q_pos.size(1) == p.Tq && k_pos.size(1) == p.Tk,
                "cpu_flash: positions must be contiguous int64 (1 or B, T) tensors matching q and k");
    p.pos_rows = q_pos.size(0);
    p.qpos = q_pos.data_ptr<int64_t>();
    p.kpos = k_pos.data_ptr<int64_t>();
    p.sorted.assign(p.pos_rows, 1);
    p.contiguous.assign(p.pos_rows, 1);
    for (int64_t r = 0; r < p.pos_rows; ++r) {
      const int64_t* kp = p.kpos + r * p.Tk;
      for (int64_t s = 0; s + 1 < p.Tk; ++s) {
        if (kp[s + 1] < kp[s]) p.sorted[r] = 0;
        if (kp[s + 1] != kp[s] + 1) p.contiguous[r] = 0;
      }
    }
  }
  p.pad = nullptr;
  if (pad.numel()) {
    TORCH_CHECK(pad.scalar_type() == at::kBool && pad.is_contiguous() && pad.dim() == 2 && pad.size(0) == p.B &&
                pad.size(1) == p.Tk, "cpu_flash: the key padding mask must be a contiguous (B, Tk) bool tensor");
    p.pad = pad.data_ptr<bool>();
  }
  if (bias_kind == kTable) {
    TORCH_CHECK(bias_values.dim() == 2 && bias_values.size(0) == p.H && bias_values.scalar_type() == at::kFloat &&
                bias_values.is_contiguous(), "cpu_flash: the distance table must be a contiguous fp32 (H, R) tensor");
    p.R = bias_values.size(1), p.hi = bias_hi;
    // every pair's distance must index the table (hidden pairs are read too, then masked)
    for (int64_t r = 0; r < p.pos_rows; ++r) {
      const int64_t* qp = p.qpos + r * p.Tq;
      const int64_t* kp = p.kpos + r * p.Tk;
      if (!p.Tq || !p.Tk) continue;
      const auto [qlo, qhi] = std::minmax_element(qp, qp + p.Tq);
      const auto [klo, khi] = std::minmax_element(kp, kp + p.Tk);
      TORCH_CHECK(*qhi - *klo <= p.hi && *qlo - *khi >= p.hi - p.R + 1,
                  "cpu_flash: the distance table does not cover every distance of the positions");
    }
    const float* t = bias_values.data_ptr<float>();
    p.rev.resize(p.H * p.R);
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t j = 0; j < p.R; ++j) p.rev[h * p.R + j] = t[h * p.R + (p.R - 1 - j)];
  } else if (bias_kind == kEmbeddings) {
    TORCH_CHECK(bias_max >= 0 && bias_values.dim() == 2 && bias_values.size(0) == 2 * bias_max + 1 &&
                bias_values.size(1) == p.E && bias_values.scalar_type() == at::kFloat && bias_values.is_contiguous(),
                "cpu_flash: the offset embeddings must be a contiguous fp32 (2 M + 1, E) tensor");
    p.M = bias_max;
    const float* e = bias_values.data_ptr<float>();
    p.emb_rev.resize((2 * p.M + 1) * p.E);
    for (int64_t i = 0; i <= 2 * p.M; ++i) std::memcpy(&p.emb_rev[i * p.E], e + (2 * p.M - i) * p.E, p.E * sizeof(float));
  } else {
    TORCH_CHECK(bias_kind == kNone, "cpu_flash: unknown bias kind");
  }
  return p;
}

std::vector<at::Tensor> flash_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                      bool causal, const at::Tensor& q_pos, const at::Tensor& k_pos,
                                      const at::Tensor& pad, int64_t bias_kind, const at::Tensor& bias_values,
                                      int64_t bias_hi, int64_t bias_max, double bias_scale, int64_t bq, int64_t bk,
                                      bool bf16_products) {
  const Problem p = make_problem(q, k, v, scale, causal, q_pos, k_pos, pad, bias_kind, bias_values, bias_hi, bias_max,
                                 bias_scale, bq, bk, bf16_products);
  auto out = at::empty({p.B, p.H, p.Tq, p.Dv}, q.options());
  auto lse = at::empty({p.B, p.H, p.Tq}, q.options().dtype(at::kFloat));
  if (q.scalar_type() == at::kFloat) {
    forward_kernel<float>(p, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>(),
                          lse.data_ptr<float>());
  } else {
    using B = at::BFloat16;
    forward_kernel<B>(p, q.data_ptr<B>(), k.data_ptr<B>(), v.data_ptr<B>(), out.data_ptr<B>(), lse.data_ptr<float>());
  }
  return {out, lse};
}

// Returns (dq, dk, dv, dbias): dk, dv per query head (B, H, Tk, .), summed over kv groups by the caller; the
// gradients in the inputs' dtype without kv groups, fp32 with them (so that the caller's sum is not rounded);
// dbias per thread (threads, H, R) for a table (reversed along R, as p.rev) or (threads, 2M + 1, E) for embeddings
// (reversed, as p.emb_rev), empty without a bias; the caller sums and un-reverses them.
std::vector<at::Tensor> flash_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& delta,
                                       double scale, bool causal, const at::Tensor& q_pos, const at::Tensor& k_pos,
                                       const at::Tensor& pad, int64_t bias_kind, const at::Tensor& bias_values,
                                       int64_t bias_hi, int64_t bias_max, double bias_scale, int64_t bq, int64_t bk,
                                       bool bf16_products) {
  const Problem p = make_problem(q, k, v, scale, causal, q_pos, k_pos, pad, bias_kind, bias_values, bias_hi, bias_max,
                                 bias_scale, bq, bk, bf16_products);
  TORCH_CHECK(dout.is_contiguous() && dout.scalar_type() == q.scalar_type() && dout.sizes() == at::IntArrayRef({p.B, p.H, p.Tq, p.Dv}),
              "cpu_flash: the output gradient must be contiguous and shaped like the output");
  TORCH_CHECK(lse.is_contiguous() && delta.is_contiguous() && lse.scalar_type() == at::kFloat &&
              delta.scalar_type() == at::kFloat && lse.numel() == p.B * p.H * p.Tq && delta.numel() == lse.numel(),
              "cpu_flash: logsumexp and delta must be contiguous fp32 (B, H, Tq)");
  const auto f32 = q.options().dtype(at::kFloat);
  const bool own_dtype = q.scalar_type() != at::kFloat && p.g == 1;  // written once per head, not accumulated
  const auto grads = own_dtype ? q.options() : f32;
  auto dq = at::empty({p.B, p.H, p.Tq, p.E}, grads);
  auto dk = own_dtype ? at::empty({p.B, p.H, p.Tk, p.E}, grads) : at::zeros({p.B, p.H, p.Tk, p.E}, grads);
  auto dv = own_dtype ? at::empty({p.B, p.H, p.Tk, p.Dv}, grads) : at::zeros({p.B, p.H, p.Tk, p.Dv}, grads);
  at::Tensor dbias = at::empty({0}, f32);
  const int64_t threads = at::get_num_threads();
  if (bias_kind == kTable) dbias = at::zeros({threads, p.H, p.R}, f32);
  if (bias_kind == kEmbeddings) dbias = at::zeros({threads, 2 * p.M + 1, p.E}, f32);
  float* db = dbias.numel() ? dbias.data_ptr<float>() : nullptr;
  if (q.scalar_type() == at::kFloat) {
    backward_kernel<float, float>(p, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                  dout.data_ptr<float>(), lse.data_ptr<float>(), delta.data_ptr<float>(),
                                  dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>(), db);
  } else if (own_dtype) {
    using B = at::BFloat16;
    backward_kernel<B, B>(p, q.data_ptr<B>(), k.data_ptr<B>(), v.data_ptr<B>(), dout.data_ptr<B>(),
                          lse.data_ptr<float>(), delta.data_ptr<float>(), dq.data_ptr<B>(), dk.data_ptr<B>(),
                          dv.data_ptr<B>(), db);
  } else {
    using B = at::BFloat16;
    backward_kernel<B, float>(p, q.data_ptr<B>(), k.data_ptr<B>(), v.data_ptr<B>(), dout.data_ptr<B>(),
                              lse.data_ptr<float>(), delta.data_ptr<float>(), dq.data_ptr<float>(),
                              dk.data_ptr<float>(), dv.data_ptr<float>(), db);
  }
  return {dq, dk, dv, dbias};
}

Contextual make_contextual(const Problem& p, const at::Tensor& emb, const at::Tensor& slopes, int64_t p_max) {
  TORCH_CHECK(p_max >= 1, "cpu_flash: p_max must be >= 1");
  // the forward saves each row's last clamped key index as a float, exact below 2^24
  TORCH_CHECK(p.Tk < (int64_t(1) << 24), "cpu_flash: CoPE's kernel takes fewer than 2^24 keys, got ", p.Tk);
  TORCH_CHECK((emb.numel() > 0) != (slopes.numel() > 0), "cpu_flash: give exactly one of emb and slopes");
  Contextual c;
  c.P = p_max;
  if (emb.numel()) {
    TORCH_CHECK(emb.dim() == 2 && emb.size(0) == p.E && emb.size(1) == p_max && emb.scalar_type() == at::kFloat &&
                emb.is_contiguous(), "cpu_flash: emb must be a contiguous fp32 (E, p_max) tensor");
    c.emb = emb.data_ptr<float>();
  } else {
    TORCH_CHECK(slopes.dim() == 1 && slopes.size(0) == p.H && slopes.scalar_type() == at::kFloat &&
                slopes.is_contiguous(), "cpu_flash: slopes must be a contiguous fp32 (H) tensor");
    c.slopes = slopes.data_ptr<float>();
  }
  return c;
}

std::vector<at::Tensor> contextual_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                           bool causal, const at::Tensor& q_pos, const at::Tensor& k_pos,
                                           const at::Tensor& pad, const at::Tensor& emb, const at::Tensor& slopes,
                                           int64_t p_max, int64_t bq, int64_t bk, bool bf16_products) {
  const Problem p = make_problem(q, k, v, scale, causal, q_pos, k_pos, pad, kNone, at::Tensor(), 0, 0, 0.0, bq, bk,
                                 bf16_products);
  const Contextual c = make_contextual(p, emb, slopes, p_max);
  auto out = at::empty({p.B, p.H, p.Tq, p.Dv}, q.options());
  auto lse = at::empty({p.B, p.H, p.Tq}, q.options().dtype(at::kFloat));
  auto gtot = at::empty({p.B, p.H, p.Tq, 2}, q.options().dtype(at::kFloat));
  if (q.scalar_type() == at::kFloat) {
    contextual_forward_kernel<float>(p, c, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                     out.data_ptr<float>(), lse.data_ptr<float>(), gtot.data_ptr<float>());
  } else {
    using B = at::BFloat16;
    contextual_forward_kernel<B>(p, c, q.data_ptr<B>(), k.data_ptr<B>(), v.data_ptr<B>(), out.data_ptr<B>(),
                                 lse.data_ptr<float>(), gtot.data_ptr<float>());
  }
  return {out, lse, gtot};
}

// Returns (dq, dk, dv, dparam) as flash_backward's, dparam per thread: (threads, E, P) or (threads, H).
std::vector<at::Tensor> contextual_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& delta,
                                            const at::Tensor& gtot, double scale, bool causal, const at::Tensor& q_pos,
                                            const at::Tensor& k_pos, const at::Tensor& pad, const at::Tensor& emb,
                                            const at::Tensor& slopes, int64_t p_max, int64_t bq, int64_t bk,
                                            bool bf16_products) {
  const Problem p = make_problem(q, k, v, scale, causal, q_pos, k_pos, pad, kNone, at::Tensor(), 0, 0, 0.0, bq, bk,
                                 bf16_products);
  const Contextual c = make_contextual(p, emb, slopes, p_max);
  TORCH_CHECK(dout.is_contiguous() && dout.scalar_type() == q.scalar_type() && dout.sizes() == at::IntArrayRef({p.B, p.H, p.Tq, p.Dv}),
              "cpu_flash: the output gradient must be contiguous and shaped like the output");
  TORCH_CHECK(lse.is_contiguous() && delta.is_contiguous() && gtot.is_contiguous() && lse.scalar_type() == at::kFloat &&
              delta.scalar_type() == at::kFloat && gtot.scalar_type() == at::kFloat &&
              lse.numel() == p.B * p.H * p.Tq && delta.numel() == lse.numel() && gtot.numel() == 2 * lse.numel(),
              "cpu_flash: logsumexp and delta must be contiguous fp32 (B, H, Tq), the saved gate sums (B, H, Tq, 2)");
  const auto f32 = q.options().dtype(at::kFloat);
  const bool own_dtype = q.scalar_type() != at::kFloat && p.g == 1;
  const auto grads = own_dtype ? q.options() : f32;
  auto dq = at::empty({p.B, p.H, p.Tq, p.E}, grads);
  auto dk = own_dtype ? at::empty({p.B, p.H, p.Tk, p.E}, grads) : at::zeros({p.B, p.H, p.Tk, p.E}, grads);
  auto dv = own_dtype ? at::empty({p.B, p.H, p.Tk, p.Dv}, grads) : at::zeros({p.B, p.H, p.Tk, p.Dv}, grads);
  const int64_t threads = at::get_num_threads();
  auto dparam = c.emb ? at::zeros({threads, p.E, c.P}, f32) : at::zeros({threads, p.H}, f32);
  float* dpar = dparam.data_ptr<float>();
  const float *l = lse.data_ptr<float>(), *d = delta.data_ptr<float>(), *gt = gtot.data_ptr<float>();
  if (q.scalar_type() == at::kFloat) {
    contextual_backward_kernel<float, float>(p, c, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                             dout.data_ptr<float>(), l, d, gt, dq.data_ptr<float>(),
                                             dk.data_ptr<float>(), dv.data_ptr<float>(), dpar);
  } else if (own_dtype) {
    using B = at::BFloat16;
    contextual_backward_kernel<B, B>(p, c, q.data_ptr<B>(), k.data_ptr<B>(), v.data_ptr<B>(), dout.data_ptr<B>(), l, d,
                                     gt, dq.data_ptr<B>(), dk.data_ptr<B>(), dv.data_ptr<B>(), dpar);
  } else {
    using B = at::BFloat16;
    contextual_backward_kernel<B, float>(p, c, q.data_ptr<B>(), k.data_ptr<B>(), v.data_ptr<B>(), dout.data_ptr<B>(),
                                         l, d, gt, dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>(),
                                         dpar);
  }
  return {dq, dk, dv, dparam};
}

// rowsum(a * b) over the last dimension in fp32, (..., n) -> (...): FlashAttention's D = rowsum(dO * O) without
// fp32 copies of dO and O (for bf16 inputs those copies were the largest tensors of the backward).
template <typename T>
void row_dot_kernel(const T* a, const T* b, float* out, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> abuf(std::is_same<T, float>::value ? 0 : n), bbuf(abuf.size());
    for (int64_t r = begin; r < end; ++r) {
      const float* x = widen(a + r * n, n, abuf.data());
      const float* y = widen(b + r * n, n, bbuf.data());
      Vec acc(0.f);
      int64_t c = 0;
      for (; c + Vec::size() <= n; c += Vec::size()) acc = at::vec::fmadd(Vec::loadu(x + c), Vec::loadu(y + c), acc);
      float total = lanes_sum(acc);
      for (; c < n; ++c) total += x[c] * y[c];
      out[r] = total;
    }
  });
}

at::Tensor row_dot(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
              (a.scalar_type() == at::kFloat || a.scalar_type() == at::kBFloat16) && a.dim() >= 1,
              "cpu_flash: row_dot takes two contiguous fp32 or bf16 tensors of one shape");
  const int64_t n = a.size(-1), rows = n ? a.numel() / n : 0;
  auto out = at::empty(a.sizes().slice(0, a.dim() - 1), a.options().dtype(at::kFloat));
  if (a.scalar_type() == at::kFloat) {
    row_dot_kernel<float>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), rows, n);
  } else {
    using B = at::BFloat16;
    row_dot_kernel<B>(a.data_ptr<B>(), b.data_ptr<B>(), out.data_ptr<float>(), rows, n);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// PoPE's Cartesian features in one pass (encodings/polar_pair.py defines them and keeps the reference path):
// out[..., j] = scale mu cos(a - delta), out[..., d + j] = scale mu sin(a - delta), mu = softplus(x) (or x), for
// x (B, H, T, d), the position tables cos a, sin a (1|B, 1, T, d) and the phase bias's cos delta, sin delta (H, d)
// or none. softplus as torch's (beta 1, threshold 20: x itself above it). The backward gives dx and, with the
// rotation, per thread the sums over batch and time of dL/dcos delta and dL/dsin delta (the caller adds the
// threads' rows). x, the output and the gradients fp32 or bf16 (bf16 rows widened to fp32, computed there and
// rounded once on the way out), the tables fp32; softplus and sigmoid by the short forms below.
struct PolarShape {
  int64_t B, H, T, d, tables_b;
  bool rotated, softplus;
  float scale;
};

PolarShape polar_shape(const at::Tensor& x, const at::Tensor& ca, const at::Tensor& sa, const at::Tensor& cd,
                       const at::Tensor& sd, double scale, bool softplus) {
  TORCH_CHECK(x.dim() == 4 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                  x.is_contiguous(),
              "cpu_flash: polar takes x as a contiguous fp32 or bf16 (B, H, T, d) tensor");
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), d = x.size(3);
  TORCH_CHECK(ca.dim() == 4 && ca.sizes() == sa.sizes() && (ca.size(0) == 1 || ca.size(0) == B) && ca.size(1) == 1 &&
                  ca.size(2) == T && ca.size(3) == d && ca.is_contiguous() && sa.is_contiguous() &&
                  ca.scalar_type() == at::kFloat && sa.scalar_type() == at::kFloat,
              "cpu_flash: polar takes contiguous fp32 position tables of shape (1 or B, 1, T, d)");
  const bool rotated = cd.numel() > 0;
  TORCH_CHECK(!rotated || (cd.dim() == 2 && cd.size(0) == H && cd.size(1) == d && cd.sizes() == sd.sizes() &&
                           cd.is_contiguous() && sd.is_contiguous() && cd.scalar_type() == at::kFloat &&
                           sd.scalar_type() == at::kFloat),
              "cpu_flash: polar takes the rotation as contiguous fp32 (H, d) tables, or empty ones");
  return PolarShape{B, H, T, d, ca.size(0), rotated, softplus, static_cast<float>(scale)};
}

// One row (b, h, t): the tables' cos/sin of (a - delta) into c, s (d each).
inline void polar_tables(const PolarShape& p, const float* ca, const float* sa, const float* cd, const float* sd,
                         float* c, float* s) {
  int64_t j = 0;
  if (!p.rotated) {
    std::memcpy(c, ca, p.d * sizeof(float));
    std::memcpy(s, sa, p.d * sizeof(float));
    return;
  }
  // cos(a - delta) = cos a cos delta + sin a sin delta; sin(a - delta) = sin a cos delta - cos a sin delta
  for (; j + Vec::size() <= p.d; j += Vec::size()) {
    const Vec ac = Vec::loadu(ca + j), as = Vec::loadu(sa + j), dc = Vec::loadu(cd + j), ds = Vec::loadu(sd + j);
    (ac * dc + as * ds).store(c + j);
    (as * dc - ac * ds).store(s + j);
  }
  for (; j < p.d; ++j) {
    c[j] = ca[j] * cd[j] + sa[j] * sd[j];
    s[j] = sa[j] * cd[j] - ca[j] * sd[j];
  }
}

// softplus(x) = max(x, 0) + log1p(t) and softplus'(x) = sigmoid(x) = (x < 0 ? t : 1) / (1 + t), t = exp(-|x|) in
// [0, 1]: one exponential of a non-positive argument serves both, and log1p on [0, 1] needs no range reduction.
// Above torch's threshold (x > 20: x itself, gradient 1) t < 2.1e-9 and the same formulas round to x and 1.
// On AVX2/AVX-512 t and log1p(t) are the short forms below: Sleef's exp and log1p (torch's softplus) took 2.2x
// as long on AVX-512 (2026-11-27, AMD EPYC), and these stay within 4 ulp of softplus (Sleef's: 1.5) and 2.4 ulp
// of sigmoid over [-100, 100] against float64 (tests/test_polar_pair.py holds them to it).
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// exp(y) for y <= 0: y = n ln 2 + r, |r| <= ln 2 / 2 (ln 2 in two parts, so r is exact), e^r by its Taylor
// polynomial of degree 7 (remainder under 6e-9), 2^n from the exponent's bits; 0 below -87.33 (2^-126 is the
// smallest normal float, and e^y is under 1.2e-38 there), NaN kept.
inline Vec exp_nonpositive(const Vec& y) {
  const Vec yc = at::vec::maximum(y, Vec(-87.33654f)), n = (yc * Vec(1.44269504088896341f)).round();
  Vec r = at::vec::fmadd(n, Vec(-0.693145751953125f), yc);
  r = at::vec::fmadd(n, Vec(-1.428606765330187045e-06f), r);
  Vec e(1.f / 5040.f);
  for (const float c : {1.f / 720.f, 1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f}) e = at::vec::fmadd(e, r, Vec(c));
  using IVec = at::vec::Vectorized<int32_t>;
  const IVec bits = (at::vec::convert_to_int_of_same_size(n) + IVec(127)) << IVec(23);
  return Vec::blendv(e * at::vec::cast<float>(bits), Vec(0.f), y < Vec(-87.33654f));
}

// log1p(t) for t in [0, 1] as 2 atanh(s), s = t / (2 + t) <= 1/3: the odd series to s^13 (remainder under 2e-8).
inline Vec log1p_unit(const Vec& t) {
  const Vec s = t / (t + Vec(2.f)), z = s * s;
  Vec p(2.f / 13.f);
  for (const float c : {2.f / 11.f, 2.f / 9.f, 2.f / 7.f, 2.f / 5.f, 2.f / 3.f, 2.f}) p = at::vec::fmadd(p, z, Vec(c));
  return p * s;
}
#else
inline Vec exp_nonpositive(const Vec& y) { return y.exp(); }
inline Vec log1p_unit(const Vec& t) { return t.log1p(); }
#endif

inline Vec softplus_vec(const Vec& x) {
  return at::vec::maximum(x, Vec(0.f)) + log1p_unit(exp_nonpositive(Vec(0.f) - x.abs()));
}

// sigmoid(x), and softplus(x) into *mu when mu is given: one exponential for both.
inline Vec sigmoid_vec(const Vec& x, Vec* mu = nullptr) {
  const Vec t = exp_nonpositive(Vec(0.f) - x.abs());
  if (mu != nullptr) *mu = at::vec::maximum(x, Vec(0.f)) + log1p_unit(t);
  return Vec::blendv(Vec(1.f), t, x < Vec(0.f)) / (t + Vec(1.f));
}

inline float softplus_one(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

template <typename T>
void polar_forward_rows(const PolarShape& p, const T* xp, const float* cap, const float* sap, const float* cdp,
                        const float* sdp, T* op) {
  const Vec sc(p.scale);
  at::parallel_for(0, p.B * p.H * p.T, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> c(p.d), s(p.d), xs(p.d), os(2 * p.d);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row % p.T, h = (row / p.T) % p.H, b = row / (p.T * p.H);
      const int64_t tab = ((p.tables_b == 1 ? 0 : b) * p.T + t) * p.d;
      polar_tables(p, cap + tab, sap + tab, p.rotated ? cdp + h * p.d : nullptr, p.rotated ? sdp + h * p.d : nullptr,
                   c.data(), s.data());
      const float* xr = widen(xp + row * p.d, p.d, xs.data());
      float* o = std::is_same_v<T, float> ? reinterpret_cast<float*>(op + row * 2 * p.d) : os.data();
      int64_t j = 0;
      for (; j + Vec::size() <= p.d; j += Vec::size()) {
        const Vec xv = Vec::loadu(xr + j), mu = (p.softplus ? softplus_vec(xv) : xv) * sc;
        (mu * Vec::loadu(c.data() + j)).store(o + j);
        (mu * Vec::loadu(s.data() + j)).store(o + p.d + j);
      }
      for (; j < p.d; ++j) {
        const float mu = (p.softplus ? softplus_one(xr[j]) : xr[j]) * p.scale;
        o[j] = mu * c[j];
        o[p.d + j] = mu * s[j];
      }
      if constexpr (!std::is_same_v<T, float>) narrow(o, 2 * p.d, op + row * 2 * p.d);
    }
  });
}

at::Tensor polar_forward(const at::Tensor& x, const at::Tensor& ca, const at::Tensor& sa, const at::Tensor& cd,
                         const at::Tensor& sd, double scale, bool softplus) {
  const PolarShape p = polar_shape(x, ca, sa, cd, sd, scale, softplus);
  auto out = at::empty({p.B, p.H, p.T, 2 * p.d}, x.options());
  const float *cap = ca.data_ptr<float>(), *sap = sa.data_ptr<float>();
  const float *cdp = p.rotated ? cd.data_ptr<float>() : nullptr, *sdp = p.rotated ? sd.data_ptr<float>() : nullptr;
  if (x.scalar_type() == at::kFloat) {
    polar_forward_rows<float>(p, x.data_ptr<float>(), cap, sap, cdp, sdp, out.data_ptr<float>());
  } else {
    using B = at::BFloat16;
    polar_forward_rows<B>(p, x.data_ptr<B>(), cap, sap, cdp, sdp, out.data_ptr<B>());
  }
  return out;
}

// (dx, drot): drot (threads, 2, H, d) with dL/dcos delta in [:, 0] and dL/dsin delta in [:, 1] (empty without
// a rotation, or when need_rotation is false).
template <typename T>
void polar_backward_rows(const PolarShape& p, const T* gp, const T* xp, const float* cap, const float* sap,
                         const float* cdp, const float* sdp, bool rot_grad, T* dxp, float* drp) {
  const Vec sc(p.scale);
  at::parallel_for(0, p.B * p.H * p.T, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> c(p.d), s(p.d), xs(p.d), gsc(2 * p.d), dxs(p.d);
    float* dcd = rot_grad ? drp + at::get_thread_num() * 2 * p.H * p.d : nullptr;
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row % p.T, h = (row / p.T) % p.H, b = row / (p.T * p.H);
      const int64_t tab = ((p.tables_b == 1 ? 0 : b) * p.T + t) * p.d;
      const float *ac = cap + tab, *as = sap + tab;
      polar_tables(p, ac, as, p.rotated ? cdp + h * p.d : nullptr, p.rotated ? sdp + h * p.d : nullptr, c.data(),
                   s.data());
      const float* xr = widen(xp + row * p.d, p.d, xs.data());
      const float* gc = widen(gp + row * 2 * p.d, 2 * p.d, gsc.data());
      const float* gs = gc + p.d;
      float* dxr = std::is_same_v<T, float> ? reinterpret_cast<float*>(dxp + row * p.d) : dxs.data();
      float* dc = rot_grad ? dcd + h * p.d : nullptr;
      float* ds = rot_grad ? dcd + (p.H + h) * p.d : nullptr;
      int64_t j = 0;
      for (; j + Vec::size() <= p.d; j += Vec::size()) {
        const Vec xv = Vec::loadu(xr + j), gcv = Vec::loadu(gc + j), gsv = Vec::loadu(gs + j);
        // dL/dmu = scale (g_c c + g_s s); softplus' = sigmoid (1 above the threshold, as torch's backward)
        const Vec dmu = (gcv * Vec::loadu(c.data() + j) + gsv * Vec::loadu(s.data() + j)) * sc;
        Vec dxv = dmu, mu = xv;
        // softplus itself only for the rotation's gradient
        if (p.softplus) dxv = dmu * sigmoid_vec(xv, rot_grad ? &mu : nullptr);
        dxv.store(dxr + j);
        if (rot_grad) {
          // dL/dcos delta = scale mu (g_c cos a + g_s sin a); dL/dsin delta = scale mu (g_c sin a - g_s cos a)
          mu = mu * sc;
          const Vec av = Vec::loadu(ac + j), bv = Vec::loadu(as + j);
          (Vec::loadu(dc + j) + mu * (gcv * av + gsv * bv)).store(dc + j);
          (Vec::loadu(ds + j) + mu * (gcv * bv - gsv * av)).store(ds + j);
        }
      }
      for (; j < p.d; ++j) {
        const float dmu = (gc[j] * c[j] + gs[j] * s[j]) * p.scale;
        float mu = xr[j];
        dxr[j] = dmu;
        if (p.softplus && !(xr[j] > 20.f)) {  // NaN included, as torch's backward
          const float e = std::exp(xr[j]);
          dxr[j] = dmu * (e / (e + 1.f));
          mu = std::log1p(e);
        }
        if (rot_grad) {
          mu *= p.scale;
          dc[j] += mu * (gc[j] * ac[j] + gs[j] * as[j]);
          ds[j] += mu * (gc[j] * as[j] - gs[j] * ac[j]);
        }
      }
      if constexpr (!std::is_same_v<T, float>) narrow(dxr, p.d, dxp + row * p.d);
    }
  });
}

// (dx, drot): drot (threads, 2, H, d) with dL/dcos delta in [:, 0] and dL/dsin delta in [:, 1] (empty without
// a rotation, or when need_rotation is false).
std::vector<at::Tensor> polar_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& ca,
                                       const at::Tensor& sa, const at::Tensor& cd, const at::Tensor& sd, double scale,
                                       bool softplus, bool need_rotation) {
  const PolarShape p = polar_shape(x, ca, sa, cd, sd, scale, softplus);
  TORCH_CHECK(grad.is_contiguous() && grad.scalar_type() == x.scalar_type() && grad.dim() == 4 &&
                  grad.size(0) == p.B && grad.size(1) == p.H && grad.size(2) == p.T && grad.size(3) == 2 * p.d,
              "cpu_flash: polar's gradient must be a contiguous (B, H, T, 2d) tensor of x's dtype");
  const bool rot_grad = p.rotated && need_rotation;
  const int64_t threads = at::get_num_threads();
  auto dx = at::empty_like(x);
  auto drot = rot_grad ? at::zeros({threads, 2, p.H, p.d}, x.options().dtype(at::kFloat))
                       : at::empty({0}, x.options().dtype(at::kFloat));
  const float *cap = ca.data_ptr<float>(), *sap = sa.data_ptr<float>();
  const float *cdp = p.rotated ? cd.data_ptr<float>() : nullptr, *sdp = p.rotated ? sd.data_ptr<float>() : nullptr;
  float* drp = rot_grad ? drot.data_ptr<float>() : nullptr;
  if (x.scalar_type() == at::kFloat) {
    polar_backward_rows<float>(p, grad.data_ptr<float>(), x.data_ptr<float>(), cap, sap, cdp, sdp, rot_grad,
                               dx.data_ptr<float>(), drp);
  } else {
    using B = at::BFloat16;
    polar_backward_rows<B>(p, grad.data_ptr<B>(), x.data_ptr<B>(), cap, sap, cdp, sdp, rot_grad, dx.data_ptr<B>(),
                           drp);
  }
  return {dx, drot};
}

// ---------------------------------------------------------------------------------------------------------------
// PoPE's attention against a KV cache of key magnitudes (attention/pope_decode.py says why the cache holds them):
//   out[b, kv, r] = sum_s softmax_s(logit[r, s]) v[s],
//   logit[r, s] = sum_c mu[s, c] (qa[r, c] cos(s theta_c) + qb[r, c] sin(s theta_c)),
// [qa | qb] (R x 2d) the Cartesian query of the rows r of kv head kv (its query heads and steps), the attention
// scale and phase bias folded in; the angle tables [cos | sin] (P x L x 2d, P = 1 or B) shared by every head. No
// GEMM expresses the per-element product with the tables, so for a few rows the logits are one fused pass over the
// magnitudes; for many (kTiledRows) a block's Cartesian keys are built once and the rows multiply them.
// Padded keys are hidden, and with positions, keys later than the row's query (several new tokens at once).
//
// It runs in the decode frame (decode_frame, below: (batch, kv head) pairs, blocks of keys, splits merged). The
// angle tables are read again for every pair (from the L2/L3 cache: 4 MB at 8192 keys and d = 64); walking the
// blocks outside and the pairs inside, which reads each block of them once, was slower on the 2-core AMD EPYC (B = 8,
// Hkv = 8, 8192 keys, bf16: 7.2-7.4 against 6.2-6.4 ms; the cache's heads are then read in short runs).
constexpr int64_t kDecodeBlock = 512;  // keys per block (128: 6.2-6.3, 512: 5.5-6.0 ms in PoPE's decode, as above)
// From this many rows per (batch, kv head) (several new tokens, or many query heads to a kv head) a block's logits
// and weighted values are matrix products: the block's Cartesian keys [mu cos | mu sin] (n x 2d) built once, then
// sgemm. Below it the fused loops, which build nothing. The caller passes the threshold (a machine's calibration
// measures it); this is the default, measured on the 2-core AMD EPYC (B = 8, Hkv = 8, 8192 keys, 2026-11-27):
// products over loops 1.2x the time at 8 rows, 0.93-0.96x at 12, 0.7-0.9x at 16, 0.5-0.6x at 64.
constexpr int64_t kTiledRows = 16;

struct DecodeShape {
  int64_t B, Hkv, R, L, d, Dv, angle_rows;
  int64_t mu_batch, mu_head, v_batch, v_head;  // the cache's strides (rows contiguous, heads may lie apart)
  const bool* pad;  // (B, L), True: a real key; or null
  // causal by position, or null: qpos (pos_rows, steps) for the rows r (step r % steps), kpos (pos_rows, L)
  const int64_t *qpos, *kpos;
  int64_t pos_rows, steps;
  bool products;  // the products form multiplies bf16 operands (bf16 caches, where the CPU has AVX512_BF16)
  int64_t tiled_rows;  // from this many rows the products form (kTiledRows says why)
};

// The hidden keys' logits of s (R x n), the keys [k0, k0 + n) of batch row b, set to -inf: padding, and keys later
// than the row's query.
void hide_keys(const DecodeShape& p, int64_t b, int64_t k0, float* s, int64_t n) {
  if (p.pad) {
    const bool* pad = p.pad + b * p.L + k0;
    for (int64_t j = 0; j < n; ++j)
      if (!pad[j])
        for (int64_t r = 0; r < p.R; ++r) s[r * n + j] = kNegInf;
  }
  if (p.qpos) {
    const int64_t row = p.pos_rows == 1 ? 0 : b;
    const int64_t* kp = p.kpos + row * p.L + k0;
    for (int64_t r = 0; r < p.R; ++r) {
      const int64_t limit = p.qpos[row * p.steps + r % p.steps];
      for (int64_t j = 0; j < n; ++j)
        if (kp[j] > limit) s[r * n + j] = kNegInf;
    }
  }
}

// The logits s (R x n) of the keys [k0, k0 + n) of one (batch, kv head): qa (R x 2d) fp32; mu (n x d) and the
// tables (n x 2d) fp32.
void magnitude_logits(const DecodeShape& p, const float* qa, const float* mu, const float* tables, float* s,
                      int64_t n) {
  const int64_t d = p.d;
  for (int64_t j = 0; j < n; ++j) {
    const float* m = mu + j * d;
    const float* c = tables + j * 2 * d;
    const float* sn = c + d;
    for (int64_t r = 0; r < p.R; ++r) {
      const float* a = qa + r * 2 * d;
      const float* b = a + d;
      Vec acc(0.f);
      int64_t x = 0;
      for (; x + Vec::size() <= d; x += Vec::size())
        acc = at::vec::fmadd(Vec::loadu(m + x),
                             at::vec::fmadd(Vec::loadu(a + x), Vec::loadu(c + x), Vec::loadu(b + x) * Vec::loadu(sn + x)),
                             acc);
      float total = at::vec::vec_reduce_all<float>([](const Vec& u, const Vec& w) { return u + w; }, acc);
      for (; x < d; ++x) total += m[x] * (a[x] * c[x] + b[x] * sn[x]);
      s[r * n + j] = total;
    }
  }
}

// The Cartesian keys of a block, out (n x 2d) = [mu cos | mu sin] per key, from mu (n x d) and the tables (n x 2d).
void cartesian_keys(int64_t d, const float* mu, const float* tables, int64_t n, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const float *m = mu + j * d, *c = tables + j * 2 * d, *sn = c + d;
    float* o = out + j * 2 * d;
    int64_t x = 0;
    for (; x + Vec::size() <= d; x += Vec::size()) {
      const Vec mv = Vec::loadu(m + x);
      (mv * Vec::loadu(c + x)).store(o + x);
      (mv * Vec::loadu(sn + x)).store(o + d + x);
    }
    for (; x < d; ++x) {
      o[x] = m[x] * c[x];
      o[d + x] = m[x] * sn[x];
    }
  }
}

// Whether every row sees every key of [k0, k0 + n) of batch row b (no padding, none later than a row's query):
// then a product may take the block's values whole (a hidden key's weight is 0, and 0 times a non-finite value
// would not be).
bool block_visible(const DecodeShape& p, int64_t b, int64_t k0, int64_t n) {
  if (p.pad) {
    const bool* pad = p.pad + b * p.L + k0;
    if (!std::all_of(pad, pad + n, [](bool real) { return real; })) return false;
  }
  if (p.qpos) {
    const int64_t row = p.pos_rows == 1 ? 0 : b;
    const int64_t* qp = p.qpos + row * p.steps;
    const int64_t earliest = *std::min_element(qp, qp + p.steps);
    const int64_t* kp = p.kpos + row * p.L + k0;
    if (*std::max_element(kp, kp + n) > earliest) return false;
  }
  return true;
}

// acc (R x Dv) += w (R x n) v (n x Dv), v fp32; a zero weight (a hidden key) adds nothing.
void weighted_values(int64_t R, int64_t Dv, const float* w, int64_t n, const float* v, float* acc) {
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = v + j * Dv;
    for (int64_t r = 0; r < R; ++r) {
      const float weight = w[r * n + j];
      if (weight == 0.f) continue;
      float* o = acc + r * Dv;
      const Vec wv(weight);
      int64_t x = 0;
      for (; x + Vec::size() <= Dv; x += Vec::size())
        at::vec::fmadd(wv, Vec::loadu(vj + x), Vec::loadu(o + x)).store(o + x);
      for (; x < Dv; ++x) o[x] += weight * vj[x];
    }
  }
}

#ifdef CPU_CAPABILITY_AVX512
// The same two loops with the cache read where it lies (bf16 widened in registers, no pass through scratch, so
// that the loads overlap the arithmetic), the query's and the accumulators' chunks held in registers, and the
// logits' lane sums taken 16 keys at a time. C: 16-lane chunks per row (d or Dv up to 16 C; the last one masked).
// 16 values as fp32 (lanes past the mask zero; all 16 read unmasked when `whole`).
inline __m512 load16(const float* x, __mmask16 mask, bool whole = false) {
  return whole ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(mask, x);
}
inline __m512 load16(const at::BFloat16* x, __mmask16 mask, bool whole = false) {
  const __m256i bits = whole ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)) : _mm256_maskz_loadu_epi16(mask, x);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// out[i] = the sum of v[i]'s 16 lanes, for 16 vectors: pairs interleaved and added within 128-bit lanes, then the
// four 128-bit lanes added across (45 shuffles and adds, against 16 x 8 one vector at a time).
inline __m512 lane_sums16(const __m512* v) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a0 + a2, b0 + b2, a1 + a3, b1 + b3] of v[2i] = a, v[2i + 1] = b
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane's sums of v[4i .. 4i + 3]
    const __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // 128-bit lanes (0, 2) and (1, 3) of two vectors side by side, added: twice, then every key's total in order
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xDD));
}

// s[g n + j] = factor x the sum of the lanes of key(j)[g], for G rows and the keys j < n: key(j) returns the G rows'
// accumulators of key j (a std::array; returned by value, so that they stay in registers), 16 / G keys of the G
// rows summed at a time (one lane_sums16).
template <int G, typename Key>
inline void lane_summed(int64_t n, __m512 factor, float* s, Key key) {
  constexpr int K = 16 / G;  // keys per lane sum
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t j0 = 0; j0 < n; j0 += K) {
    const int64_t keys = std::min<int64_t>(K, n - j0);
    __m512 acc[16];
    for (int i = 0; i < K; ++i) {
      if (i < keys) {
        const std::array<__m512, G> rows = key(j0 + i);
        for (int g = 0; g < G; ++g) acc[g * K + i] = rows[g];
      } else {
        for (int g = 0; g < G; ++g) acc[g * K + i] = _mm512_setzero_ps();
      }
    }
    const __m512 sums = _mm512_mul_ps(lane_sums16(acc), factor);  // lane g K + i: row g, key j0 + i
    if constexpr (G == 1) {
      _mm512_mask_storeu_ps(s + j0, lanes_mask(keys), sums);
    } else {
      for (int g = 0; g < G; ++g)
        _mm512_mask_storeu_ps(s + g * n + j0, lanes_mask(keys),
                              _mm512_permutexvar_ps(_mm512_add_epi32(lane, _mm512_set1_epi32(g * K)), sums));
    }
  }
}

// PoPE's logits of one row [a | b] (2d, fp32) against the magnitudes mu (n x d) and the tables (n x 2d).
template <int C, bool Whole, typename T>
void magnitude_logits_avx512(int64_t d, const float* qa, const T* mu, const float* tables, float* s, int64_t n) {
  const __mmask16 last = lanes_mask(d - (C - 1) * 16);
  __m512 a[C], b[C];
  for (int c = 0; c < C; ++c) {
    const __mmask16 mask = c == C - 1 ? last : __mmask16(0xFFFF);
    a[c] = load16(qa + c * 16, mask);
    b[c] = load16(qa + d + c * 16, mask);
  }
  lane_summed<1>(n, _mm512_set1_ps(1.f), s, [&](int64_t j) {
    const T* m = mu + j * d;
    const float* cs = tables + j * 2 * d;
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < C; ++c) {
      const bool whole = Whole || c < C - 1;
      const __m512 w = _mm512_fmadd_ps(a[c], load16(cs + c * 16, last, whole),
                                       _mm512_mul_ps(b[c], load16(cs + d + c * 16, last, whole)));
      acc = _mm512_fmadd_ps(load16(m + c * 16, last, whole), w, acc);
    }
    return std::array<__m512, 1>{acc};
  });
}

// The register forms below take the rows in groups of G (kMaxGroup, then smaller for the rest), so that each key's
// and value's chunks are loaded, and bf16 widened, once for the group's rows rather than once per row. On the 2-core
// AMD EPYC (each variant a library of its own in one process, interleaved, B = 8, 8192 keys; docs/results/
// decode-row-groups-ab-amd-epyc): the flash decode form at 4 and 8 rows per kv head 0.69-0.80x the time of one row
// at a time in fp32, 0.79-0.99x in bf16 (0.93-0.99 in one run, 0.79-0.84 in the other); PoPE's bf16 decode (these
// weighted values) 0.86-0.90x at 4 rows. bf16 logits stay one row at a time (in groups they took 1.03-1.08x the
// time), and a single row keeps its one-row loops (the grouped ones with G = 1 took 1.02-1.08x).
constexpr int kMaxGroup = 4;

// f(std::integral_constant<int, G>, r0) for the rows [r0, r0 + G) of R, in groups of at most `largest` rows.
template <typename F>
void in_row_groups(int64_t R, int largest, F f) {
  int64_t r0 = 0;
  for (; largest >= 4 && r0 + 4 <= R; r0 += 4) f(std::integral_constant<int, 4>{}, r0);
  for (; largest >= 2 && r0 + 2 <= R; r0 += 2) f(std::integral_constant<int, 2>{}, r0);
  for (; r0 < R; ++r0) f(std::integral_constant<int, 1>{}, r0);
}

// s (G x n, rows n apart) = scale q k^T for G rows q (G x E, fp32) against the keys k (n x E, rows E apart) read
// where they lie: 16 / G keys of the G rows summed at a time (one lane_sums16 of G x 16 / G accumulators).
template <int G, int C, bool Whole, typename T>
void dot_logits_group(int64_t E, float scale, const float* q, const T* k, float* s, int64_t n) {
  const __mmask16 last = lanes_mask(E - (C - 1) * 16);
  __m512 a[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) a[g][c] = load16(q + g * E + c * 16, c == C - 1 ? last : __mmask16(0xFFFF));
  lane_summed<G>(n, _mm512_set1_ps(scale), s, [&](int64_t j) {
    std::array<__m512, G> acc;
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
    for (int c = 0; c < C; ++c) {
      const __m512 x = load16(k + j * E + c * 16, last, Whole || c < C - 1);
      for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(a[g][c], x, acc[g]);
    }
    return acc;
  });
}

// acc (G x Dv) += w (G x n, rows ldw apart) v (n x Dv) for G rows, v read where it lies; a zero weight (a hidden
// key) adds nothing to its row.
template <int G, int C, bool Whole, typename T>
void weighted_values_group(int64_t Dv, const float* w, int64_t ldw, int64_t n, const T* v, float* acc) {
  const __mmask16 last = lanes_mask(Dv - (C - 1) * 16);
  if constexpr (G == 1) {  // one row: its weights alone decide which values are read (measured faster than the below)
    __m512 sum[C];
    for (int c = 0; c < C; ++c) sum[c] = load16(acc + c * 16, c == C - 1 ? last : __mmask16(0xFFFF));
    for (int64_t j = 0; j < n; ++j) {
      const float weight = w[j];
      if (weight == 0.f) continue;
      const __m512 wv = _mm512_set1_ps(weight);
      for (int c = 0; c < C; ++c)
        sum[c] = _mm512_fmadd_ps(wv, load16(v + j * Dv + c * 16, last, Whole || c < C - 1), sum[c]);
    }
    for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(acc + c * 16, c == C - 1 ? last : __mmask16(0xFFFF), sum[c]);
    return;
  }
  __m512 sum[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) sum[g][c] = load16(acc + g * Dv + c * 16, c == C - 1 ? last : __mmask16(0xFFFF));
  for (int64_t j = 0; j < n; ++j) {
    float weight[G];
    bool any = false;
    for (int g = 0; g < G; ++g) any |= (weight[g] = w[g * ldw + j]) != 0.f;
    if (!any) continue;
    __m512 x[C];
    for (int c = 0; c < C; ++c) x[c] = load16(v + j * Dv + c * 16, last, Whole || c < C - 1);
    for (int g = 0; g < G; ++g) {
      if (weight[g] == 0.f) continue;  // (0 times a non-finite value would not be 0)
      const __m512 wv = _mm512_set1_ps(weight[g]);
      for (int c = 0; c < C; ++c) sum[g][c] = _mm512_fmadd_ps(wv, x[c], sum[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c)
      _mm512_mask_storeu_ps(acc + g * Dv + c * 16, c == C - 1 ? last : __mmask16(0xFFFF), sum[g][c]);
}

// The largest group whose accumulators or query chunks (G x C registers) leave room in the 32 vector registers.
constexpr int group_for(int chunks) { return chunks <= 4 ? kMaxGroup : chunks <= 6 ? 2 : 1; }

// PoPE's logits (magnitude_logits_avx512) for G rows at once: per key and chunk the magnitudes times the tables,
// u = mu cos and v = mu sin, formed once for the group, then each row adds a . u + b . v (bf16, 4 rows per kv head:
// 0.75-0.89x the time of one row at a time in three runs; docs/results/decode-row-groups-ab-amd-epyc).
template <int G, int C, bool Whole, typename T>
void magnitude_logits_group(int64_t d, const float* qa, const T* mu, const float* tables, float* s, int64_t n) {
  if constexpr (G == 1) {  // one row: its query in registers, the tables' products per key (as measured)
    magnitude_logits_avx512<C, Whole>(d, qa, mu, tables, s, n);
  } else {
    const __mmask16 last = lanes_mask(d - (C - 1) * 16);
    lane_summed<G>(n, _mm512_set1_ps(1.f), s, [&](int64_t j) {
      const T* m = mu + j * d;
      const float* cs = tables + j * 2 * d;
      std::array<__m512, G> acc;
      for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
      for (int c = 0; c < C; ++c) {
        const bool whole = Whole || c < C - 1;
        const __m512 mv = load16(m + c * 16, last, whole);
        const __m512 u = _mm512_mul_ps(mv, load16(cs + c * 16, last, whole));
        const __m512 v = _mm512_mul_ps(mv, load16(cs + d + c * 16, last, whole));
        for (int g = 0; g < G; ++g) {
          const float* row = qa + g * 2 * d + c * 16;
          acc[g] = _mm512_fmadd_ps(load16(row, last, whole), u,
                                   _mm512_fmadd_ps(load16(row + d, last, whole), v, acc[g]));
        }
      }
      return acc;
    });
  }
}

// PoPE's logits for R rows (DecodeShape's), in groups of rows.
template <int C, bool Whole, typename T>
void magnitude_logits_rows(const DecodeShape& p, const float* qa, const T* mu, const float* tables, float* s,
                           int64_t n) {
  in_row_groups(p.R, kMaxGroup, [&](auto G, int64_t r0) {
    magnitude_logits_group<G(), C, Whole>(p.d, qa + r0 * 2 * p.d, mu, tables, s + r0 * n, n);
  });
}

// s (R x n) = scale q k^T for rows q (R x E, fp32), keys k (n x E) where they lie (bf16 keys one row at a time:
// kMaxGroup says why).
template <int C, bool Whole, typename T>
void dot_logits_avx512(int64_t R, int64_t E, float scale, const float* q, const T* k, float* s, int64_t n) {
  in_row_groups(R, std::is_same<T, float>::value ? group_for(C) : 1, [&](auto G, int64_t r0) {
    dot_logits_group<G(), C, Whole>(E, scale, q + r0 * E, k, s + r0 * n, n);
  });
}

// acc (R x Dv) += w (R x n) v (n x Dv), v where it lies.
template <int C, bool Whole, typename T>
void weighted_values_avx512(int64_t R, int64_t Dv, const float* w, int64_t n, const T* v, float* acc) {
  in_row_groups(R, group_for(C), [&](auto G, int64_t r0) {
    weighted_values_group<G(), C, Whole>(Dv, w + r0 * n, n, n, v, acc + r0 * Dv);
  });
}

constexpr int64_t kRegisterChunks = 8;  // rows up to 128 wide take the register forms

// f(std::integral_constant<int, C>) for C = chunks in 1..kRegisterChunks.
template <typename F>
void with_chunks(int64_t chunks, F f) {
  switch (chunks) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}
#endif

// Whether a row of `width` values fits the register forms: an AVX-512 library, at most kRegisterChunks chunks.
bool fits_registers(int64_t width) {
#ifdef CPU_CAPABILITY_AVX512
  return width > 0 && (width + 15) / 16 <= kRegisterChunks;
#else
  return false;
#endif
}

// acc (R x Dv) += w (R x n) v (n x Dv), v in the cache's dtype where it lies: the register form when `registers`
// (and fits_registers(Dv)), else fp32 rows (bf16 widened into vbuf, n x Dv).
template <typename T>
void add_weighted_values(bool registers, int64_t R, int64_t Dv, const float* w, int64_t n, const T* v, float* acc,
                         float* vbuf) {
#ifdef CPU_CAPABILITY_AVX512
  if (registers && fits_registers(Dv)) {
    with_chunks((Dv + 15) / 16, [&](auto C) {
      if (Dv % 16 == 0) weighted_values_avx512<C(), true>(R, Dv, w, n, v, acc);
      else weighted_values_avx512<C(), false>(R, Dv, w, n, v, acc);
    });
    return;
  }
#endif
  weighted_values(R, Dv, w, n, widen(v, n * Dv, vbuf), acc);
}

// The frame of a decode: R query rows per (batch, kv head) pair (new tokens x the query heads that share the kv
// head) against L cached keys. It reads the whole cache per step and is memory-bound. Each thread takes pairs and
// walks each pair's keys in blocks of kDecodeBlock: block(state, pair, k0, n, s, m, l, acc) takes the logits of keys
// [k0, k0 + n) into s (R x n, scratch of R x kDecodeBlock), the online softmax step over them (m, l: the rows'
// running max and sum) and their weighted values into acc (R x Dv). When there are fewer pairs than threads, the
// keys are split among the threads as well, each split keeping its own softmax state, merged at the end into out
// (pairs x R rows of Dv, in O) and, when lse is given, the rows' logsumexp: a row that sees no key outputs zeros
// (logsumexp -inf); a NaN logit makes its split's max or sum NaN, and the row's output NaN.
// make_state() builds one thread's scratch; products: whether blocks take the bf16 products (brgemm's tile
// registers are handed back at the end of a thread's share).
template <typename O, typename MakeState, typename Block>
void decode_frame(int64_t pairs, int64_t R, int64_t Dv, int64_t L, bool products, MakeState make_state, Block block,
                  O* out, float* lse) {
  const int64_t blocks = (L + kDecodeBlock - 1) / kDecodeBlock;
  const int64_t splits =
      std::max<int64_t>(1, std::min<int64_t>(blocks, (at::get_num_threads() + pairs - 1) / pairs));
  const int64_t tasks = pairs * splits;  // task = split * pairs + pair: a thread's run of tasks shares key splits
  std::vector<float> m(tasks * R, kNegInf), l(tasks * R, 0.f), acc(tasks * R * Dv, 0.f);
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    const ProductsSession session(products);
    auto state = make_state();
    std::vector<float> s(R * kDecodeBlock);
    for (int64_t first = begin; first < end;) {
      const int64_t split = first / pairs, last = std::min(end, (split + 1) * pairs);
      const int64_t k_begin = split * blocks / splits * kDecodeBlock,
                    k_end = std::min(L, (split + 1) * blocks / splits * kDecodeBlock);
      for (int64_t task = first; task < last; ++task)
        for (int64_t k0 = k_begin; k0 < k_end; k0 += kDecodeBlock)
          block(state, task % pairs, k0, std::min(kDecodeBlock, k_end - k0), s.data(), m.data() + task * R,
                l.data() + task * R, acc.data() + task * R * Dv);
      first = last;
    }
  });
  // out = sum_i e^{m_i - M} acc_i / sum_i e^{m_i - M} l_i over the splits i, M the largest m_i
  at::parallel_for(0, pairs * R, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> o(Dv);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t pair = row / R, r = row % R;
      float top = kNegInf;
      for (int64_t i = 0; i < splits; ++i) {
        const float mi = m[(i * pairs + pair) * R + r];
        if (mi > top || std::isnan(mi)) top = mi;
      }
      std::fill(o.begin(), o.end(), std::isnan(top) ? std::numeric_limits<float>::quiet_NaN() : 0.f);
      float total = 0.f;
      if (top != kNegInf && !std::isnan(top)) {
        for (int64_t i = 0; i < splits; ++i) {
          const int64_t at = (i * pairs + pair) * R + r;
          if (m[at] == kNegInf) continue;
          const float factor = std::exp(m[at] - top);
          total += factor * l[at];
          const float* a = acc.data() + at * Dv;
          for (int64_t x = 0; x < Dv; ++x) o[x] += factor * a[x];
        }
        scale_row(o.data(), Dv, 1.f / total);
      }
      narrow(o.data(), Dv, out + row * Dv);
      if (lse) lse[row] = top == kNegInf || std::isnan(top) ? top : top + std::log(total);
    }
  });
}

template <typename T>
void magnitude_decode_kernel(const DecodeShape& p, const float* qa, const T* mu, const T* v, const float* angles,
                             float* out) {
  constexpr bool wide = !std::is_same<T, float>::value;
  const int64_t logit_chunks = (p.d + 15) / 16;
  // bf16 caches take the register forms: 6.2-6.4 against 11.0-11.3 ms through the widening scratch (B = 8, Hkv = 8,
  // 8192 keys on the 2-core AMD EPYC); fp32 ones the portable loops, which measured faster there for one row per kv
  // head (9.7-12.1 against 11.9-13.0 ms; why is not known), but not for several rows, which the register forms
  // take in groups (4 rows, fp32: weighted values 0.87-0.91x the portable loop's time in two runs, logits 0.92-0.98x
  // in two; 1 row in registers: 1.03-1.07x; docs/results/decode-row-groups-ab-amd-epyc)
  const bool logits_in_registers = (wide || p.R > 1) && fits_registers(p.d),
             values_in_registers = (wide || p.R > 1) && fits_registers(p.Dv);
  const bool tiled = p.R >= p.tiled_rows;
  // the products form's C (R x cols) = A (R x inner) op(B) + beta C, A and B row-major with their own widths as
  // strides: bf16 products where the call takes them, else sgemm
  auto multiply = [&](bool tb, int64_t cols, int64_t inner, const float* a, const float* b, float beta, float* c,
                      int64_t ldc, bool varying_inner) {
    const int64_t ldb = tb ? inner : cols;
    if (p.products)
      gemm_bf16(false, tb, p.R, cols, inner, 1.f, a, inner, b, ldb, beta, c, ldc, varying_inner);
    else
      gemm(false, tb, p.R, cols, inner, 1.f, a, inner, b, ldb, beta, c, ldc);
  };
  struct Scratch {
    std::vector<float> mu, v, keys;  // widened magnitudes and values, a block's Cartesian keys
  };
  auto make_state = [&] {
    return Scratch{std::vector<float>(wide && (tiled || !logits_in_registers) ? kDecodeBlock * p.d : 0),
                   std::vector<float>(wide && (tiled || !values_in_registers) ? kDecodeBlock * p.Dv : 0),
                   std::vector<float>(tiled ? kDecodeBlock * 2 * p.d : 0)};
  };
  auto block = [&](Scratch& st, int64_t pair, int64_t k0, int64_t n, float* s, float* m, float* l, float* acc) {
    const int64_t b = pair / p.Hkv, h = pair % p.Hkv;
    const float* q_t = qa + pair * p.R * 2 * p.d;
    const float* tables = angles + ((p.angle_rows == 1 ? 0 : b) * p.L + k0) * 2 * p.d;
    const T* mu_t = mu + b * p.mu_batch + h * p.mu_head + k0 * p.d;
    const T* v_t = v + b * p.v_batch + h * p.v_head + k0 * p.Dv;
    if (tiled) {
      cartesian_keys(p.d, widen(mu_t, n * p.d, st.mu.data()), tables, n, st.keys.data());
      multiply(true, n, 2 * p.d, q_t, st.keys.data(), 0.f, s, n, false);
      hide_keys(p, b, k0, s, n);
      softmax_step(p.Dv, s, p.R, n, m, l, acc);
      const float* v_block = widen(v_t, n * p.Dv, st.v.data());
      if (block_visible(p, b, k0, n))
        multiply(false, p.Dv, n, s, v_block, 1.f, acc, p.Dv, true);  // (n: the block's keys)
      else
        weighted_values(p.R, p.Dv, s, n, v_block, acc);
      return;
    }
#ifdef CPU_CAPABILITY_AVX512
    if (logits_in_registers)
      with_chunks(logit_chunks, [&](auto C) {
        if (p.d % 16 == 0) magnitude_logits_rows<C(), true>(p, q_t, mu_t, tables, s, n);
        else magnitude_logits_rows<C(), false>(p, q_t, mu_t, tables, s, n);
      });
    else
#endif
      magnitude_logits(p, q_t, widen(mu_t, n * p.d, st.mu.data()), tables, s, n);
    hide_keys(p, b, k0, s, n);
    softmax_step(p.Dv, s, p.R, n, m, l, acc);
    add_weighted_values(values_in_registers, p.R, p.Dv, s, n, v_t, acc, st.v.data());
  };
  decode_frame<float>(p.B * p.Hkv, p.R, p.Dv, p.L, tiled && p.products, make_state, block, out, nullptr);
}

// The flash forms (no bias, a distance table, offset embeddings) for few query rows per kv head: a decode step,
// whose call through the tiles (forward_kernel) takes one query head at a time, so that a kv head's keys and values
// are read once for each of its query heads, and, with the bf16 products, packed first (read, written and read
// again). Here the decode frame takes a kv head's query rows together (R = g Tq: query head h0 + r / Tq, step
// r % Tq) and reads each key and value once where it lies: the logits and weighted values by the register forms
// in both dtypes (rows up to kRegisterChunks chunks wide on AVX-512; for fp32 these measured faster than sgemm over
// a block and the portable loop, unlike in PoPE's decode above: 3.2-3.7 against 5.7-6.6 ms at B = 8, H = 8,
// Hkv = 2, 8192 keys on the 2-core AMD EPYC, two alternations), else sgemm and the portable loop over fp32 rows
// (bf16 widened). The bias and mask of each query head's rows are the tiles' own. The caller chooses this form by
// the rows per kv head (cpu_flash.py; a machine's calibration measures from how many rows the tiles are faster).
template <typename T>
void flash_decode_kernel(const Problem& p, const T* q, const T* k, const T* v, T* out, float* lse) {
  constexpr bool wide = !std::is_same<T, float>::value;
  const int64_t R = p.g * p.Tq, queries = p.B * p.H * p.Tq * p.E;
  std::vector<float> qbuf(wide ? queries : 0);
  const float* qf = widen(q, queries, qbuf.data());  // a pair's R rows lie together: its query heads are adjacent
  std::vector<int64_t> key_end(p.B), full_end(p.B);  // per batch row: the keys after key_end are hidden from all
  for (int64_t b = 0; b < p.B; ++b) tile_keys(p, b, 0, p.Tq, &key_end[b], &full_end[b]);
  const bool logits_in_registers = fits_registers(p.E);
  struct Scratch {
    std::vector<float> z, k, v;  // relative PE's q . e, widened keys and values
  };
  auto make_state = [&] {
    return Scratch{{}, std::vector<float>(wide && !logits_in_registers ? kDecodeBlock * p.E : 0),
                   std::vector<float>(wide && !fits_registers(p.Dv) ? kDecodeBlock * p.Dv : 0)};
  };
  auto block = [&](Scratch& st, int64_t pair, int64_t k0, int64_t n, float* s, float* m, float* l, float* acc) {
    const int64_t b = pair / p.Hkv, h0 = pair % p.Hkv * p.g;
    n = std::min(n, key_end[b] - k0);
    if (n <= 0) return;
    const float* qt = qf + pair * R * p.E;
    const T* kt = k + p.k_at(b, h0) + k0 * p.E;
#ifdef CPU_CAPABILITY_AVX512
    if (logits_in_registers)
      with_chunks((p.E + 15) / 16, [&](auto C) {
        if (p.E % 16 == 0) dot_logits_avx512<C(), true>(R, p.E, p.scale, qt, kt, s, n);
        else dot_logits_avx512<C(), false>(R, p.E, p.scale, qt, kt, s, n);
      });
    else
#endif
      gemm(false, true, R, n, p.E, p.scale, qt, p.E, widen(kt, n * p.E, st.k.data()), p.E, 0.f, s, n);
    for (int64_t r0 = 0; r0 < R; r0 += p.Tq) {
      OffsetSpan span{};
      bias_and_mask(p, b, h0 + r0 / p.Tq, s + r0 * n, st.z, qt + r0 * p.E, p.Tq, n, 0, k0, full_end[b], &span);
    }
    softmax_step(p.Dv, s, R, n, m, l, acc);
    add_weighted_values(true, R, p.Dv, s, n, v + p.v_at(b, h0) + k0 * p.Dv, acc, st.v.data());
  };
  decode_frame<T>(p.B * p.Hkv, R, p.Dv, p.Tk, false, make_state, block, out, lse);
}

// flash_forward's arguments less the tiles and the bf16 products, by flash_decode_kernel; the same (out, lse).
std::vector<at::Tensor> flash_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                     bool causal, const at::Tensor& q_pos, const at::Tensor& k_pos,
                                     const at::Tensor& pad, int64_t bias_kind, const at::Tensor& bias_values,
                                     int64_t bias_hi, int64_t bias_max, double bias_scale) {
  const Problem p = make_problem(q, k, v, scale, causal, q_pos, k_pos, pad, bias_kind, bias_values, bias_hi, bias_max,
                                 bias_scale, std::max<int64_t>(1, q.size(2)), kDecodeBlock, false);
  auto out = at::empty({p.B, p.H, p.Tq, p.Dv}, q.options());
  auto lse = at::empty({p.B, p.H, p.Tq}, q.options().dtype(at::kFloat));
  if (out.numel() == 0 && lse.numel() == 0) return {out, lse};
  if (q.scalar_type() == at::kFloat) {
    flash_decode_kernel<float>(p, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>(),
                               lse.data_ptr<float>());
  } else {
    using B = at::BFloat16;
    flash_decode_kernel<B>(p, q.data_ptr<B>(), k.data_ptr<B>(), v.data_ptr<B>(), out.data_ptr<B>(),
                           lse.data_ptr<float>());
  }
  return {out, lse};
}

// q (B, Hkv, R, 2d) fp32 contiguous, the Cartesian query rows; mu (B, Hkv, L, d) and v (B, Hkv, L, Dv) of one dtype
// (fp32 or bf16), rows contiguous; angles (P, L, 2d) fp32 contiguous, P = 1 or B; pad (B, L) bool (True: a real
// key) or empty; q_pos (P', Tq) and k_pos (P', L) int64 contiguous, P' = 1 or B, for a mask causal by position
// (row r is step r % Tq of its query head), or both empty; bf16_products: the products form multiplies a bf16 cache
// in bf16; tiled_rows: from this many rows R the products form. Returns (B, Hkv, R, Dv) fp32.
at::Tensor magnitude_decode(const at::Tensor& q, const at::Tensor& mu, const at::Tensor& v, const at::Tensor& angles,
                            const at::Tensor& pad, const at::Tensor& q_pos, const at::Tensor& k_pos, bool bf16_products,
                            int64_t tiled_rows) {
  TORCH_CHECK(q.dim() == 4 && q.scalar_type() == at::kFloat && q.is_contiguous() && q.size(3) % 2 == 0,
              "cpu_flash: magnitude_decode takes the query as a contiguous fp32 (B, Hkv, R, 2d) tensor");
  const int64_t B = q.size(0), Hkv = q.size(1), R = q.size(2), d = q.size(3) / 2;
  TORCH_CHECK(mu.dim() == 4 && mu.size(0) == B && mu.size(1) == Hkv && mu.size(3) == d && (d <= 1 || mu.stride(3) == 1) &&
                  (mu.size(2) <= 1 || mu.stride(2) == d) && (mu.scalar_type() == at::kFloat || mu.scalar_type() == at::kBFloat16),
              "cpu_flash: magnitude_decode takes the magnitudes as fp32 or bf16 (B, Hkv, L, d) with contiguous rows");
  const int64_t L = mu.size(2);
  TORCH_CHECK(v.dim() == 4 && v.size(0) == B && v.size(1) == Hkv && v.size(2) == L && (v.size(3) <= 1 || v.stride(3) == 1) &&
                  (L <= 1 || v.stride(2) == v.size(3)) && v.scalar_type() == mu.scalar_type(),
              "cpu_flash: magnitude_decode takes the values as (B, Hkv, L, Dv) of the magnitudes' dtype, rows "
              "contiguous");
  TORCH_CHECK(angles.dim() == 3 && (angles.size(0) == 1 || angles.size(0) == B) && angles.size(1) == L &&
                  angles.size(2) == 2 * d && angles.scalar_type() == at::kFloat && angles.is_contiguous(),
              "cpu_flash: magnitude_decode takes the angle tables as a contiguous fp32 (1 or B, L, 2d) tensor");
  const bool padded = pad.numel() > 0;
  TORCH_CHECK(!padded || (pad.dim() == 2 && pad.size(0) == B && pad.size(1) == L && pad.is_contiguous() &&
                          pad.scalar_type() == at::kBool),
              "cpu_flash: magnitude_decode takes the key padding mask as a contiguous bool (B, L) tensor, or an "
              "empty one");
  const bool causal = q_pos.numel() > 0;
  TORCH_CHECK(causal == (k_pos.numel() > 0) &&
                  (!causal || (q_pos.dim() == 2 && k_pos.dim() == 2 && q_pos.size(0) == k_pos.size(0) &&
                               (q_pos.size(0) == 1 || q_pos.size(0) == B) && k_pos.size(1) == L &&
                               R % q_pos.size(1) == 0 && q_pos.scalar_type() == at::kLong &&
                               k_pos.scalar_type() == at::kLong && q_pos.is_contiguous() && k_pos.is_contiguous())),
              "cpu_flash: magnitude_decode takes positions as contiguous int64 (1 or B, Tq) and (1 or B, L) tensors "
              "with R a multiple of Tq, or two empty ones");
  TORCH_CHECK(tiled_rows >= 1, "cpu_flash: magnitude_decode takes tiled_rows >= 1, got ", tiled_rows);
  TORCH_CHECK(!bf16_products || (mu.scalar_type() == at::kBFloat16 && cpu_has_bf16_products()),
              "cpu_flash: magnitude_decode takes bf16 products for a bf16 cache on a CPU with AVX512_BF16 only");
  const int64_t Dv = v.size(3);
  auto out = at::empty({B, Hkv, R, Dv}, q.options());
  if (out.numel() == 0) return out;
  const DecodeShape p{B, Hkv, R, L, d, Dv, angles.size(0), mu.stride(0), mu.stride(1), v.stride(0), v.stride(1),
                      padded ? pad.data_ptr<bool>() : nullptr, causal ? q_pos.data_ptr<int64_t>() : nullptr,
                      causal ? k_pos.data_ptr<int64_t>() : nullptr, causal ? q_pos.size(0) : 1,
                      causal ? q_pos.size(1) : 1, bf16_products, tiled_rows};
  if (mu.scalar_type() == at::kFloat) {
    magnitude_decode_kernel<float>(p, q.data_ptr<float>(), mu.data_ptr<float>(), v.data_ptr<float>(),
                                   angles.data_ptr<float>(), out.data_ptr<float>());
  } else {
    using B16 = at::BFloat16;
    magnitude_decode_kernel<B16>(p, q.data_ptr<float>(), mu.data_ptr<B16>(), v.data_ptr<B16>(),
                                 angles.data_ptr<float>(), out.data_ptr<float>());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(poskit_cpu_flash, m) {
  m.def("row_dot(Tensor a, Tensor b) -> Tensor", &row_dot);
  m.def("bf16_products_available() -> bool", [] { return cpu_has_bf16_products(); });
  m.def("decode_tiled_rows() -> int", [] { return kTiledRows; });
  m.def("brgemm_shapes(bool record) -> int", &brgemm_shapes);
  m.def("forward(Tensor q, Tensor k, Tensor v, float scale, bool causal, Tensor q_pos, Tensor k_pos, Tensor pad, "
        "int bias_kind, Tensor bias_values, int bias_hi, int bias_max, float bias_scale, int bq, int bk, "
        "bool bf16_products) -> Tensor[]",
        &flash_forward);
  m.def("decode(Tensor q, Tensor k, Tensor v, float scale, bool causal, Tensor q_pos, Tensor k_pos, Tensor pad, "
        "int bias_kind, Tensor bias_values, int bias_hi, int bias_max, float bias_scale) -> Tensor[]",
        &flash_decode);
  m.def("backward(Tensor q, Tensor k, Tensor v, Tensor dout, Tensor lse, Tensor delta, float scale, bool causal, "
        "Tensor q_pos, Tensor k_pos, Tensor pad, int bias_kind, Tensor bias_values, int bias_hi, int bias_max, "
        "float bias_scale, int bq, int bk, bool bf16_products) -> Tensor[]",
        &flash_backward);
  m.def("contextual_forward(Tensor q, Tensor k, Tensor v, float scale, bool causal, Tensor q_pos, Tensor k_pos, "
        "Tensor pad, Tensor emb, Tensor slopes, int p_max, int bq, int bk, bool bf16_products) -> Tensor[]",
        &contextual_forward);
  m.def("contextual_backward(Tensor q, Tensor k, Tensor v, Tensor dout, Tensor lse, Tensor delta, Tensor gtot, "
        "float scale, bool causal, Tensor q_pos, Tensor k_pos, Tensor pad, Tensor emb, Tensor slopes, int p_max, "
        "int bq, int bk, bool bf16_products) -> Tensor[]", &contextual_backward);
  m.def("polar_forward(Tensor x, Tensor ca, Tensor sa, Tensor cd, Tensor sd, float scale, bool softplus) -> Tensor",
        &polar_forward);
  m.def("polar_backward(Tensor grad, Tensor x, Tensor ca, Tensor sa, Tensor cd, Tensor sd, float scale, "
        "bool softplus, bool need_rotation) -> Tensor[]", &polar_backward);
  m.def("magnitude_decode(Tensor q, Tensor mu, Tensor v, Tensor angles, Tensor pad, Tensor q_pos, Tensor k_pos, "
        "bool bf16_products, int tiled_rows) -> Tensor", &magnitude_decode);
}
