// RidgeFill: public C API of the fork, compiled into libllama.
//
// Everything RidgeFill adds to llama.cpp is declared here (new functions rather
// than new fields in llama.h's param structs, which llama-cpp-python mirrors
// with ctypes and must not change layout).
#pragma once

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

// Identity of the fork: our version, the pinned upstream, the patch series.
LLAMA_API const char * llama_ridgefill_version(void);      // e.g. "0.1.0"
LLAMA_API const char * llama_ridgefill_upstream(void);     // e.g. "llama-cpp-python 0.3.36 (sha256 832db069...)"
LLAMA_API const char * llama_ridgefill_patch_series(void); // e.g. "3f2a9c0e11d2: 0001-..., 0002-..."

// One line for logs, system info and the server's /props.
LLAMA_API const char * llama_ridgefill_fork_info(void);

#ifdef __cplusplus
}
#endif
