// Streaming-verify probe: the Mamba-2 verify of a chain of T drafts with an fp8 read copy, in the
// streaming design of perf/stream_step_probe.cu (codes straight from global memory into tensor-core
// operands, no producer warp, one barrier per item), to see what T drafts cost beside one token.
//
// The design's MMA has 8 columns and the step uses one: draft i's C goes to column i, so the T dot
// products of a row cost the MMAs of one. Per head h of row b (slot s), m records since the
// checkpoint, drafts i = 0 .. T - 1 (records m + i of the chain), jj over records and drafts:
//   d_jj = the ring's dt (jj < m) or softplus(dt_i + dt_bias) (jj = m + i);  S_jj = d_0 + .. + d_jj
//   y_i[p] = (exp(A S_{m+i}) sc[p] (Q[p,:] . C_i)
//             + sum_{jj <= m+i} exp(A (S_{m+i} - S_jj)) d_jj (B_jj . C_i) x_jj[p] + D x_i[p]) silu(z_i[p])
// and the drafts' x, B and dt are appended at records m .. m + T - 1 (pending until a commit; the
// probe commits nothing). One CTA per item (row, group), 8 warps, 2 heads per warp, two 16-row
// blocks of codes in flight per warp; lane (g4, t) finishes rows 16 t + g4 and + 8 of each head
// for every draft, its dots gathered from lanes (g4, i / 2) of its quad.
//
// Checked against a float64 host reference on sample rows (outputs poisoned with NaN first) for
// T = 1, 2, 4, 8; timed with CUDA events (median of 30) for every m = 0 .. 14, and as 15 rounds in
// one graph. T = 1 is the standard step in this layout: the ratios are against it.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/stream_verify_probe perf/stream_verify_probe.cu && /tmp/stream_verify_probe [batch]
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "stream_probe_common.cuh"

constexpr int H = 128, P = 64, N = 128, G = 8, L = 16, kMaxT = 8, R = L + kMaxT;  // ring capacity
constexpr int kHeadsPerGroup = H / G, kWarps = 8, kThreads = 32 * kWarps;
constexpr int kHeadsPerWarp = kHeadsPerGroup / kWarps, kBlocksPerHead = P / 16;
constexpr int kBlocks = kHeadsPerWarp * kBlocksPerHead, kDepth = 2;

using Params = Mamba2ProbeParams;

template <int T>
__global__ void __launch_bounds__(kThreads, 2) stream_verify(Params p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g4 = lane / 4, t = lane % 4;
  const int r0 = 16 * t + g4;  // this lane's rows of each head: r0, r0 + 8
  __shared__ __align__(16) uint32_t cbs[2][kMaxT + 1][4][16];  // [parity][draft's column (kMaxT: zeros)][t][f16 pair]
  __shared__ float cinv[2][T];
  __shared__ float bc[2][T][R];  // B_jj . C_i (jj < m: the ring's records, then the drafts)
  if (threadIdx.x < 128) cbs[threadIdx.x / 64][kMaxT][(threadIdx.x / 16) % 4][threadIdx.x % 16] = 0u;
  const int items = p.batch * G;
  int item = blockIdx.x;
  if (item >= items) return;

  auto warp_codes = [&](int it, int slot) {
    return p.Q + (static_cast<size_t>(slot) * H + (it % G) * kHeadsPerGroup + warp * kHeadsPerWarp) * P * N;
  };
  uint4 buf[kDepth][4];
  auto issue = [&](const uint8_t* codes, int k, uint4(&bb)[4]) {
    load_block<N>(codes + static_cast<size_t>(k) * 16 * N, g4, t, bb);
  };
  int slot = p.slot_of_row[item / G];
  const uint8_t* Qw = warp_codes(item, slot);
#pragma unroll
  for (int k = 0; k < kDepth; ++k) issue(Qw, k, buf[k]);
  int next = item + gridDim.x;
  int slot_next = next < items ? p.slot_of_row[next / G] : 0;

  for (int parity = 0;; parity ^= 1) {
    const int b = item / G, g = item % G;
    const int h0 = g * kHeadsPerGroup + warp * kHeadsPerWarp;
    const uint8_t* Qn = next < items ? warp_codes(next, slot_next) : nullptr;
    const int st = p.start[slot], m = p.len[slot], nrec = m + T;

    // Draft i's C as column i of the MMAs' B operand (warp i, lanes 0-3), and B_jj . C_i.
    auto C_of = [&](int i) {
      return p.C + ((static_cast<size_t>(b) * T + i) * G + g) * N;
    };
    auto B_of = [&](int jj) {
      return jj < m ? p.B_ring + ((static_cast<size_t>(slot) * G + g) * R + (st + jj) % R) * N
                    : p.Bv + ((static_cast<size_t>(b) * T + (jj - m)) * G + g) * N;
    };
    if (warp < T && lane < 4) cinv[parity][warp] = vector_pairs(C_of(warp), lane, 0xfu, cbs[parity][warp][lane]);
    for (int idx = warp; idx < T * nrec; idx += kWarps) {
      const int i = idx / nrec, jj = idx % nrec;
      const uint2 bw = __ldg(reinterpret_cast<const uint2*>(B_of(jj) + 4 * lane));
      const uint2 cw = __ldg(reinterpret_cast<const uint2*>(C_of(i) + 4 * lane));
      const bf16* bb = reinterpret_cast<const bf16*>(&bw);
      const bf16* cc = reinterpret_cast<const bf16*>(&cw);
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < 4; ++e) s = fmaf(__bfloat162float(bb[e]), __bfloat162float(cc[e]), s);
#pragma unroll
      for (int off = 16; off >= 1; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0) bc[parity][i][jj] = s;
    }
    for (int k = warp; k < T; k += kWarps)  // the drafts' B, pending at records m + k
      *reinterpret_cast<uint2*>(p.B_ring + ((static_cast<size_t>(slot) * G + g) * R + (st + m + k) % R) * N +
                                4 * lane) = __ldg(reinterpret_cast<const uint2*>(B_of(m + k) + 4 * lane));
    __syncthreads();  // this item's B operand and products (parity ^ 1: the next item's)

#pragma unroll
    for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
      const int h = h0 + hh;
      const float* srow = p.qscale + (static_cast<size_t>(slot) * H + h) * P;
      const float sc0 = __ldg(srow + r0), sc1 = __ldg(srow + r0 + 8);
      // d_jj at lane jj (the ring's by physical record, then the drafts'), S_jj by a scan.
      const float a = __ldg(p.A + h), Dh = __ldg(p.D + h);
      float* dtr = p.dt_ring + (static_cast<size_t>(slot) * H + h) * R;
      const float dring = lane < R ? dtr[lane] : 0.f;
      const float dphys = __shfl_sync(0xffffffffu, dring, (st + lane) % R);
      float dj = 0.f;
      if (lane < m) dj = dphys;
      else if (lane < nrec)
        dj = softplus(__ldg(p.dt + (static_cast<size_t>(b) * T + (lane - m)) * H + h) + __ldg(p.dt_bias + h));
      float incl = dj;
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const float o = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += o;
      }
      float w[T], ck[T];
#pragma unroll
      for (int i = 0; i < T; ++i) {
        const float Si = __shfl_sync(0xffffffffu, incl, m + i);
        w[i] = lane <= m + i ? expf(a * (Si - incl)) * dj * bc[parity][i][min(lane, R - 1)] + (lane == m + i ? Dh : 0.f)
                             : 0.f;
        ck[i] = expf(a * Si);
      }

      // The records' and drafts' part at rows r0, r0 + 8, for every draft.
      float acc[T][2];
#pragma unroll
      for (int i = 0; i < T; ++i) acc[i][0] = acc[i][1] = 0.f;
      const bf16* xr = p.x_ring + (static_cast<size_t>(slot) * H + h) * R * P;
      for (int jj = 0; jj < nrec; ++jj) {
        const bf16* xrow =
            jj < m ? xr + ((st + jj) % R) * P : p.x + ((static_cast<size_t>(b) * T + (jj - m)) * H + h) * P;
        const float x0 = __bfloat162float(xrow[r0]), x1 = __bfloat162float(xrow[r0 + 8]);
#pragma unroll
        for (int i = 0; i < T; ++i) {
          const float wv = __shfl_sync(0xffffffffu, w[i], jj);
          acc[i][0] = fmaf(wv, x0, acc[i][0]);
          acc[i][1] = fmaf(wv, x1, acc[i][1]);
        }
      }

      // The head's four blocks: every draft's dots at once; lane (g4, t = kb) gathers block kb's
      // from lanes (g4, i / 2) of its quad (draft i in column i: d0/d1 row g4, d2/d3 row g4 + 8).
      const int col = g4 < T ? g4 : kMaxT;
      float dot[T][2];
#pragma unroll
      for (int i = 0; i < T; ++i) dot[i][0] = dot[i][1] = 0.f;
#pragma unroll
      for (int kb = 0; kb < kBlocksPerHead; ++kb) {
        const int k = hh * kBlocksPerHead + kb;
        const uint4(&bb)[4] = buf[k % kDepth];
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        block_dots_f16(bb, cbs[parity][col][t], d);
        if (k + kDepth < kBlocks) issue(Qw, k + kDepth, buf[k % kDepth]);
        else if (Qn != nullptr) issue(Qn, k + kDepth - kBlocks, buf[k % kDepth]);
#pragma unroll
        for (int s = 0; 2 * s < T; ++s) {
          const int src = 4 * g4 + s;
          const float v0 = __shfl_sync(0xffffffffu, d[0], src), v1 = __shfl_sync(0xffffffffu, d[1], src);
          const float v2 = __shfl_sync(0xffffffffu, d[2], src), v3 = __shfl_sync(0xffffffffu, d[3], src);
          if (t == kb) {
            dot[2 * s][0] = v0;
            dot[2 * s][1] = v2;
            if (2 * s + 1 < T) {
              dot[2 * s + 1][0] = v1;
              dot[2 * s + 1][1] = v3;
            }
          }
        }
      }

      // Every draft's outputs at rows r0, r0 + 8; the drafts' x and dt appended.
#pragma unroll
      for (int i = 0; i < T; ++i) {
        const size_t orow = ((static_cast<size_t>(b) * T + i) * H + h) * P;
        const float f = ck[i] * cinv[parity][i];
        float y0 = fmaf(f * sc0, dot[i][0], acc[i][0]);
        float y1 = fmaf(f * sc1, dot[i][1], acc[i][1]);
        const float z0 = __bfloat162float(p.z[orow + r0]), z1 = __bfloat162float(p.z[orow + r0 + 8]);
        y0 *= z0 / (1.f + expf(-z0));
        y1 *= z1 / (1.f + expf(-z1));
        p.y[orow + r0] = __float2bfloat16(y0);
        p.y[orow + r0 + 8] = __float2bfloat16(y1);
        bf16* xdst = p.x_ring + ((static_cast<size_t>(slot) * H + h) * R + (st + m + i) % R) * P;
        xdst[r0] = p.x[orow + r0];
        xdst[r0 + 8] = p.x[orow + r0 + 8];
      }
      if (lane >= m && lane < nrec) dtr[(st + lane) % R] = dj;
    }

    if (next >= items) break;
    item = next;
    slot = slot_next;
    Qw = Qn;
    next += gridDim.x;
    slot_next = next < items ? p.slot_of_row[next / G] : 0;
  }
}

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 256;
  const int slots = 2 * batch;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, batch %d, slots %d (Mamba-2 H %d P %d N %d G %d)\n", prop.name, batch, slots, H, P, N, G);

  const size_t nIn = static_cast<size_t>(batch) * kMaxT * H * P;
  const Mamba2ProbeBuffers<H, P, N, G, R> buf(batch, slots, kMaxT, L, 40);
  fill_cursors(buf.slot_of_row, buf.start, buf.lens, batch, slots, R, L, 23);
  Params p = buf.params(batch);
  const std::vector<int> h_slot = fetch(buf.slot_of_row, 0, batch), h_start = fetch(buf.start, 0, slots);
  const std::vector<float> hA = fetch(buf.A, 0, H), hD = fetch(buf.D, 0, H), hbias = fetch(buf.dt_bias, 0, H);
  const int sample_rows[3] = {0, batch / 3, batch - 1};

  double base_median = 0, base_graph = 0;
  auto variant = [&](auto drafts) -> bool {
    constexpr int T = decltype(drafts)::value;
    auto kern = stream_verify<T>;
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, kern));
    int blocks = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kern, kThreads, 0));
    const dim3 grid(std::min(batch * G, blocks * prop.multiProcessorCount));
    std::printf("stream_verify<T = %d>: %d registers, %d bytes spilled, %d CTAs per SM\n", T, fa.numRegs,
                static_cast<int>(fa.localSizeBytes), blocks);

    // Correctness: rows sampled, m = 0, 7, 14; the rings are read back before each run.
    bool ok = true;
    for (int m : {0, 7, 14}) {
      p.len = buf.lens + static_cast<size_t>(m) * slots;
      fill_nan<<<1024, 256>>>(buf.y, nIn);
      std::vector<std::vector<bf16>> xr, Br;
      std::vector<std::vector<float>> dr;
      for (int b : sample_rows) {
        const int s = h_slot[b];
        xr.push_back(fetch(buf.x_ring, static_cast<size_t>(s) * H * R * P, static_cast<size_t>(H) * R * P));
        Br.push_back(fetch(buf.B_ring, static_cast<size_t>(s) * G * R * N, static_cast<size_t>(G) * R * N));
        dr.push_back(fetch(buf.dt_ring, static_cast<size_t>(s) * H * R, static_cast<size_t>(H) * R));
      }
      kern<<<grid, kThreads>>>(p);
      CHECK(cudaGetLastError());
      CHECK(cudaDeviceSynchronize());
      const std::vector<bf16> hy = fetch(buf.y, 0, static_cast<size_t>(batch) * T * H * P);
      size_t nan_count = 0;
      for (const bf16& v : hy) nan_count += std::isnan(__bfloat162float(v)) ? 1 : 0;
      double worst = 0.0;
      for (int si = 0; si < 3; ++si) {
        const int b = sample_rows[si], s = h_slot[b], st = h_start[s];
        const auto hq = fetch(buf.Q, static_cast<size_t>(s) * H * P * N, static_cast<size_t>(H) * P * N);
        const auto hs = fetch(buf.qscale, static_cast<size_t>(s) * H * P, static_cast<size_t>(H) * P);
        const auto hx = fetch(buf.x, static_cast<size_t>(b) * T * H * P, static_cast<size_t>(T) * H * P);
        const auto hz = fetch(buf.z, static_cast<size_t>(b) * T * H * P, static_cast<size_t>(T) * H * P);
        const auto hB = fetch(buf.Bv, static_cast<size_t>(b) * T * G * N, static_cast<size_t>(T) * G * N);
        const auto hC = fetch(buf.C, static_cast<size_t>(b) * T * G * N, static_cast<size_t>(T) * G * N);
        const auto hdt = fetch(buf.dt, static_cast<size_t>(b) * T * H, static_cast<size_t>(T) * H);
        for (int h = 0; h < H; ++h) {
          const int gg = h / kHeadsPerGroup, n_rec = m + T;
          std::vector<double> d(n_rec), S(n_rec);
          double run = 0;
          for (int jj = 0; jj < n_rec; ++jj) {
            const double raw = jj < m ? 0.0 : hdt[(jj - m) * H + h] + hbias[h];
            d[jj] = jj < m ? dr[si][h * R + (st + jj) % R] : (raw > 20 ? raw : std::log1p(std::exp(raw)));
            S[jj] = (run += d[jj]);
          }
          auto Bval = [&](int jj, int n) {
            return jj < m ? bf(Br[si][(static_cast<size_t>(gg) * R + (st + jj) % R) * N + n])
                          : bf(hB[(static_cast<size_t>(jj - m) * G + gg) * N + n]);
          };
          auto xval = [&](int jj, int pp) {
            return jj < m ? bf(xr[si][(static_cast<size_t>(h) * R + (st + jj) % R) * P + pp])
                          : bf(hx[(static_cast<size_t>(jj - m) * H + h) * P + pp]);
          };
          for (int i = 0; i < T; ++i) {
            const double Sm = S[m + i];
            std::vector<double> bcv(m + i + 1);
            for (int jj = 0; jj <= m + i; ++jj) {
              double acc = 0;
              for (int n = 0; n < N; ++n) acc += Bval(jj, n) * bf(hC[(static_cast<size_t>(i) * G + gg) * N + n]);
              bcv[jj] = acc;
            }
            std::vector<double> ref(P);
            double head_max = 0;
            for (int pp = 0; pp < P; ++pp) {
              double dot = 0;
              for (int n = 0; n < N; ++n)
                dot += e4m3_value(hq[(static_cast<size_t>(h) * P + pp) * N + n]) *
                       bf(hC[(static_cast<size_t>(i) * G + gg) * N + n]);
              double yv = std::exp(hA[h] * Sm) * hs[h * P + pp] * dot + hD[h] * xval(m + i, pp);
              for (int jj = 0; jj <= m + i; ++jj) yv += std::exp(hA[h] * (Sm - S[jj])) * d[jj] * bcv[jj] * xval(jj, pp);
              const double zz = bf(hz[(static_cast<size_t>(i) * H + h) * P + pp]);
              ref[pp] = yv * zz / (1 + std::exp(-zz));
              head_max = std::max(head_max, std::fabs(ref[pp]));
            }
            for (int pp = 0; pp < P; ++pp) {
              const double got = __bfloat162float(hy[((static_cast<size_t>(b) * T + i) * H + h) * P + pp]);
              // bf16 output: 2^-8 of the value plus 1e-4 of the head's largest (fp32 sums, f16 products).
              const double err = std::fabs(got - ref[pp]);
              if (!(err <= std::ldexp(std::fabs(ref[pp]), -8) + 1e-4 * head_max)) {
                if (ok)
                  std::printf("  mismatch T=%d m=%d row %d draft %d head %d p %d: got %g want %g\n", T, m, b, i, h, pp,
                              got, ref[pp]);
                ok = false;
              }
              worst = std::max(worst, err / std::max(head_max, 1e-30));
            }
          }
        }
      }
      std::printf("check T=%d m=%2d: unwritten/NaN outputs %zu, worst error / head max %.3g\n", T, m, nan_count, worst);
      ok = ok && nan_count == 0;
    }

    std::vector<double> per_m;
    for (int m = 0; m < L - 1; ++m) {
      p.len = buf.lens + static_cast<size_t>(m) * slots;
      per_m.push_back(median_us([&] { kern<<<grid, kThreads>>>(p); }));
    }
    const double window = graph_us_per_launch(L - 1, [&](int m, cudaStream_t cs) {
      Params pm = p;
      pm.len = buf.lens + static_cast<size_t>(m) * slots;
      kern<<<grid, kThreads, 0, cs>>>(pm);
    });
    std::vector<double> sorted = per_m;
    std::sort(sorted.begin(), sorted.end());
    const double med = sorted[sorted.size() / 2];
    if (T == 1) {
      base_median = med;
      base_graph = window;
    }
    std::printf(
        "RESULT verify T=%d batch=%d regs=%d median_us=%.2f graph_us=%.2f x_step_median=%.3f x_step_graph=%.3f "
        "check=%s\n",
        T, batch, fa.numRegs, med, window, med / base_median, window / base_graph, ok ? "pass" : "FAIL");
    return ok;
  };
  using std::integral_constant;
  bool ok = variant(integral_constant<int, 1>{});
  ok = variant(integral_constant<int, 2>{}) && ok;
  ok = variant(integral_constant<int, 4>{}) && ok;
  ok = variant(integral_constant<int, 8>{}) && ok;
  return ok ? 0 : 1;
}
