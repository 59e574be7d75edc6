// Exact tiled (flash-style) attention on CPU for query/key width E and value width Dv, E != Dv allowed.
//
// Why it exists: CPU SDPA's flash kernel refuses unequal q/k and v head dims, so PoPE (q/k 2d wide, v d wide)
// either pads v to 2d (a third of the work on zeros) or runs poskit's blocked path, whose key rows outgrow the
// cache at long T. Here every (query tile x key tile) product goes through MKL's GEMM on tiles that stay in
// cache, the softmax is online (running row max and sum, logsumexp saved for the backward) and causal tiles
// past a query tile's last visible key are skipped.
//
// Layout: q (BH, Tq, E), k (BH, Tk, E), v (BH, Tk, Dv), contiguous, kv heads already matched to the queries.
// Masking is causal *by position* with one position vector shared by the batch: key s is visible to query t
// iff k_pos[s] <= q_pos[t]. The caller passes, per query tile, key_end (keys past it are invisible to the
// whole tile) and full_end (keys before it are visible to all of it), so only [full_end, key_end) is masked.
// bf16 inputs multiply in bf16 with fp32 accumulation; every softmax statistic is fp32.
// Compiled lazily by poskit/attention/cpu_flash.py; the MKL symbols come from libtorch_cpu.

#if defined(__AVX512F__)
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__)
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#else
#define CPU_CAPABILITY DEFAULT
#endif

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

extern "C" {
// MKL (LP64) as linked into libtorch_cpu: Fortran sgemm (column major) and the bf16 x bf16 -> fp32 GEMM
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
void cblas_gemm_bf16bf16f32(int layout, int transa, int transb, int m, int n, int k, float alpha,
                            const uint16_t* a, int lda, const uint16_t* b, int ldb, float beta, float* c, int ldc);
}

namespace {

void scale_row(float* x, int n, float factor);

using Vec = at::vec::Vectorized<float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Row-major C (m x n) = alpha * op(A) op(B) + beta * C, op = transpose when the flag is set.
// (A row-major product is the column-major product of the transposes with the operands swapped.)
void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
          float beta, float* c, int ldc) {
  const char opa = ta ? 'T' : 'N', opb = tb ? 'T' : 'N';
  sgemm_(&opb, &opa, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
}

// bf16 x bf16 -> fp32: MKL's GEMM, the one CPU SDPA's bf16 kernel reaches too (measured with perf; on this
// AMD CPU MKL widens the tiles to fp32 inside). alpha applies to the product only.
void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const at::BFloat16* a, int lda, const at::BFloat16* b,
          int ldb, float beta, float* c, int ldc) {
  constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // CBLAS enum values
  cblas_gemm_bf16bf16f32(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, m, n, k, alpha,
                         reinterpret_cast<const uint16_t*>(a), lda, reinterpret_cast<const uint16_t*>(b), ldb, beta,
                         c, ldc);
}

// An fp32 tile as a GEMM operand of the input's type: itself for fp32, a rounded copy in `scratch` for bf16.
const float* as_operand(const float* src, int64_t, float*) { return src; }
const at::BFloat16* as_operand(const float* src, int64_t n, at::BFloat16* scratch) {
  at::vec::convert(src, scratch, n);
  return scratch;
}

// Horizontal reductions of one vector register, through memory (once per row: not worth intrinsics).
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

float row_max(const float* x, int n) {
  int c = 0;
  float best = kNegInf;
  if (n >= Vec::size()) {
    Vec acc = Vec::loadu(x);
    for (c = Vec::size(); c + Vec::size() <= n; c += Vec::size()) acc = at::vec::maximum(acc, Vec::loadu(x + c));
    best = lanes_max(acc);
  }
  for (; c < n; ++c) best = std::max(best, x[c]);
  return best;
}

// x[c] = exp(x[c] - shift) in place; returns the sum. exp_u20: the vectorised exp torch's own CPU flash kernel
// uses, accurate to about 20 ulp (softmax sums of such terms stay within fp32 test tolerances).
float exp_shifted(float* x, int n, float shift) {
  const Vec s(shift);
  Vec acc(0.f);
  int c = 0;
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

void scale_row(float* x, int n, float factor) {
  const Vec f(factor);
  int c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) (Vec::loadu(x + c) * f).store(x + c);
  for (; c < n; ++c) x[c] *= factor;
}

// s (rows x n, leading dim ld) for queries [q0, q0 + rows) and keys [k0, k0 + n): -inf where the key is later.
void mask_tile(float* s, int rows, int n, int ld, const int64_t* qp, const int64_t* kp, int64_t q0, int64_t k0) {
  for (int r = 0; r < rows; ++r) {
    const int64_t limit = qp[q0 + r];
    float* row = s + (int64_t)r * ld;
    for (int c = 0; c < n; ++c)
      if (kp[k0 + c] > limit) row[c] = kNegInf;
  }
}

struct Plan {
  int64_t BH, Tq, Tk, E, Dv, bq, bk;
  float scale;
  bool masked;  // causal by position: key_end/full_end and the positions apply
  const int64_t *qp, *kp, *key_end, *full_end;
};

Plan make_plan(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, bool causal,
               const at::Tensor& q_pos, const at::Tensor& k_pos, const at::Tensor& key_end,
               const at::Tensor& full_end, int64_t bq, int64_t bk) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "cpu_flash: q, k, v must be (BH, T, width)");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), "cpu_flash: inputs must be contiguous");
  TORCH_CHECK(q.size(0) == k.size(0) && k.size(0) == v.size(0) && k.size(1) == v.size(1) && q.size(2) == k.size(2),
              "cpu_flash: q/k/v shapes disagree");
  Plan p{q.size(0), q.size(1), k.size(1), q.size(2), v.size(2), bq, bk, (float)scale, causal,
         nullptr, nullptr, nullptr, nullptr};
  if (causal) {
    const int64_t tiles = (p.Tq + bq - 1) / bq;
    TORCH_CHECK(q_pos.numel() == p.Tq && k_pos.numel() == p.Tk && key_end.numel() == tiles &&
                full_end.numel() == tiles, "cpu_flash: position/plan sizes disagree");
    p.qp = q_pos.data_ptr<int64_t>();
    p.kp = k_pos.data_ptr<int64_t>();
    p.key_end = key_end.data_ptr<int64_t>();
    p.full_end = full_end.data_ptr<int64_t>();
  }
  return p;
}

inline int64_t tile_key_end(const Plan& p, int64_t tile) { return p.masked ? p.key_end[tile] : p.Tk; }
inline int64_t tile_full_end(const Plan& p, int64_t tile) { return p.masked ? p.full_end[tile] : p.Tk; }

template <typename T>
void forward_kernel(const Plan& p, const T* q, const T* k, const T* v, T* out, float* lse) {
  const int64_t tiles = (p.Tq + p.bq - 1) / p.bq;
  at::parallel_for(0, p.BH * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(p.bq * p.bk), acc(p.bq * p.Dv), m(p.bq), l(p.bq);
    std::vector<T> p_op(std::is_same<T, float>::value ? 0 : p.bq * p.bk);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / tiles, tile = task % tiles;
      const int64_t q0 = tile * p.bq, rows = std::min(p.bq, p.Tq - q0);
      const int64_t ke = tile_key_end(p, tile), fe = tile_full_end(p, tile);
      const T* qt = q + (bh * p.Tq + q0) * p.E;
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.f);
      for (int64_t k0 = 0; k0 < ke; k0 += p.bk) {
        const int n = (int)std::min(p.bk, ke - k0);
        const T* kt = k + (bh * p.Tk + k0) * p.E;
        gemm(false, true, rows, n, p.E, p.scale, qt, p.E, kt, p.E, 0.f, s.data(), n);
        if (k0 + n > fe) mask_tile(s.data(), rows, n, n, p.qp, p.kp, q0, k0);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = s.data() + r * n;
          const float m_new = std::max(m[r], row_max(row, n));
          if (m_new == kNegInf) {  // nothing visible to this query yet: its weights in this tile are 0
            std::fill(row, row + n, 0.f);
            continue;
          }
          const float rescale = std::exp(m[r] - m_new);  // 0 when m was -inf
          l[r] = l[r] * rescale + exp_shifted(row, n, m_new);
          if (rescale != 1.f) scale_row(acc.data() + r * p.Dv, p.Dv, rescale);
          m[r] = m_new;
        }
        const T* pt = as_operand(s.data(), rows * n, p_op.data());
        gemm(false, false, rows, p.Dv, n, 1.f, pt, n, v + (bh * p.Tk + k0) * p.Dv, p.Dv, 1.f, acc.data(), p.Dv);
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* o = out + (bh * p.Tq + q0 + r) * p.Dv;
        const float* a = acc.data() + r * p.Dv;
        if (l[r] == 0.f) {  // a query that sees no key outputs zeros (the engine's convention)
          std::fill(o, o + p.Dv, T(0.f));
          lse[bh * p.Tq + q0 + r] = kNegInf;
          continue;
        }
        const float inv = 1.f / l[r];
        for (int64_t c = 0; c < p.Dv; ++c) o[c] = T(a[c] * inv);
        lse[bh * p.Tq + q0 + r] = m[r] + std::log(l[r]);
      }
    }
  });
}

// One task per (batch x head): it owns that head's dK and dV, so no accumulation crosses threads, and every
// tile pair is visited once (five GEMMs: S, dV, dP, dQ, dK), as in FlashAttention-2's backward.
template <typename T>
void backward_kernel(const Plan& p, const T* q, const T* k, const T* v, const T* dout, const float* lse,
                     const float* delta, T* dq, T* dk, T* dv) {
  const int64_t tiles = (p.Tq + p.bq - 1) / p.bq;
  at::parallel_for(0, p.BH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(p.bq * p.bk), dp(p.bq * p.bk), dq_acc(p.bq * p.E), dk_acc(p.Tk * p.E),
        dv_acc(p.Tk * p.Dv);
    const bool half = !std::is_same<T, float>::value;
    std::vector<T> p_op(half ? p.bq * p.bk : 0), ds_op(half ? p.bq * p.bk : 0);
    for (int64_t bh = begin; bh < end; ++bh) {
      std::fill(dk_acc.begin(), dk_acc.end(), 0.f);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.f);
      const T* kh = k + bh * p.Tk * p.E;
      const T* vh = v + bh * p.Tk * p.Dv;
      for (int64_t tile = 0; tile < tiles; ++tile) {
        const int64_t q0 = tile * p.bq, rows = std::min(p.bq, p.Tq - q0);
        const int64_t ke = tile_key_end(p, tile), fe = tile_full_end(p, tile);
        const T* qt = q + (bh * p.Tq + q0) * p.E;
        const T* dot = dout + (bh * p.Tq + q0) * p.Dv;
        const float* lse_t = lse + bh * p.Tq + q0;
        const float* delta_t = delta + bh * p.Tq + q0;
        std::fill(dq_acc.begin(), dq_acc.end(), 0.f);
        for (int64_t k0 = 0; k0 < ke; k0 += p.bk) {
          const int n = (int)std::min(p.bk, ke - k0);
          gemm(false, true, rows, n, p.E, p.scale, qt, p.E, kh + k0 * p.E, p.E, 0.f, s.data(), n);
          if (k0 + n > fe) mask_tile(s.data(), rows, n, n, p.qp, p.kp, q0, k0);
          for (int64_t r = 0; r < rows; ++r) {  // P = exp(S - logsumexp), recomputed
            float* row = s.data() + r * n;
            if (lse_t[r] == kNegInf) std::fill(row, row + n, 0.f);
            else exp_shifted(row, n, lse_t[r]);
          }
          const T* pt = as_operand(s.data(), rows * n, p_op.data());
          gemm(true, false, n, p.Dv, rows, 1.f, pt, n, dot, p.Dv, 1.f, dv_acc.data() + k0 * p.Dv, p.Dv);  // dV += P^T dO
          gemm(false, true, rows, n, p.Dv, 1.f, dot, p.Dv, vh + k0 * p.Dv, p.Dv, 0.f, dp.data(), n);  // dP = dO V^T
          for (int64_t r = 0; r < rows; ++r) {  // dS = P * (dP - rowsum(dO * O)), in place in dp
            float* d = dp.data() + r * n;
            const float* pr = s.data() + r * n;
            const Vec sub(delta_t[r]);
            int c = 0;
            for (; c + Vec::size() <= n; c += Vec::size())
              (Vec::loadu(pr + c) * (Vec::loadu(d + c) - sub)).store(d + c);
            for (; c < n; ++c) d[c] = pr[c] * (d[c] - delta_t[r]);
          }
          const T* dst = as_operand(dp.data(), rows * n, ds_op.data());
          gemm(false, false, rows, p.E, n, 1.f, dst, n, kh + k0 * p.E, p.E, 1.f, dq_acc.data(), p.E);  // dQ += dS K
          gemm(true, false, n, p.E, rows, 1.f, dst, n, qt, p.E, 1.f, dk_acc.data() + k0 * p.E, p.E);  // dK += dS^T Q
        }
        scale_row(dq_acc.data(), rows * p.E, p.scale);  // dS's scale, applied once per tile instead of per GEMM
        at::vec::convert(dq_acc.data(), dq + (bh * p.Tq + q0) * p.E, rows * p.E);
      }
      scale_row(dk_acc.data(), p.Tk * p.E, p.scale);
      at::vec::convert(dk_acc.data(), dk + bh * p.Tk * p.E, p.Tk * p.E);
      at::vec::convert(dv_acc.data(), dv + bh * p.Tk * p.Dv, p.Tk * p.Dv);
    }
  });
}

}  // namespace

std::vector<at::Tensor> flash_forward(at::Tensor q, at::Tensor k, at::Tensor v, double scale, bool causal,
                                      at::Tensor q_pos, at::Tensor k_pos, at::Tensor key_end, at::Tensor full_end,
                                      int64_t bq, int64_t bk) {
  const Plan p = make_plan(q, k, v, scale, causal, q_pos, k_pos, key_end, full_end, bq, bk);
  auto out = at::empty({p.BH, p.Tq, p.Dv}, q.options());
  auto lse = at::empty({p.BH, p.Tq}, q.options().dtype(at::kFloat));
  if (q.scalar_type() == at::kFloat) {
    forward_kernel<float>(p, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>(),
                          lse.data_ptr<float>());
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "cpu_flash: float32 or bfloat16 only");
    forward_kernel<at::BFloat16>(p, q.data_ptr<at::BFloat16>(), k.data_ptr<at::BFloat16>(), v.data_ptr<at::BFloat16>(),
                                 out.data_ptr<at::BFloat16>(), lse.data_ptr<float>());
  }
  return {out, lse};
}

std::vector<at::Tensor> flash_backward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor dout, at::Tensor lse,
                                       at::Tensor delta, double scale, bool causal, at::Tensor q_pos, at::Tensor k_pos,
                                       at::Tensor key_end, at::Tensor full_end, int64_t bq, int64_t bk) {
  const Plan p = make_plan(q, k, v, scale, causal, q_pos, k_pos, key_end, full_end, bq, bk);
  TORCH_CHECK(dout.is_contiguous() && lse.is_contiguous() && delta.is_contiguous(), "cpu_flash: contiguous grads");
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  if (q.scalar_type() == at::kFloat) {
    backward_kernel<float>(p, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), dout.data_ptr<float>(),
                           lse.data_ptr<float>(), delta.data_ptr<float>(), dq.data_ptr<float>(), dk.data_ptr<float>(),
                           dv.data_ptr<float>());
  } else {
    using B = at::BFloat16;
    backward_kernel<B>(p, q.data_ptr<B>(), k.data_ptr<B>(), v.data_ptr<B>(), dout.data_ptr<B>(), lse.data_ptr<float>(),
                       delta.data_ptr<float>(), dq.data_ptr<B>(), dk.data_ptr<B>(), dv.data_ptr<B>());
  }
  return {dq, dk, dv};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &flash_forward, "tiled attention forward: (out, logsumexp)");
  m.def("backward", &flash_backward, "tiled attention backward by recomputation: (dq, dk, dv)");
}
