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

// Layer inputs (used by calibration).  The input of layer il is the residual
// stream entering it, before its attention norm.  Capture is off by default.
// Returns false, capturing nothing, if il is not in 0..n_layer-1 or the model's
// architecture does not expose its layer inputs.
LLAMA_API bool llama_ridgefill_capture_layer_input(struct llama_context * ctx, int32_t il, bool enable);

// After a decode with capture on for il: float[n_tokens * n_embd], row i = token
// i of the batch, valid until the next decode.  Call only for captured layers.
LLAMA_API const float * llama_ridgefill_layer_input(struct llama_context * ctx, int32_t il);

#ifdef __cplusplus
}
#endif
