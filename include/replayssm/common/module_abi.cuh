// The C ABI every replayssm module exports (see replayssm/jit/loader.py). A module defines its
// ops (types with Params, launch() and prepare()) and its name, then includes this header once
// and uses REPLAYSSM_DEFINE_MODULE (one entry) or REPLAYSSM_DEFINE_MODULE2 (entries 0 and 1,
// e.g. a verify and its commit).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#define REPLAYSSM_EXPORT extern "C" __attribute__((visibility("default")))

#define REPLAYSSM_MODULE_ABI_VERSION 1

namespace replayssm {

// An op that does not exist: entry 1 of a one-entry module.
struct NoOp {
  struct Params {};
  static cudaError_t launch(const Params&, cudaStream_t) { return cudaErrorInvalidValue; }
  static cudaError_t prepare() { return cudaSuccess; }
};

}  // namespace replayssm

#define REPLAYSSM_DEFINE_MODULE2(NAME_STR, OP0, OP1)                                             \
  REPLAYSSM_EXPORT int replayssm_abi_version() { return REPLAYSSM_MODULE_ABI_VERSION; }         \
  REPLAYSSM_EXPORT const char* replayssm_module_name() { return NAME_STR; }                    \
  REPLAYSSM_EXPORT size_t replayssm_params_size(int entry) {                                  \
    if (entry == 0) return sizeof(typename OP0::Params);                                      \
    if (entry == 1 && !std::is_same<OP1, replayssm::NoOp>::value) return sizeof(typename OP1::Params); \
    return 0;                                                                                 \
  }                                                                                           \
  REPLAYSSM_EXPORT int replayssm_prepare() {                                                   \
    cudaError_t e = OP0::prepare();                                                           \
    if (e == cudaSuccess) e = OP1::prepare();                                                 \
    return static_cast<int>(e);                                                               \
  }                                                                                           \
  REPLAYSSM_EXPORT int replayssm_launch(int entry, const void* params, void* stream) {        \
    if (params == nullptr) return static_cast<int>(cudaErrorInvalidValue);                    \
    const cudaStream_t s = static_cast<cudaStream_t>(stream);                                 \
    if (entry == 0) return static_cast<int>(OP0::launch(*static_cast<const typename OP0::Params*>(params), s)); \
    if (entry == 1 && !std::is_same<OP1, replayssm::NoOp>::value)                             \
      return static_cast<int>(OP1::launch(*static_cast<const typename OP1::Params*>(params), s)); \
    return static_cast<int>(cudaErrorInvalidValue);                                           \
  }                                                                                           \
  REPLAYSSM_EXPORT const char* replayssm_error_string(int code) {                              \
    return cudaGetErrorString(static_cast<cudaError_t>(code));                                \
  }

#define REPLAYSSM_DEFINE_MODULE(NAME_STR, OP) REPLAYSSM_DEFINE_MODULE2(NAME_STR, OP, replayssm::NoOp)
