// What a module's plan entry decides once per plan() (replayssm_plan in module_abi.cuh), and the
// pure decision helpers it uses. Plain C++ (no CUDA headers): the helpers are functions of the
// query, the device limits and each candidate kernel's facts, so a host program compiled with
// any C++17 compiler can check them (tests/cpu/test_persistent_choice.py), and a caller may
// inject the limits (PlanQuery::has_limits) to plan for a device it does not have.
//
// run() never decides: it hands the stored Schedule to replayssm_launch, whose launcher copies
// it into the kernel's params and launches. The one per-launch decision left is the persistent
// kernel's input alignment (persistent_inputs_aligned in the family's launch.cuh): when x, z, B,
// C (q, k, v) are not 16-byte aligned, that launch runs Schedule::tile instead of Schedule::main.
#pragma once

#include <cstdint>

#include "constants.h"
#include "fields.h"

namespace replayssm {

// A device's limits (cudaDeviceGetAttribute), or injected ones.
struct DeviceLimits {
  int32_t sm_count;                 // cudaDevAttrMultiProcessorCount
  int32_t smem_per_block_optin;     // cudaDevAttrMaxSharedMemoryPerBlockOptin (dynamic + static)
  int32_t smem_per_sm;              // cudaDevAttrMaxSharedMemoryPerMultiprocessor
  int32_t reserved_smem_per_block;  // cudaDevAttrReservedSharedMemoryPerBlock (system use, per CTA)
  int32_t max_blocks_per_sm;        // cudaDevAttrMaxBlocksPerMultiprocessor
  int32_t max_threads_per_sm;       // cudaDevAttrMaxThreadsPerMultiProcessor
  int32_t cc_major;                 // cudaDevAttrComputeCapabilityMajor (9 for H200)
  int32_t cc_minor;                 // cudaDevAttrComputeCapabilityMinor
};

// What plan() asks. Dims the module is not compiled for travel here; so do the caller's overrides.
struct PlanQuery {
  int32_t batch;         // rows of the plan (>= 1)
  int32_t heads;         // Mamba-2: H; GDN/KDA: HV
  int32_t groups;        // Mamba-2: G; GDN/KDA: HK (heads % groups == 0)
  int32_t persistent;    // kPersistentAuto / kPersistentOff / kPersistentOn (replay decode only)
  int32_t rows_per_cta;  // 0: the plan picks; else forced (one of kRowChoices dividing the dim)
  int32_t drafts;        // verify: planned drafts per row T (1..capacity); decode: 0
  int32_t has_limits;    // 1: use `limits` and model occupancy (no CUDA call); 0: query the current device
  int32_t pdl;           // 1: the caller allows programmatic dependent launch (common/pdl.cuh); 0: not
  int32_t write_through;  // kWriteThroughAuto / kWriteThroughOff / kWriteThroughOn (replay decode only)
  DeviceLimits limits;   // has_limits = 1: the limits to plan for; 0: unused (the module reads the device's)
};

// One launch configuration.
struct KernelLaunch {
  int32_t kernel;          // kKernel*
  int32_t rows_per_cta;    // rows of P / V per tile
  int32_t heads_per_unit;  // persistent: heads per work unit (Mamba-2: of one group; GDN: HV / HK; KDA: 1); else 0
  int32_t grid;            // CTAs (persistent: min(units, resident CTAs))
  int32_t threads;         // per CTA
  int32_t smem_bytes;      // dynamic shared memory; ring-sized kernels: at the module's largest ring
                           //   capacity (a launch sizes it by the cache's capacity, never more)
  int32_t ctas_per_sm;     // occupancy at smem_bytes (0 when not computed)
  int32_t units;           // persistent: work units; else the grid
};

// The plan entry's answer: what run() launches.
struct Schedule {
  KernelLaunch main;  // what runs
  KernelLaunch tile;  // persistent main: the tile kernel a launch with misaligned inputs runs; else = main
  int32_t fallback;   // kFallback*: why a persistent request runs the tile kernel (0: it does not)
  int32_t pdl;        // 1: main is launched as a programmatic dependent launch (common/pdl.cuh)
  int32_t unit_terms_bytes;  // persistent GDN/KDA verify: workspace bytes per work unit of the launch that
                             //   computes the units' terms ahead (main.units records; 0: none)
};

// What the plan needs to know of one candidate kernel.
struct KernelFacts {
  bool exists;           // instantiated for this tiling (and, persistent, its layout fits: kPersistentOk)
  int32_t dyn_smem;      // dynamic shared memory it launches with
  int32_t static_smem;   // its static shared memory (cudaFuncGetAttributes; 0 when modelled)
  int32_t threads;
  int32_t ctas_per_sm;   // from cudaOccupancyMaxActiveBlocksPerMultiprocessor, or -1: model it
  bool predates_sm90;    // the code the device runs was built for an arch before sm_90 (device path only)
};

// CTAs of one kernel per SM from the shared-memory, block and thread limits (the occupancy
// model used with injected limits; registers are not modelled).
inline int32_t model_ctas_per_sm(const DeviceLimits& lim, int32_t dyn_smem, int32_t static_smem, int32_t threads) {
  const int64_t smem = static_cast<int64_t>(dyn_smem) + static_smem;
  if (smem > lim.smem_per_block_optin) return 0;
  int64_t n = lim.max_blocks_per_sm;
  if (threads > 0 && lim.max_threads_per_sm / threads < n) n = lim.max_threads_per_sm / threads;
  if (smem > 0) {
    const int64_t by_smem = lim.smem_per_sm / (smem + lim.reserved_smem_per_block);
    if (by_smem < n) n = by_smem;
  }
  return static_cast<int32_t>(n);
}

// Whether a kernel with these facts can launch on the device (its shared memory within the
// per-block opt-in), and its occupancy.
inline bool kernel_fits(const DeviceLimits& lim, const KernelFacts& f, int32_t* ctas_per_sm) {
  if (!f.exists || static_cast<int64_t>(f.dyn_smem) + f.static_smem > lim.smem_per_block_optin) return false;
  const int32_t n = f.ctas_per_sm >= 0 ? f.ctas_per_sm : model_ctas_per_sm(lim, f.dyn_smem, f.static_smem, f.threads);
  *ctas_per_sm = n;
  return n >= 1;
}

// Whether the persistent pipelined kernels can run on a device of this compute capability: they
// use mbarrier transaction counts and bulk copies (sm_90 and newer; common/pipeline.cuh), and
// compile to a trap for older archs. Below that a persistent request runs the tile kernel
// (kFallbackArch).
inline bool persistent_arch_ok(const DeviceLimits& lim) { return lim.cc_major >= 9; }

// Why the persistent kernel described by `f` cannot run on `lim`, or kFallbackNone (then
// `*ctas_per_sm` is its occupancy). One classification for every family's plan.
inline int32_t persistent_fallback(const DeviceLimits& lim, const KernelFacts& f, int32_t* ctas_per_sm) {
  if (!persistent_arch_ok(lim) || f.predates_sm90) return kFallbackArch;
  if (!f.exists) return kFallbackLayout;
  if (static_cast<int64_t>(f.dyn_smem) + f.static_smem > lim.smem_per_block_optin) return kFallbackSmemOptin;
  if (!kernel_fits(lim, f, ctas_per_sm)) return kFallbackOccupancy;
  return kFallbackNone;
}

// Heads per work unit when a unit of `heads` heads (each `tiles_per_head` tiles) may be split:
// the fewest splits (a divisor of `heads`) that give at least two units per resident CTA, keeping
// at least `min_tiles` tiles per unit so the producer can run a full pipeline ahead.
inline int32_t split_heads(int32_t heads, int32_t tiles_per_head, int64_t units, int64_t resident, int32_t min_tiles) {
  int32_t best = heads;
  for (int32_t d = 1; d <= heads; ++d) {
    if (heads % d) continue;
    if ((heads / d) * tiles_per_head < min_tiles) break;
    best = heads / d;
    if (units * d >= 2 * resident) break;
  }
  return best;
}

// Whether `rows` is a tiling of a dim (one of kRowChoices dividing it).
inline bool is_row_choice(int32_t rows, int32_t dim) {
  for (int32_t r : kRowChoices)
    if (r == rows && dim % r == 0) return true;
  return false;
}

// The largest tiling of `dim` whose tile (rows of `row_bytes`) is at most `max_bytes`; the
// smallest tiling when none is.
inline int32_t largest_rows(int32_t dim, int64_t row_bytes, int64_t max_bytes) {
  int32_t best = 0, smallest = 0;
  for (int32_t r : kRowChoices) {
    if (dim % r) continue;
    if (smallest == 0 || r < smallest) smallest = r;
    if (r * row_bytes <= max_bytes && r > best) best = r;
  }
  return best ? best : smallest;
}

// Whether a plan runs the persistent kernel: as forced by the query, or else `automatic` (the
// family's rule for this batch).
inline bool persistent_wanted(const PlanQuery& q, bool automatic) {
  return q.persistent == kPersistentAuto ? automatic : q.persistent == kPersistentOn;
}

// The replay decode's write-through step (float32 checkpoint, no read copy, kernel-owned
// cursors): every step folds the row's records and the current token into the checkpoint and
// writes it, as the conventional step does, and appends nothing. At small batches a step is a
// chain of dependent round trips, not bytes, and replaying the ring adds links to it. H100,
// 16-layer graph, µs per layer-step, replay / write-through / conventional
// (perf/results/write_through_small_batch_{gdn,kda}_h100.json, mamba2 in its log):
//   KDA      B=1 7.07 / 5.99 / 5.55   B=2 8.64 / 7.18 / 6.73   B=4 9.80 (persistent) / 9.46 / 9.39
//   GDN      B=1 6.26 / 6.30 / 5.99   B=2 7.19 / 7.45 / 7.08   B=4 9.80 / 9.76 / 9.39
//   Mamba-2  B=1 6.03 / 5.98 / 5.98   B=2 7.84 / 8.65 / 8.45   B=4 11.13 / 13.51 / 15.09
// It pays only where the ring is costly to replay: KDA's per-channel decays (a gate ring as large
// as the key ring, and a per-channel suffix sum before the key products). The automatic rule:
// KDA, with the batch's whole checkpoint at most kWriteThroughMaxStateBytes (B <= 4 for
// Kimi-Linear); Mamba-2 and GDN only when forced.
constexpr int64_t kWriteThroughMaxStateBytes = int64_t{8} << 20;

// Whether a replay decode plan runs the write-through step: as forced by the query, or else where
// the module has it (`exists`), the persistent kernel is not forced and the family's rule
// (`automatic`) holds.
inline bool write_through_wanted(const PlanQuery& q, bool exists, bool automatic) {
  if (q.write_through != kWriteThroughAuto) return q.write_through == kWriteThroughOn;
  return exists && automatic && q.persistent != kPersistentOn;
}

// A wanted write-through step in place of the planned tile kernel, at its tiling (`tile` stays
// for caller-owned cursors); kPlanBadQuery where the module has no such step.
inline int plan_write_through(bool exists, Schedule* s) {
  if (!exists) return kPlanBadQuery;
  s->main.kernel = kKernelWriteThrough;
  return 0;
}

// ---- Mamba-2 heuristics (H200 measurements; previously replayssm/ops/mamba2.py) ----------------

// Persistent pipelined replay step once there are enough heads to stream (the launcher splits
// groups into units of at least four heads); below that, one CTA per tile spreads a few rows
// over more SMs. H200 (perf/results/decode_mamba2_split_h200.json and
// decode_mamba2_persistent_h200.json): 2,048 heads (B = 16 at H = 128) 28.7 vs 32.5 µs, 1,024
// heads (TP8 shape, B = 64) 13.7 vs 16.5 µs.
constexpr int64_t kMamba2PersistentMinHeads = 1024;

// Rows of P per CTA of the tile kernels, from H200 sweeps (perf/results/decode_mamba2_*h200.json):
// once there are enough tiles (batch * H >= 512) the replay kernel wants 64 rows and both kernels
// want a whole head when P = 80; below that, 32 rows (16 when 32 does not divide P).
inline int32_t mamba2_tile_rows(int32_t P, int64_t batch, int32_t heads, bool replay) {
  if (batch * heads >= 512) {
    if (replay && P % 64 == 0) return 64;
    if (P % 80 == 0) return 80;
  }
  return P % 32 == 0 ? 32 : 16;
}

// Tile of the persistent kernel: the largest tiling of P whose checkpoint tile is at most 40 KB
// (P = 64, N = 128, fp32: 64 rows and three stages per CTA, two CTAs per SM; P = 80: a whole
// 40 KB head and two stages; 16-row tiles measured 1.6x slower there).
inline int32_t mamba2_persistent_rows(int32_t P, int32_t N, int32_t state_bytes) {
  return largest_rows(P, static_cast<int64_t>(N) * state_bytes, 40 * 1024);
}

// Tile of the persistent verify: the largest tiling of P whose checkpoint tile is at most 16 KB
// (P = 64, N = 128: 32 rows of fp32, 64 of bf16), so that two unit buffers (the drafts' inputs and
// coefficient tables) and at least three stages fit each of two CTAs per SM.
inline int32_t mamba2_verify_persistent_rows(int32_t P, int32_t N, int32_t state_bytes) {
  return largest_rows(P, static_cast<int64_t>(N) * state_bytes, 16 * 1024);
}

// ---- GDN / KDA heuristics (H200 measurements; previously replayssm/ops/gdn.py) -----------------

// Persistent pipelined replay step once there are enough units (GDN: batch rows x key heads;
// KDA: x value heads). H200 (perf/results/decode_{gdn,kda}_persistent_h200.json): it wins from
// B = 8 (128 units for Qwen3-Next: 12.2 vs 17.9 µs) and loses at B = 1 (16 units).
constexpr int64_t kDeltaPersistentMinUnits = 128;

// 64 rows of V once there are enough tiles (32 when a K-row is 1 KB or more), else 32.
inline int32_t delta_tile_rows(int32_t V, int32_t K, int64_t batch, int32_t num_v_heads) {
  int32_t rows = batch * num_v_heads >= 512 && K <= 128 ? 64 : 32;
  while (V % rows) rows /= 2;
  return rows;
}

// Tile of the persistent kernel: the largest tiling of V whose checkpoint tile is at most 32 KB.
// At K = 128, fp32, 64-row tiles (two stages per CTA) beat 32-row tiles (five stages): 165 vs
// 212 µs for GDN and 189 vs 223 µs for KDA at B = 256 (perf/README.md).
inline int32_t delta_persistent_rows(int32_t V, int32_t K, int32_t state_bytes) {
  return largest_rows(V, static_cast<int64_t>(K) * state_bytes, 32 * 1024);
}

// Persistent pipelined verify once there are enough value heads to stream (B = 32 at HV = 32),
// as the Mamba-2 verify's rule (not measured separately yet).
constexpr int64_t kDeltaVerifyPersistentMinHeads = 1024;

// Tile of the persistent verify: the largest tiling of V whose checkpoint tile is at most 16 KB
// (K = V = 128: 32 rows of fp32, 64 of bf16), so that two unit buffers (the drafts' vectors and
// coefficient tables) and stages fit each CTA, as mamba2_verify_persistent_rows.
inline int32_t delta_verify_persistent_rows(int32_t V, int32_t K, int32_t state_bytes) {
  return largest_rows(V, static_cast<int64_t>(K) * state_bytes, 16 * 1024);
}

// Whether a launch may be a programmatic dependent launch: the caller asked for it (PlanQuery::pdl),
// the device has it (sm_90 and newer) and the kernel waits for its prerequisites before it reads
// the step's inputs or writes anything (kernels that do: common/pdl.cuh).
inline int32_t pdl_allowed(const PlanQuery& q, const KernelLaunch& k, bool kernel_waits) {
  return q.pdl && kernel_waits && q.limits.cc_major >= 9 && k.grid > 0 ? 1 : 0;
}

// ---- assembling a schedule ---------------------------------------------------------------------

// A one-CTA-per-tile launch of `kernel`: batch * heads * dim / rows CTAs of 128 threads.
inline KernelLaunch tile_launch(int32_t kernel, int32_t rows, int64_t batch, int32_t heads, int32_t dim,
                                int32_t smem_bytes, int32_t ctas_per_sm) {
  KernelLaunch k{};
  k.kernel = kernel;
  k.rows_per_cta = rows;
  const int64_t ctas = batch * heads * (dim / rows);
  k.grid = ctas > 0x7fffffffLL ? -1 : static_cast<int32_t>(ctas);
  k.units = k.grid;
  k.threads = 128;
  k.smem_bytes = smem_bytes;
  k.ctas_per_sm = ctas_per_sm;
  return k;
}

// The persistent launch: min(units, resident) CTAs.
inline KernelLaunch persistent_launch(int32_t rows, int32_t heads_per_unit, int64_t units, const DeviceLimits& lim,
                                      const KernelFacts& f, int32_t ctas_per_sm) {
  KernelLaunch k{};
  k.kernel = kKernelPersistent;
  k.rows_per_cta = rows;
  k.heads_per_unit = heads_per_unit;
  const int64_t resident = static_cast<int64_t>(lim.sm_count) * ctas_per_sm;
  const int64_t grid = units < resident ? units : resident;
  k.grid = static_cast<int32_t>(grid);
  k.units = units > 0x7fffffffLL ? -1 : static_cast<int32_t>(units);
  k.threads = f.threads;
  k.smem_bytes = f.dyn_smem;
  k.ctas_per_sm = ctas_per_sm;
  return k;
}

// Basic query checks shared by every op (dims of the module are checked by the op).
inline int32_t check_query(const PlanQuery& q) {
  if (q.batch < 1 || q.heads < 1 || q.groups < 1 || q.heads % q.groups) return kPlanBadQuery;
  if (q.persistent < kPersistentAuto || q.persistent > kPersistentOn) return kPlanBadQuery;
  const DeviceLimits& l = q.limits;
  if (q.has_limits && (l.sm_count < 1 || l.smem_per_block_optin < 0 || l.smem_per_sm < 0 || l.max_blocks_per_sm < 1 ||
                       l.max_threads_per_sm < 1 || l.cc_major < 1 || l.cc_minor < 0))
    return kPlanBadQuery;
  return 0;
}

inline const char* plan_error_string(int code) {
  switch (code) {
    case kPlanBadQuery: return "replayssm plan: batch, heads, groups, persistent or the device limits are out of range";
    case kPlanBadRows: return "replayssm plan: rows_per_cta is not a tiling of this module's dim";
    case kPlanSmemTooLarge:
      return "replayssm plan: the kernel at this rows_per_cta needs more shared memory per block than the device "
             "allows (choose a smaller rows_per_cta)";
    case kPlanNoEntry: return "replayssm plan: the module has no such entry, or the entry takes no plan";
    default: return nullptr;
  }
}

// Field tables (common/fields.h): the loader compares them with the ctypes mirrors of the plan's
// structs (replayssm/ops/abi.py) through the pseudo-entries kEntryPlanQuery and kEntrySchedule.
REPLAYSSM_DESCRIBE_BEGIN(DeviceLimits)
REPLAYSSM_FIELD(sm_count)
REPLAYSSM_FIELD(smem_per_block_optin)
REPLAYSSM_FIELD(smem_per_sm)
REPLAYSSM_FIELD(reserved_smem_per_block)
REPLAYSSM_FIELD(max_blocks_per_sm)
REPLAYSSM_FIELD(max_threads_per_sm)
REPLAYSSM_FIELD(cc_major)
REPLAYSSM_FIELD(cc_minor)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(PlanQuery)
REPLAYSSM_FIELD(batch)
REPLAYSSM_FIELD(heads)
REPLAYSSM_FIELD(groups)
REPLAYSSM_FIELD(persistent)
REPLAYSSM_FIELD(rows_per_cta)
REPLAYSSM_FIELD(drafts)
REPLAYSSM_FIELD(has_limits)
REPLAYSSM_FIELD(pdl)
REPLAYSSM_FIELD(write_through)
REPLAYSSM_FIELD(limits)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(KernelLaunch)
REPLAYSSM_FIELD(kernel)
REPLAYSSM_FIELD(rows_per_cta)
REPLAYSSM_FIELD(heads_per_unit)
REPLAYSSM_FIELD(grid)
REPLAYSSM_FIELD(threads)
REPLAYSSM_FIELD(smem_bytes)
REPLAYSSM_FIELD(ctas_per_sm)
REPLAYSSM_FIELD(units)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(Schedule)
REPLAYSSM_FIELD(main)
REPLAYSSM_FIELD(tile)
REPLAYSSM_FIELD(fallback)
REPLAYSSM_FIELD(pdl)
REPLAYSSM_FIELD(unit_terms_bytes)
REPLAYSSM_DESCRIBE_END

}  // namespace replayssm
