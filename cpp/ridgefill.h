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

// ---- RidgeFill prefill ----
// A prompt token takes the approximate path when RidgeFill is enabled, maps are loaded, its sequence
// has an exact_from position, sink_tokens <= pos < exact_from, it belongs to one sequence and no
// output is requested for it.  Every other token (sink rows, the tail, decode steps) is exact.
// Functions returning int32_t give 0 on success, -1 on error (llama_ridgefill_last_error()).

// Load maps from a map file or an augmented model and validate them against the model at
// model_path (NULL: maps_path is the augmented model itself).
LLAMA_API int32_t llama_ridgefill_load_maps(struct llama_context * ctx, const char * maps_path, const char * model_path);
LLAMA_API int32_t llama_ridgefill_set_enabled(struct llama_context * ctx, bool enabled);
// Exact first positions of every prompt.  -1 (the default): the sink_tokens the maps were calibrated
// with.  A value below the maps' is refused, here or when the maps are loaded: calibration left those
// positions out, so the maps never saw them.
LLAMA_API int32_t llama_ridgefill_set_sink_tokens(struct llama_context * ctx, int32_t n);
LLAMA_API int32_t llama_ridgefill_sink_tokens(const struct llama_context * ctx);      // in effect (-1: unset, no maps)
LLAMA_API int32_t llama_ridgefill_maps_sink_tokens(const struct llama_context * ctx); // -1 without maps
// Where the exact tail of a sequence begins; pos < 0 forgets it (the sequence is then all exact).
LLAMA_API int32_t llama_ridgefill_set_exact_from(struct llama_context * ctx, llama_seq_id seq_id, llama_pos pos);
// Debug (off by default): splice mode "k", "v", "kv", "kscale" or "none".  Approximate tokens then also
// run the exact late layers, and the cache keeps exact K, exact V, both, or the predicted K rescaled to
// the exact per-head norms.  With "kv" the cache equals an exact run's.  Each approximate ubatch takes
// 2-3 graph passes; with k, v or kscale the passes see earlier ubatches' spliced cells, so put the
// filled region into one ubatch (n_ubatch >= prompt) for a clean attribution.
LLAMA_API int32_t llama_ridgefill_set_splice(struct llama_context * ctx, const char * mode);
LLAMA_API int32_t llama_ridgefill_split_layer(const struct llama_context * ctx);  // -1 without maps
// A windowed band (default: the maps' ridgefill.band_layers / band_window; absent: 0, no band).  On the rows
// filled approximately, the n_layers layers below the split layer run in full (projections, attention, FFN), but
// their attention sees only the sink positions and the row's `window` latest positions (itself included); the maps
// read the band's output.  Rows computed exactly (sink, tail, decode) attend as always.  -1 restores the maps'
// value; a band whose window is set nowhere attends over 1024 positions.  Needs loaded maps and a model without
// sliding-window attention (not gemma3).  The window saves time only with flash attention (it is a mask).
LLAMA_API int32_t llama_ridgefill_set_band(struct llama_context * ctx, int32_t n_layers, int32_t window);
// Whether the runtime logs (once per context) that a band with flash attention off saves nothing; on by default.
// Callers that say so themselves (the Python bindings: a RuntimeWarning) or that measure quality only turn it off.
LLAMA_API void    llama_ridgefill_set_band_cost_warning(struct llama_context * ctx, bool enabled);
// The band in effect; returns -1 (and -1s) without maps.  NULLs allowed.
LLAMA_API int32_t llama_ridgefill_band(const struct llama_context * ctx, int32_t * n_layers, int32_t * window);
// Band layers that attend to every position on the filled rows too, as exact layers do (default: the maps'
// ridgefill.band_full_layers; absent: none): n layers, ascending, each below the split layer; n = 0 windows the
// whole band, n < 0 restores the maps' own.  Those outside the band in effect change nothing.
LLAMA_API int32_t llama_ridgefill_set_band_full_layers(struct llama_context * ctx, const int32_t * layers, int32_t n);
// The band's layers in effect that attend to every position (inside the band, ascending): writes at most cap of
// them to out (NULL allowed) and returns how many there are; -1 without maps.
LLAMA_API int32_t llama_ridgefill_band_full_layers(const struct llama_context * ctx, int32_t * out, int32_t cap);
// What the maps predict: "input" (a late layer's input; its own K/V projections run on it) or "kv" (its K,
// after any k-norm and before RoPE, and V directly); NULL without maps.  context_tokens C: the maps also read
// the split layer's input of each token's C predecessors in its sequence (-1 without maps).  A token whose
// predecessors' states are not at hand (neither earlier in its batch nor kept from the sequence's last
// decode) is computed exactly.
LLAMA_API const char * llama_ridgefill_map_kind(const struct llama_context * ctx);
LLAMA_API int32_t llama_ridgefill_context_tokens(const struct llama_context * ctx);
// Debug: keep the map outputs y_l = W_l f + b_l (the predicted input, or [K; V]) of the approximate tokens
// of each decode.  llama_ridgefill_predicted gives those of the last decode for late layer il: n_rows rows of
// n_cols floats in batch order (NULL: none).
LLAMA_API int32_t llama_ridgefill_capture_predicted(struct llama_context * ctx, bool enable);
LLAMA_API const float * llama_ridgefill_predicted(const struct llama_context * ctx, int32_t il, int32_t * n_rows,
                                                  int32_t * n_cols);
LLAMA_API int64_t llama_ridgefill_maps_size(const struct llama_context * ctx);    // bytes of map tensors
// Tokens of a sequence processed on each path since its last reset (which also starts a new guard verdict and
// drops the filled positions not yet taken).
LLAMA_API void    llama_ridgefill_get_counts(const struct llama_context * ctx, llama_seq_id seq_id,
                                             int64_t * n_approx, int64_t * n_exact);
LLAMA_API void    llama_ridgefill_reset_counts(struct llama_context * ctx, llama_seq_id seq_id);
// The positions of a sequence filled approximately since the last call, as sorted half-open ranges
// [ranges[2i], ranges[2i+1]); returns the number of ranges (-1: more than max_ranges, nothing taken).
// A caller keeping a fill record (ridgefill.Llama) takes them after each decode.
LLAMA_API int32_t llama_ridgefill_take_filled(struct llama_context * ctx, llama_seq_id seq_id, int32_t * ranges,
                                              int32_t max_ranges);
// Out-of-distribution guard (on by default for maps that carry its threshold, ridgefill.guard.*).  For each
// prompt (counts reset) the first guard_window positions it would fill are computed exactly as a probe, and
// then guard_window positions every `period` (default 1024; 0: the probe only): on these canary rows the
// maps' predictions are compared with the exact values.  After each check the prompt's score is the larger of
// that of all its canary rows so far and that of the last two checks' rows; a score above the threshold (derived
// at calibration from held-out text) sends the rest of the prompt to the exact path; cells filled before a later
// check stay filled.  seq_id -1 sets the default for every sequence (and clears per-sequence settings).
LLAMA_API int32_t llama_ridgefill_set_guard(struct llama_context * ctx, llama_seq_id seq_id, bool enabled);
LLAMA_API int32_t llama_ridgefill_set_guard_period(struct llama_context * ctx, int32_t period);
// The guard's verdict on a sequence's prompt: -1 off (or maps without a threshold), 0 not checked yet,
// 1 passed, 2 fell back (from *fell_back_at on).  score: after the last check, max_score: the largest after
// any check; NULLs allowed.
LLAMA_API int32_t llama_ridgefill_guard(const struct llama_context * ctx, llama_seq_id seq_id, float * score,
                                        float * max_score, float * threshold, int32_t * n_checks,
                                        int32_t * fell_back_at);
LLAMA_API const char * llama_ridgefill_last_error(void);
// Where layer il's weights (map = false: its K projection) or its RidgeFill map (map = true) live: the
// device name ("CPU", "RPC0", "CUDA0", ...), or NULL (no such layer, no map for it).
LLAMA_API const char * llama_ridgefill_placement(const struct llama_context * ctx, int32_t il, bool map);

// Multi-machine: register llama.cpp RPC servers ("host:port,host:port", each a ggml-rpc-server, shipped as
// ridgefill-rpc-server) as devices, before a model is loaded; layers offloaded with n_gpu_layers then
// run there, their maps beside them.  Registering an endpoint twice is a no-op.  Returns the number of
// devices added, -1 on error.  As upstream, an endpoint that does not answer aborts the process:
// ridgefill.Llama and ridgefill-server check that each endpoint accepts a connection first.
LLAMA_API int32_t llama_ridgefill_add_rpc_servers(const char * endpoints);

// Prompt caching.  A fill record lists the positions of a cached prompt whose cells were filled
// approximately, as sorted half-open ranges [ranges[2i], ranges[2i+1]) (n_ranges pairs).  A cell at or
// after the first filled one was computed on top of approximate cells.  A new request that will fill
// [plan_begin, plan_end) approximately (an empty range: an exact request) may reuse the first k of the
// n_common cached tokens it shares, k the largest such that every filled cell below k lies inside
// [plan_begin, plan_end): each reused cell then got at least the exact work a fresh prefill of this
// request would give it.  So an exact request reuses only the cells before the first filled one.
LLAMA_API int32_t llama_ridgefill_reusable_prefix(int32_t n_common, const int32_t * ranges, int32_t n_ranges,
                                                  int32_t plan_begin, int32_t plan_end);

#ifdef __cplusplus
}
#endif
