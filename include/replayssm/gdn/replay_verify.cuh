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
//
// With a read copy (RC, common/read_copy.cuh) a verify that does not flush reads the copy
// (ReadCopyTile: its 2n dot products per row), so the drafts' corrections u_i are those of the
// recurrence restarted from S_lp, as a non-flush decode step's are; each draft record also keeps
// its v and beta. A verify that flushes reads the checkpoint S_hp and the committed records' v
// rows and betas, recomputes their corrections exactly from S_hp (gdn/wy.cuh, as the decode's
// flush does), folds, stores S_hp and re-encodes the copy (store_state_row), and evaluates the
// drafts against what the checkpoint now holds. A single copy (RC::kSingle) is the state: its
// ring's u are exact for it, and a flush folds them into its dequantised values.
#pragma once

#include "../common/align.cuh"
#include "../common/cp_async.cuh"
#include "../common/cursors.cuh"
#include "../common/drafts.cuh"
#include "../common/read_copy.cuh"
#include "../common/state_tile.cuh"
#include "cta.cuh"
#include "wy.cuh"

namespace replayssm {
namespace gdn {

// Dynamic shared memory of one verify CTA for ring capacity R and T planned drafts (bytes). With
// two copies (RC::kTwoCopy) also, for a flush's exact recompute of the m <= L committed records
// (logical order): their v rows [L][ROWS] (io dtype), betas [L], kx_j = E_j . k_j [L][K], the
// triangular system A [L][L] and the fold's per-column factor [K].
template <typename TI, int K, int ROWS, int L, bool PerChannelDecay, class RC = NoReadCopy>
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
  __host__ __device__ static size_t vr(int R, int T) { return ud(R, T) + align16(size_t(T) * ROWS * 4); }
  static constexpr bool kExact = RC::kTwoCopy;  // a flush recomputes the committed corrections
  __host__ __device__ static size_t br(int R, int T) {
    return vr(R, T) + (kExact ? align16(size_t(L) * ROWS * sizeof(TI)) : 0);
  }  // [L] committed betas
  __host__ __device__ static size_t kxc(int R, int T) {
    return br(R, T) + (kExact ? align16(size_t(L) * 4) : 0);
  }  // [L][K] committed kx_j
  __host__ __device__ static size_t a(int R, int T) {
    return kxc(R, T) + (kExact ? size_t(L) * K * 4 : 0);
  }  // [L][L] triangular system
  __host__ __device__ static size_t col(int R, int T) {
    return a(R, T) + (kExact ? align16(size_t(L) * L * 4) : 0);
  }  // [K] fold factor
  __host__ __device__ static size_t bytes(int R, int T) { return col(R, T) + (kExact ? size_t(K) * 4 : 0); }
};

// CTAs per SM the verify kernel is compiled for. At 64 rows and K <= 128 both families sit at the
// 128-register cliff: GDN at 130 registers (the read-copy work's v and beta appends) ran three
// CTAs per SM instead of four, and a T = 4 round at B = 256 took 630 µs against 514 before; asking
// for four keeps it under 128 (24 bytes spilled at K = 128). KDA (per-channel decays) used 133
// registers and fits 128 with nothing spilled. Where shared memory allows only three CTAs (KDA at
// T >= 8) the bound costs nothing. 0 sets no minimum, as without the argument: K = 256 needs more
// registers, and fewer rows need fewer. With a read copy the copy's tile and the flush's
// checkpoint tile are both in flight: no minimum.
template <bool PerChannelDecay, int K, int ROWS, class RC = NoReadCopy>
constexpr int kVerifyMinCtas = K <= 128 && ROWS == 64 && !RC::kEnabled ? 4 : 0;

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PerChannelDecay, int TMAX,
          class RC = NoReadCopy>
__global__ void __launch_bounds__(128, kVerifyMinCtas<PerChannelDecay, K, ROWS, RC>)
    replay_verify_kernel(const VerifyParams vp) {
  const DecodeParams& p = vp.d;
  using Read = ReadCopyTile<RC, TS, K, ROWS, 4>;  // what a non-flush verify with a copy reads
  using ReadTile = typename Read::Tile;
  using Tile = std::conditional_t<RC::kSingle, ReadTile, StateTile<TS, K, ROWS, 4>>;  // what a flush folds
  using Smem = VerifySmem<TI, K, ROWS, L, PerChannelDecay, RC>;
  static_assert(ReadTile::kPasses == Tile::kPasses, "both tiles give a thread the same rows");
  static_assert(!RC::kTwoCopy || K % 32 == 0, "the flush's channel pass takes key channels 32 at a time");
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
  // After the persistent verify of a read copy (DraftArgs::serve): the rows it left, the flushes.
  if (vp.drafts.serve == kServeRest && served_as_nonflush<TMAX>(vp.drafts, p.ring, c.b, slot, L)) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int R = p.ring.capacity;
  TS* st = static_cast<TS*>(p.pool.state) + slot * p.pool.stride_slot + c.hv * p.pool.stride_head +
           static_cast<int64_t>(c.v0) * K;

  // 1. One round trip: checkpoint tile or the copy's (registers), whole ring (async copies),
  //    drafts, cursors.
  [[maybe_unused]] uint4 raw[RC::kEnabled ? 1 : Tile::kPasses][Tile::kVpl];
  [[maybe_unused]] Read rt;
  if constexpr (RC::kEnabled) {
    rt.load(p.pool, slot, c.hv, c.v0, warp, lane);
  } else {
    Tile::load(raw, st, warp, lane);
  }

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
  [[maybe_unused]] const uint32_t seed = flush_seed<RC>(p.pool, slot);  // read with the cursors
  const int n = load_draft_tree<TMAX>(vp.drafts, c.b, anc_s, &n_s);  // ends with a barrier

  if (!verify_row_ok<TI, ROWS>(p, c, T, n, m, start, L, R)) return;
  const bool flush = m + n > L;
  const int me = flush ? 0 : m;  // committed records replayed in the outputs (not folded)
  auto phys = [&](int j) {
    const int q = start + j;
    return q >= R ? q - R : q;
  };
  // Two copies, flush: the checkpoint tile S_hp (registers) and the committed records' v rows and
  // betas (logical order), requested as soon as the cursors say so.
  const bool exact = RC::kTwoCopy && flush;  // the committed corrections are recomputed from S_hp
  [[maybe_unused]] uint4 hp_raw[RC::kTwoCopy ? Tile::kPasses : 1][Tile::kVpl];
  [[maybe_unused]] TI* vr_s = reinterpret_cast<TI*>(smem + Smem::vr(R, T));  // [L][ROWS]
  [[maybe_unused]] float* br_s = reinterpret_cast<float*>(smem + Smem::br(R, T));  // [L]
  [[maybe_unused]] float* kxc_s = reinterpret_cast<float*>(smem + Smem::kxc(R, T));  // [L][K]
  [[maybe_unused]] float* A_s = reinterpret_cast<float*>(smem + Smem::a(R, T));  // [L][L]
  [[maybe_unused]] float* col_s = reinterpret_cast<float*>(smem + Smem::col(R, T));  // [K]
  if constexpr (RC::kTwoCopy) {
    if (flush) {
      Tile::load(hp_raw, st, warp, lane);
      constexpr int kIV = Vec16<TI>::kElems;
      static_assert(ROWS % kIV == 0, "a v-row chunk must be whole 16-byte vectors");
      const TI* vring =
          static_cast<const TI*>(p.ring.v) + slot * p.ring.v_stride_slot + c.hv * p.ring.v_stride_head + c.v0;
      const float* bring = p.ring.beta + slot * p.ring.beta_stride_slot + c.hv * p.ring.beta_stride_head;
      for (int i = tid; i < m * (ROWS / kIV); i += kThreads) {
        const int j = i / (ROWS / kIV), q = i % (ROWS / kIV);
        cp_async16(vr_s + j * ROWS + q * kIV, vring + static_cast<int64_t>(phys(j)) * V + q * kIV);
      }
      for (int j = tid; j < m; j += kThreads) cp_async4(br_s + j, bring + phys(j));
    }
  }
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
  //    Two copies, flush: the committed records' terms in product form instead (gdn/wy.cuh): A,
  //    kx_j, kd_j in place and col (their g become a = exp(g) in place).
  if constexpr (RC::kTwoCopy) {
    if (exact) {
      __syncthreads();  // every thread's v rows and betas have landed
      for (int i = tid; i < m * kG; i += kThreads) {
        float* gj = gr_s + phys(i / kG) * kG + i % kG;
        *gj = expf(*gj);
      }
      __syncthreads();
      auto key = [&](int j) {
        return kr_s + phys(j) * K;
      };
      auto decay = [&](int j, int e) {
        return gr_s[phys(j) * kG + (PerChannelDecay ? e : 0)];
      };
      window_pairs<L, kThreads / 32, K>(m, key, decay, A_s, warp, lane);
      __syncthreads();  // the pairs read the undecayed keys, which the channel pass decays in place
      window_channel_decays<L, kThreads, K>(m, key, decay, [&](int j) { return kxc_s + j * K; }, col_s, tid);
    }
  }
  const int mc = exact ? 0 : m;  // committed records whose decays are applied here
  if constexpr (!PerChannelDecay) {
    if (warp == 0) {  // one lane per committed record, suffix sums by shuffles
      const float gj = lane < mc ? gr_s[phys(lane)] : 0.f;
      float incl, excl;
      warp_suffix_sums(gj, lane, &incl, &excl);
      if (lane < mc) wcom_s[lane] = expf(excl);
      if (lane == 0) tot_s[0] = expf(incl);
    } else if (warp == 1 && lane < n) {
      float sum = 0.f;
      for (int d = 0; d <= lane; ++d)
        if ((anc_s[lane] >> d) & 1u) sum += gd_s[d];
      pth_s[lane] = sum;
    }
    __syncthreads();
    for (int i = tid; i < mc * K; i += kThreads) kr_s[phys(i / K) * K + i % K] *= wcom_s[i / K];
    for (int i = tid; i < n * K; i += kThreads) {
      const float e = expf(pth_s[i / K]);
      kx_s[i] = e * kh_s[i];
      qx_s[i] = e * qh_s[i];
    }
  } else {
    __syncthreads();  // normalised q, k visible
    for (int e = tid; e < K; e += kThreads) {  // one thread per key channel
      float sum = 0.f;  // sum_{j<k<m} g_k[e]
      for (int j = mc - 1; j >= 0; --j) {
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
  //    2n dot products of every row. With a read copy, a non-flush verify forms them from the
  //    copy's codes (the decays in the weights); a flush folds the checkpoint (or a single copy's
  //    dequantised values) and reads the products out of what it stored.
  if (!RC::kEnabled || flush) {
    float sv[Tile::kPasses][Tile::kVpl][kV];
    if constexpr (!RC::kEnabled) {
      Tile::unpack(raw, sv);
    } else if constexpr (RC::kSingle) {
      rt.values(1.f, sv);
    } else {
      Tile::unpack(hp_raw, sv);
      // The committed records' exact corrections: y_j = S_hp kx_j per row (into the u rows of
      // the ring in shared memory, which the substitution then overwrites with u_j), then one
      // thread per row.
      for (int j = 0; j < m; ++j) {
        float kxj[Tile::kVpl * kV];
        Tile::load_columns(kxj, kxc_s + j * K, lane);
#pragma unroll
        for (int s = 0; s < Tile::kPasses; ++s) {
          float y = 0.f;
#pragma unroll
          for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
            for (int e = 0; e < kV; ++e) y = fmaf(sv[s][v][e], kxj[v * kV + e], y);
          y = group_sum<Tile::kLanes>(y);
          if (Tile::row_leader(lane)) u_s[phys(j) * ROWS + Tile::row(warp, lane, s)] = y;
        }
      }
      __syncthreads();
      if (tid < ROWS) {
        const int r = tid;
        forward_substitute(
            m, A_s, L, [&](int j) { return u_s[phys(j) * ROWS + r]; },
            [&](int j) { return to_float(vr_s[j * ROWS + r]); }, [&](int j) { return br_s[j]; },
            [&](int i) { return u_s[phys(i) * ROWS + r]; }, [&](int j, float u) { u_s[phys(j) * ROWS + r] = u; });
      }
      __syncthreads();
    }
    const float* colf = exact ? col_s : tot_s;  // the fold's per-column factor (GDN without a copy: one)
    const int cmask = exact ? K : kG;
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
        for (int e = 0; e < kV; ++e) sv[s][v][e] *= colf[(Tile::col(lane, v) + e) % cmask];
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
        if constexpr (RC::kEnabled) {  // checkpoint and copy as the format says; continue from what is held
          float held[Tile::kVpl][kV];
          store_state_row<RC, TS, Tile>(state_row_dst<RC, TS>(p.pool, slot, c.hv, c.v0 + r, V, K, seed), sv[s], lane,
                                        held);
#pragma unroll
          for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
            for (int e = 0; e < kV; ++e) sv[s][v][e] = held[v][e];
        } else {
#pragma unroll
          for (int v = 0; v < Tile::kVpl; ++v) {
            const uint4 packed = pack16<TS>(sv[s][v]);
            store_stream16(st + r * K + Tile::col(lane, v), packed);
            unpack16<TS>(packed, sv[s][v]);  // continue from what was stored
          }
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
  } else if constexpr (RC::kEnabled) {
    // Non-flush with a copy: each draft's two dot products with the copy's rows, weights
    // E(Gc) . kx_i and E(Gc) . qx_i.
    for (int i = 0; i < n; ++i) {
      const float* kxi = kx_s + i * K;
      const float* qxi = qx_s + i * K;
      float d[2][Tile::kPasses];
      rt.template sums<2>(
          [&](int w, int v, int e) {
            const int col = ReadTile::col(lane, v) + e;
            return (w == 0 ? kxi : qxi)[col] * tot_s[col % kG];
          },
          d);
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s) {
        if (ReadTile::row_leader(lane)) {
          sk_s[i * ROWS + ReadTile::row(warp, lane, s)] = rt.dequantise(d[0][s], s);
          sq_s[i * ROWS + ReadTile::row(warp, lane, s)] = rt.dequantise(d[1][s], s);
        }
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
          if constexpr (RC::kTwoCopy)  // the value as given (an exact copy of the io-dtype input)
            static_cast<TI*>(p.ring.v)[slot * p.ring.v_stride_slot + c.hv * p.ring.v_stride_head +
                                       static_cast<int64_t>(phys(m + i)) * V + c.v0 + r] =
                from_float<TI>(vd_s[i * ROWS + r]);
        });
  }
  if (n < T) zero_token_rows<TI, ROWS>(p, c, T, n, 0);
  if (c.chunk == 0) {
    float* gout = p.ring.g + slot * p.ring.g_stride_slot + c.hv * p.ring.g_stride_head;
    for (int idx = tid; idx < n * kG; idx += kThreads)
      gout[static_cast<int64_t>(phys(m + idx / kG)) * kG + idx % kG] = gd_s[idx];
    if constexpr (RC::kTwoCopy)
      for (int i = tid; i < n; i += kThreads)
        p.ring.beta[slot * p.ring.beta_stride_slot + c.hv * p.ring.beta_stride_head + phys(m + i)] = beta_s[i];
    if (c.hv % (p.num_v_heads / p.num_k_heads) == 0) {
      float* kout = p.ring.k + slot * p.ring.k_stride_slot + c.hk * p.ring.k_stride_head;
      for (int idx = tid; idx < n * K; idx += kThreads)
        kout[static_cast<int64_t>(phys(m + idx / K)) * K + idx % K] = kh_s[idx];
    }
  }
  if (tid == 0) {
    const Cursors seen{start, m, 0};
    const bool moved = finish_unit(p.ring, slot, p.num_v_heads * kChunks, arrived,
                                   cursors_after_verify(seen, flush, phys(m), n), p.error_flag);
    bump_flushes<RC>(p.pool, slot, moved, flush);
  }
}

}  // namespace gdn
}  // namespace replayssm
