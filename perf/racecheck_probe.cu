// Racecheck probe: the producer/consumer protocol of the persistent kernels, reduced to its
// synchronisation, with nothing else in it. One producer warp fills a ring of stages with a bulk
// copy (plus one cp.async per lane, completing on the same "full" mbarrier); four consumer warps
// wait on "full", read the stage, sum it, and release it on the "empty" mbarrier. The producer
// waits on "empty" before refilling. Every sum is checked against the host, so a real race shows
// as a wrong sum; whatever compute-sanitizer --tool racecheck reports on this program is what it
// reports for the protocol itself.
//
// Two releases of a stage are compared: lane 0 of each consumer warp arrives after __syncwarp()
// (what the kernels do: 4 arrivals per stage), or every consumer thread arrives (128 arrivals).
//
//   nvcc -std=c++17 -arch=sm_90a -I include -o /tmp/racecheck_probe perf/racecheck_probe.cu
//   compute-sanitizer --tool racecheck /tmp/racecheck_probe warp     (or: thread)
#include <cstdio>
#include <vector>

#include "replayssm/common/pipeline.cuh"

using namespace replayssm;

constexpr int kStages = 3, kTiles = 24, kFloats = 1024, kExtra = 32;
constexpr int kStageBytes = (kFloats + kExtra) * 4;

template <bool kEveryThreadArrives>
__global__ void __launch_bounds__(160) probe(const float* tiles, const float* extra, float* sums) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kStages;
  unsigned char* stages = smem + 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 33);
      mbar_init(&empty[s], kEveryThreadArrives ? 128 : 4);
    }
    mbar_init_fence();
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (warp == 4) {  // producer
    for (int t = 0; t < kTiles; ++t) {
      const int s = t % kStages;
      mbar_wait(&empty[s], ((t / kStages) & 1) ^ 1);
      float* st = reinterpret_cast<float*>(stages + s * kStageBytes);
      if (lane == 0) {
        mbar_arrive_expect_tx(&full[s], kFloats * 4);
        bulk_copy_g2s(st, tiles + t * kFloats, kFloats * 4, &full[s]);
      }
      cp_async4(st + kFloats + lane, extra + t * kExtra + lane);
      mbar_arrive_cp_async(&full[s]);
    }
    cp_async_wait_all();
    return;
  }
  for (int t = 0; t < kTiles; ++t) {  // consumers: warp w sums a quarter of the tile
    const int s = t % kStages;
    mbar_wait(&full[s], (t / kStages) & 1);
    const float* st = reinterpret_cast<const float*>(stages + s * kStageBytes);
    float acc = 0.f;
    for (int i = warp * 256 + lane; i < (warp + 1) * 256; i += 32) acc += st[i];
    if (warp == 0) acc += st[kFloats + lane];
    if (kEveryThreadArrives) {
      mbar_arrive(&empty[s]);
    } else {
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
    for (int o = 16; o; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) atomicAdd(&sums[t], acc);
  }
}

int main(int argc, char** argv) {
  const bool every_thread = argc > 1 && argv[1][0] == 't';
  std::vector<float> h_tiles(kTiles * kFloats), h_extra(kTiles * kExtra), expect(kTiles, 0.f);
  for (int t = 0; t < kTiles; ++t) {
    for (int i = 0; i < kFloats; ++i) expect[t] += h_tiles[t * kFloats + i] = float((t * 7 + i) % 13);
    for (int i = 0; i < kExtra; ++i) expect[t] += h_extra[t * kExtra + i] = float((t + i) % 5);
  }
  float *tiles, *extra, *sums;
  cudaMalloc(&tiles, h_tiles.size() * 4);
  cudaMalloc(&extra, h_extra.size() * 4);
  cudaMalloc(&sums, kTiles * 4);
  cudaMemcpy(tiles, h_tiles.data(), h_tiles.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(extra, h_extra.data(), h_extra.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(sums, 0, kTiles * 4);
  const int smem = 128 + kStages * kStageBytes;
  if (every_thread) {
    cudaFuncSetAttribute(probe<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    probe<true><<<1, 160, smem>>>(tiles, extra, sums);
  } else {
    cudaFuncSetAttribute(probe<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    probe<false><<<1, 160, smem>>>(tiles, extra, sums);
  }
  cudaError_t err = cudaDeviceSynchronize();
  std::vector<float> got(kTiles);
  cudaMemcpy(got.data(), sums, kTiles * 4, cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int t = 0; t < kTiles; ++t) bad += got[t] != expect[t];
  std::printf("racecheck_probe (%s arrives): %s, %d of %d sums wrong\n", every_thread ? "every thread" : "lane 0",
              cudaGetErrorString(err), bad, kTiles);
  return err != cudaSuccess || bad;
}
