// ReplaySSM Gated DeltaNet / KDA verify: n <= T draft tokens per row, output-only, flush fused in.
//
// Per slot and value head: checkpoint S_c [V, K] and m committed records (g_j, u_j, k_j). Draft i
// (parent parents[i], a chain by default) has the normalised key k_i, query q_i (scaled), value
// v_i, beta_i and log decay g_i (a K-vector for KDA). With P_i = sum of g over draft i's
// ancestors-or-self, E(x) = exp(x) applied per key channel, kd_j = E(G(j+1..m-1)) . k_j the
// committed keys decayed to the last committed record and Gc = G(0..m-1):
//
//   S~_i x = S_c (E(Gc + P_i) . x) + sum_{j<m} u_j (kd_j . (E(P_i) . x))
//                                  + sum_{d in anc(i), d != i} u_d ((E(P_i - P_d) . k_d) . x)
//   u_i = beta_i (v_i - S~_i k_i)          (a triangular recursion over the drafts)
//   o_i = S~_i q_i + u_i (k_i . q_i)
// On a flush (m + n > L) S' = S_c Diag(E(Gc)) + sum_{j<m} u_j kd_j^T is written first and the same
// holds with m = 0. One read of S_c serves the 2n products S_c (.) of every draft; no state is
// written outside the flush. Drafts are appended at ring position start + m + i; the cursors
// keep only the committed records (draft = n pending), as in mamba2/replay_verify.cuh.
#pragma once

#include "../common/align.cuh"
#include "../common/cp_async.cuh"
#include "../common/cursors.cuh"
#include "../common/drafts.cuh"
#include "../common/state_tile.cuh"
#include "cta.cuh"
#include "wy.cuh"

namespace replayssm {
namespace gdn {

// Dynamic shared memory of one verify CTA for ring capacity R and T planned drafts (bytes).
template <int K, int ROWS, int L, bool PerChannelDecay>
struct VerifySmem {
  static constexpr int kG = PerChannelDecay ? K : 1;
  // Every array starts 16-byte aligned (the dot products read 4 floats at a time).
  __host__ __device__ static size_t u(int) { return 0; }  // [R][ROWS] ring u rows
  __host__ __device__ static size_t kr(int R, int) { return align16(size_t(R) * ROWS * 4); }  // [R][K] ring keys
  __host__ __device__ static size_t gr(int R, int T) {
    return kr(R, T) + align16(size_t(R) * K * 4);
  }  // [R][kG] ring decays
  __host__ __device__ static size_t kh(int R, int T) {
    return gr(R, T) + align16(size_t(R) * kG * 4);
  }  // [T][K] k^ of drafts
  __host__ __device__ static size_t qh(int R, int T) { return kh(R, T) + align16(size_t(T) * K * 4); }  // [T][K] q^
  __host__ __device__ static size_t kx(int R, int T) {
    return qh(R, T) + align16(size_t(T) * K * 4);
  }  // [T][K] E(P_i) . k^_i
  __host__ __device__ static size_t qx(int R, int T) {
    return kx(R, T) + align16(size_t(T) * K * 4);
  }  // [T][K] E(P_i) . q^_i
  __host__ __device__ static size_t gd(int R, int T) {
    return qx(R, T) + align16(size_t(T) * K * 4);
  }  // [T][kG] drafts' g
  __host__ __device__ static size_t pth(int R, int T) { return gd(R, T) + align16(size_t(T) * kG * 4); }  // [T][kG] P_i
  __host__ __device__ static size_t tot(int R, int T) { return pth(R, T) + align16(size_t(T) * kG * 4); }  // [kG] E(Gc)
  __host__ __device__ static size_t ck(int R, int T) {
    return tot(R, T) + align16(size_t(kG) * 4);
  }  // [T][L+T] coef (keys)
  __host__ __device__ static size_t cq(int R, int T) {
    return ck(R, T) + align16(size_t(T) * (L + T) * 4);
  }  // [T][L+T] (queries)
  __host__ __device__ static size_t vd(int R, int T) {
    return cq(R, T) + align16(size_t(T) * (L + T) * 4);
  }  // [T][ROWS] v
  __host__ __device__ static size_t sk(int R, int T) { return vd(R, T) + align16(size_t(T) * ROWS * 4); }  // [T][ROWS]
  __host__ __device__ static size_t sq(int R, int T) { return sk(R, T) + align16(size_t(T) * ROWS * 4); }
  __host__ __device__ static size_t ud(int R, int T) { return sq(R, T) + align16(size_t(T) * ROWS * 4); }  // drafts' u
  __host__ __device__ static size_t bytes(int R, int T) { return ud(R, T) + align16(size_t(T) * ROWS * 4); }
};

// CTAs per SM the verify kernel is compiled for. At 64 rows and K <= 128 both families sit at the
// 128-register cliff: GDN at 130 registers (the read-copy work's v and beta appends) ran three
// CTAs per SM instead of four, and a T = 4 round at B = 256 took 630 µs against 514 before; asking
// for four keeps it under 128 (24 bytes spilled at K = 128). KDA (per-channel decays) used 133
// registers and fits 128 with nothing spilled. Where shared memory allows only three CTAs (KDA at
// T >= 8) the bound costs nothing. 0 sets no minimum, as without the argument: K = 256 needs more
// registers, and fewer rows need fewer.
template <bool PerChannelDecay, int K, int ROWS>
constexpr int kVerifyMinCtas = K <= 128 && ROWS == 64 ? 4 : 0;

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PerChannelDecay, int TMAX>
__global__ void __launch_bounds__(128, kVerifyMinCtas<PerChannelDecay, K, ROWS>)
    replay_verify_kernel(const VerifyParams vp) {
  const DecodeParams& p = vp.d;
  using Tile = StateTile<TS, K, ROWS, 4>;
  using Smem = VerifySmem<K, ROWS, L, PerChannelDecay>;
  constexpr int kG = Smem::kG;
  constexpr int kV = Tile::kVec;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kChunks = V / ROWS;
  static_assert(TMAX <= kMaxDrafts && L <= 32, "one warp computes the committed decays");

  const CtaCoords c = cta_coords<V, ROWS>(p);
  const int T = vp.drafts.T;
  const int kW = L + T;  // coefficient columns: committed records, then drafts
  int64_t slot;
  if (!resolve_verify_slot<TI, ROWS>(p, c, T, &slot)) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int R = p.ring.capacity;
  TS* st = static_cast<TS*>(p.pool.state) + slot * p.pool.stride_slot + c.hv * p.pool.stride_head +
           static_cast<int64_t>(c.v0) * K;

  // 1. One round trip: checkpoint tile (registers), whole ring (async copies), drafts, cursors.
  uint4 raw[Tile::kPasses][Tile::kVpl];
  Tile::load(raw, st, warp, lane);

  extern __shared__ __align__(16) unsigned char smem[];
  float* u_s = reinterpret_cast<float*>(smem + Smem::u(R));
  float* kr_s = reinterpret_cast<float*>(smem + Smem::kr(R, T));
  float* gr_s = reinterpret_cast<float*>(smem + Smem::gr(R, T));
  float* kh_s = reinterpret_cast<float*>(smem + Smem::kh(R, T));
  float* qh_s = reinterpret_cast<float*>(smem + Smem::qh(R, T));
  float* kx_s = reinterpret_cast<float*>(smem + Smem::kx(R, T));
  float* qx_s = reinterpret_cast<float*>(smem + Smem::qx(R, T));
  float* gd_s = reinterpret_cast<float*>(smem + Smem::gd(R, T));
  float* pth_s = reinterpret_cast<float*>(smem + Smem::pth(R, T));
  float* tot_s = reinterpret_cast<float*>(smem + Smem::tot(R, T));
  float* ck_s = reinterpret_cast<float*>(smem + Smem::ck(R, T));
  float* cq_s = reinterpret_cast<float*>(smem + Smem::cq(R, T));
  float* vd_s = reinterpret_cast<float*>(smem + Smem::vd(R, T));
  float* sk_s = reinterpret_cast<float*>(smem + Smem::sk(R, T));
  float* sq_s = reinterpret_cast<float*>(smem + Smem::sq(R, T));
  float* ud_s = reinterpret_cast<float*>(smem + Smem::ud(R, T));
  const int Tl = T < TMAX ? T : TMAX;  // drafts whose inputs are fetched (T > TMAX is rejected at launch)
  {
    const float* uring = p.ring.u + slot * p.ring.u_stride_slot + c.hv * p.ring.u_stride_head + c.v0;
    const float* kring = p.ring.k + slot * p.ring.k_stride_slot + c.hk * p.ring.k_stride_head;
    const float* gring = p.ring.g + slot * p.ring.g_stride_slot + c.hv * p.ring.g_stride_head;
    constexpr int kUV = ROWS / 4;
    for (int i = tid; i < R * kUV; i += kThreads) {
      const int j = i / kUV, q = i % kUV;
      cp_async16(u_s + j * ROWS + q * 4, uring + static_cast<int64_t>(j) * V + q * 4);
    }
    for (int i = tid; i < R * (K / 4); i += kThreads) cp_async16(kr_s + i * 4, kring + i * 4);
    if constexpr (PerChannelDecay)
      for (int i = tid; i < R * (K / 4); i += kThreads) cp_async16(gr_s + i * 4, gring + i * 4);
    else
      for (int i = tid; i < R; i += kThreads) cp_async4(gr_s + i, gring + i);
  }
  __shared__ float beta_s[TMAX], qn_s[TMAX], kn_s[TMAX];
  __shared__ float wcom_s[L];  // GDN: exp(sum_{j<k<m} g_k) of committed record j
  __shared__ uint32_t anc_s[TMAX];
  __shared__ int n_s;
  {
    const int64_t bt0 = c.b * T;
    const TI* qp = static_cast<const TI*>(p.in.q) + bt0 * p.in.q_stride_batch + c.hk * p.in.q_stride_head;
    const TI* kp = static_cast<const TI*>(p.in.k) + bt0 * p.in.k_stride_batch + c.hk * p.in.k_stride_head;
    const TI* vpp = static_cast<const TI*>(p.in.v) + bt0 * p.in.v_stride_batch + c.hv * p.in.v_stride_head + c.v0;
    for (int i = tid; i < Tl * K; i += kThreads) {
      const int d = i / K, e = i % K;
      qh_s[i] = to_float(qp[d * p.in.q_stride_batch + e]);
      kh_s[i] = to_float(kp[d * p.in.k_stride_batch + e]);
      if constexpr (PerChannelDecay) gd_s[i] = step_log_decay_channel(p, bt0 + d, c.hv, e);
    }
    for (int i = tid; i < Tl * ROWS; i += kThreads)
      vd_s[i] = to_float(vpp[(i / ROWS) * p.in.v_stride_batch + i % ROWS]);
    if (tid < Tl) {
      if constexpr (!PerChannelDecay) gd_s[tid] = step_log_decay(p, bt0 + tid, c.hv);
      beta_s[tid] = step_beta(p, bt0 + tid, c.hv);
    }
  }
  const int start = p.ring.start[slot];
  const int m = p.ring.len[slot];
  const int n = load_draft_tree<TMAX>(vp.drafts, c.b, anc_s, &n_s);  // ends with a barrier

  if (n == 0 || n > L || n > R - L) {
    cp_async_wait_all();
    zero_token_rows<TI, ROWS>(p, c, T, 0, kErrBadDrafts);
    return;
  }
  if (m < 0 || m > L || start < 0 || start >= R) {
    cp_async_wait_all();
    zero_token_rows<TI, ROWS>(p, c, T, 0, kErrCorruptCursor);
    return;
  }
  const bool flush = m + n > L;
  const int me = flush ? 0 : m;  // committed records replayed in the outputs (not folded)
  cp_async_wait_all();

  // Normalise q and k of every draft (one warp per draft; uniform trip count per warp).
  for (int d = warp; d < n; d += kThreads / 32) {
    float aq = 0.f, ak = 0.f;
    for (int e = lane; e < K; e += 32) {
      aq = fmaf(qh_s[d * K + e], qh_s[d * K + e], aq);
      ak = fmaf(kh_s[d * K + e], kh_s[d * K + e], ak);
    }
    aq = group_sum<32>(aq);
    ak = group_sum<32>(ak);
    if (lane == 0) {
      qn_s[d] = (p.use_l2norm ? 1.f / sqrtf(aq + 1e-6f) : 1.f) * p.scale;
      kn_s[d] = p.use_l2norm ? 1.f / sqrtf(ak + 1e-6f) : 1.f;
    }
  }
  __syncthreads();
  for (int i = tid; i < n * K; i += kThreads) {
    qh_s[i] *= qn_s[i / K];
    kh_s[i] *= kn_s[i / K];
  }

  // Every thread has read the cursors: count this CTA in (the last one moves them at the end).
  int arrived = 0;
  if (tid == 0) arrived = arrive(p.ring, slot);

  // 2. Decays. Committed: kd_j replaces k_j in shared memory, tot = E(Gc). Drafts: P_i.
  auto phys = [&](int j) {
    const int q = start + j;
    return q >= R ? q - R : q;
  };
  if constexpr (!PerChannelDecay) {
    if (warp == 0) {  // one lane per committed record, suffix sums by shuffles
      const float gj = lane < m ? gr_s[phys(lane)] : 0.f;
      float incl, excl;
      warp_suffix_sums(gj, lane, &incl, &excl);
      if (lane < m) wcom_s[lane] = expf(excl);
      if (lane == 0) tot_s[0] = expf(incl);
    } else if (warp == 1 && lane < n) {
      float sum = 0.f;
      for (int d = 0; d <= lane; ++d)
        if ((anc_s[lane] >> d) & 1u) sum += gd_s[d];
      pth_s[lane] = sum;
    }
    __syncthreads();
    for (int i = tid; i < m * K; i += kThreads) kr_s[phys(i / K) * K + i % K] *= wcom_s[i / K];
    for (int i = tid; i < n * K; i += kThreads) {
      const float e = expf(pth_s[i / K]);
      kx_s[i] = e * kh_s[i];
      qx_s[i] = e * qh_s[i];
    }
  } else {
    __syncthreads();  // normalised q, k visible
    for (int e = tid; e < K; e += kThreads) {  // one thread per key channel
      float sum = 0.f;  // sum_{j<k<m} g_k[e]
      for (int j = m - 1; j >= 0; --j) {
        kr_s[phys(j) * K + e] *= expf(sum);
        sum += gr_s[phys(j) * K + e];
      }
      tot_s[e] = expf(sum);
      for (int i = 0; i < n; ++i) {
        float pi = 0.f;
        for (int d = 0; d <= i; ++d)
          if ((anc_s[i] >> d) & 1u) pi += gd_s[d * K + e];
        pth_s[i * K + e] = pi;
        const float x = expf(pi);
        kx_s[i * K + e] = x * kh_s[i * K + e];
        qx_s[i * K + e] = x * qh_s[i * K + e];
      }
    }
  }
  __syncthreads();

  // Pair coefficients, one 8-lane group per (draft i, record j) pair (warp-uniform trip count):
  //   committed j < me: ck = kd_j . kx_i, cq = kd_j . qx_i;
  //   draft d = j - me in anc(i): ck = (E(P_i - P_d) . k_d) . k_i (d != i), cq = (E(P_i - P_d) . k_d) . q_i.
  {
    const int cols = me + n, pairs = n * cols, gl = lane % 8;
    for (int base = warp * 4; base < pairs; base += kThreads / 8) {
      const int pair = base + lane / 8;
      const int i = pair / cols, j = pair % cols, d = j - me;
      const bool seen = pair < pairs && (d < 0 || ((anc_s[i] >> d) & 1u));
      float ak = 0.f, aq = 0.f;
      if (seen && d < 0) {
        const float* kj = kr_s + phys(j) * K;
#pragma unroll 2
        for (int e0 = gl * 4; e0 < K; e0 += 32) {  // 4 consecutive channels per lane and pass
          float a[4], x[4], y[4];
          load_floats<float, 4>(kj + e0, a);
          load_floats<float, 4>(kx_s + i * K + e0, x);
          load_floats<float, 4>(qx_s + i * K + e0, y);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            ak = fmaf(a[e], x[e], ak);
            aq = fmaf(a[e], y[e], aq);
          }
        }
      } else if (seen) {
        const float* kdd = kh_s + d * K;
#pragma unroll 2
        for (int e0 = gl * 4; e0 < K; e0 += 32) {
          float a[4], x[4], y[4];
          load_floats<float, 4>(kdd + e0, a);
          load_floats<float, 4>(kh_s + i * K + e0, x);
          load_floats<float, 4>(qh_s + i * K + e0, y);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float w =
                PerChannelDecay ? expf(pth_s[i * kG + (e0 + e) % kG] - pth_s[d * kG + (e0 + e) % kG]) * a[e] : a[e];
            ak = fmaf(w, x[e], ak);
            aq = fmaf(w, y[e], aq);
          }
        }
        if constexpr (!PerChannelDecay) {
          const float w = expf(pth_s[i] - pth_s[d]);
          ak *= w;
          aq *= w;
        }
      }
      ak = group_sum<8>(ak);
      aq = group_sum<8>(aq);
      if (gl == 0 && pair < pairs) {
        ck_s[i * kW + j] = d == i ? 0.f : ak;
        cq_s[i * kW + j] = aq;
      }
    }
  }

  // 3. Checkpoint part: scale the tile by E(Gc) per column, fold and write on a flush, then the
  //    2n dot products of every row.
  float sv[Tile::kPasses][Tile::kVpl][kV];
#pragma unroll
  for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v) {
      unpack16<TS>(raw[s][v], sv[s][v]);
#pragma unroll
      for (int e = 0; e < kV; ++e) sv[s][v][e] *= tot_s[(Tile::col(lane, v) + e) % kG];
    }
  if (flush) {
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
      for (int j = 0; j < m; ++j) {
        const float uj = u_s[phys(j) * ROWS + r];
        const float* kj = kr_s + phys(j) * K;
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(uj, kj[Tile::col(lane, v) + e], sv[s][v][e]);
      }
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        const uint4 packed = pack16<TS>(sv[s][v]);
        store_stream16(st + r * K + Tile::col(lane, v), packed);
        unpack16<TS>(packed, sv[s][v]);  // continue from what was stored
      }
    }
  }
  for (int i = 0; i < n; ++i) {
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      float dk = 0.f, dq = 0.f;
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          const int col = Tile::col(lane, v) + e;
          dk = fmaf(sv[s][v][e], kx_s[i * K + col], dk);
          dq = fmaf(sv[s][v][e], qx_s[i * K + col], dq);
        }
      dk = group_sum<Tile::kLanes>(dk);
      dq = group_sum<Tile::kLanes>(dq);
      if (Tile::row_leader(lane)) {
        sk_s[i * ROWS + Tile::row(warp, lane, s)] = dk;
        sq_s[i * ROWS + Tile::row(warp, lane, s)] = dq;
      }
    }
  }
  __syncthreads();

  // 4. Committed ring parts (thread per (draft, row)), added into sk/sq.
  for (int idx = tid; idx < n * ROWS; idx += kThreads) {
    const int i = idx / ROWS, r = idx % ROWS;
    float ak = 0.f, aq = 0.f;
    for (int j = 0; j < me; ++j) {
      const float uj = u_s[phys(j) * ROWS + r];
      ak = fmaf(uj, ck_s[i * kW + j], ak);
      aq = fmaf(uj, cq_s[i * kW + j], aq);
    }
    sk_s[idx] += ak;
    sq_s[idx] += aq;
  }
  __syncthreads();

  // 5. The drafts' triangular recursion (thread per row, gdn/wy.cuh), outputs and appended u.
  if (tid < ROWS) {
    const int r = tid;
    forward_substitute(
        n, ck_s + me, kW, [&](int i) { return sk_s[i * ROWS + r]; }, [&](int i) { return vd_s[i * ROWS + r]; },
        [&](int i) { return beta_s[i]; }, [&](int d) { return ud_s[d * ROWS + r]; },
        [&](int i, float u) {
          ud_s[i * ROWS + r] = u;
          float sqr = sq_s[i * ROWS + r];
          for (int d = 0; d < i; ++d) sqr = fmaf(ud_s[d * ROWS + r], cq_s[i * kW + me + d], sqr);
          const float o = fmaf(u, cq_s[i * kW + me + i], sqr);
          token_out_rows<TI>(p, c, T, i)[r] = from_float<TI>(o);
          p.ring.u[slot * p.ring.u_stride_slot + c.hv * p.ring.u_stride_head + static_cast<int64_t>(phys(m + i)) * V +
                   c.v0 + r] = u;
        });
  }
  if (n < T) zero_token_rows<TI, ROWS>(p, c, T, n, 0);
  if (c.chunk == 0) {
    float* gout = p.ring.g + slot * p.ring.g_stride_slot + c.hv * p.ring.g_stride_head;
    for (int idx = tid; idx < n * kG; idx += kThreads)
      gout[static_cast<int64_t>(phys(m + idx / kG)) * kG + idx % kG] = gd_s[idx];
    if (c.hv % (p.num_v_heads / p.num_k_heads) == 0) {
      float* kout = p.ring.k + slot * p.ring.k_stride_slot + c.hk * p.ring.k_stride_head;
      for (int idx = tid; idx < n * K; idx += kThreads)
        kout[static_cast<int64_t>(phys(m + idx / K)) * K + idx % K] = kh_s[idx];
    }
  }
  if (tid == 0) {
    const Cursors seen{start, m, 0};
    finish_unit(p.ring, slot, p.num_v_heads * kChunks, arrived, cursors_after_verify(seen, flush, phys(m), n),
                p.error_flag);
  }
}

}  // namespace gdn
}  // namespace replayssm
