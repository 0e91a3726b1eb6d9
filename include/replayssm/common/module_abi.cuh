// The C ABI every replayssm module exports (see replayssm/jit/loader.py). A module defines
// `using ModuleOp = ...;` (a type with Params, launch() and prepare()) and its name, then
// includes this header once.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#define REPLAYSSM_EXPORT extern "C" __attribute__((visibility("default")))

#define REPLAYSSM_MODULE_ABI_VERSION 1

#define REPLAYSSM_DEFINE_MODULE(NAME_STR, OP)                                                   \
  REPLAYSSM_EXPORT int replayssm_abi_version() { return REPLAYSSM_MODULE_ABI_VERSION; }         \
  REPLAYSSM_EXPORT const char* replayssm_module_name() { return NAME_STR; }                    \
  REPLAYSSM_EXPORT size_t replayssm_params_size(int entry) {                                  \
    return entry == 0 ? sizeof(typename OP::Params) : 0;                                      \
  }                                                                                           \
  REPLAYSSM_EXPORT int replayssm_prepare() { return static_cast<int>(OP::prepare()); }         \
  REPLAYSSM_EXPORT int replayssm_launch(int entry, const void* params, void* stream) {        \
    if (entry != 0 || params == nullptr) return static_cast<int>(cudaErrorInvalidValue);      \
    return static_cast<int>(                                                                  \
        OP::launch(*static_cast<const typename OP::Params*>(params), static_cast<cudaStream_t>(stream))); \
  }                                                                                           \
  REPLAYSSM_EXPORT const char* replayssm_error_string(int code) {                              \
    return cudaGetErrorString(static_cast<cudaError_t>(code));                                \
  }
