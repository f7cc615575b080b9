// RidgeFill inside libllama: maps, per-context state, and the graph's view of them.
// Included by the patched upstream files (see ggml-patches/) and by cpp/*.cpp.
#pragma once

#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

struct llama_model;
struct llama_ubatch;
class llama_batch_allocr;

// What a map predicts for its late layer (GGUF ridgefill.map_kind): the layer's input (then its own norm and
// K/V projections run on it), or its K (after any k-norm, before RoPE) and V directly.
enum class ridgefill_map_kind : uint8_t { input, kv };

// The maps of one split layer: y_l = W_l f + b_l for every late layer l > split_layer, where the features
// f = [h_t, h_{t-1}, .., h_{t-C}] are the split layer's input for the token and its C predecessors of the
// same sequence (C = context_tokens), and y_l is x̂_l (input maps) or [K̂_l; V̂_l] (kv maps).
struct ridgefill_maps {
    int32_t split_layer = -1;
    int32_t n_layer     = 0;
    int32_t sink_tokens = 0;  // first positions of each calibration chunk the maps were not fitted on
    int32_t format_version = 1;
    ridgefill_map_kind kind = ridgefill_map_kind::input;
    int32_t context_tokens = 0;
    // a windowed band (GGUF ridgefill.band_layers / band_window; absent: 0, none): on the filled rows the
    // band_layers layers below the split run in full, attending only to the sink and their band_window latest
    // positions; the maps read their output.  The runtime may override both (llama_ridgefill_set_band).
    int32_t band_layers = 0, band_window = 0;
    // band layers that attend to every position on the filled rows as well, like exact layers (GGUF
    // ridgefill.band_full_layers, ascending, below split_layer; absent: none): the far context the window would take
    // from them is what the maps miss most (docs/maps.md, "Unwindowed heads or unwindowed layers")
    std::vector<int32_t> band_full_layers;
    int64_t d_k = 0, d_v = 0;  // kv maps: rows [0, d_k) of y are K (head-major), [d_k, d_k + d_v) are V
    uint64_t generation = 0;  // unique per load: graphs are reused only for the same maps, not the same address
    std::string path;
    std::string fingerprint;
    std::string prior;
    std::string map_type;
    // out-of-distribution guard (GGUF ridgefill.guard.*; files without them: guard_window 0, no guard)
    int32_t guard_window = 0;          // rows per check that the threshold was derived for
    std::vector<float> guard_error;    // [late layer][part]: held-out relative squared error (parts: x, or K then V)
    float guard_threshold = 0.0f;      // a check whose score exceeds it sends the prompt's rest to the exact path
    int guard_parts() const { return kind == ridgefill_map_kind::kv ? 2 : 1; }

    std::vector<ggml_tensor *> weight; // [n_layer], null for l <= split_layer; ne = {(C+1)·d, d_out}
    std::vector<ggml_tensor *> bias;   // [n_layer], null for l <= split_layer; ne = {d_out}

    std::vector<ggml_context *>          ctxs;
    std::vector<ggml_backend_buffer_t>   bufs;
    size_t n_bytes = 0;

    ~ridgefill_maps();
};

// Splice debug modes: approximate tokens also run the exact late layers, and the cache keeps
// the exact K (k), V (v), both (kv), or predicted K rescaled to the exact per-head norms (kscale).
enum class ridgefill_splice : uint8_t { none, k, v, kv, kscale };

// The guard's state for one sequence's prompt (reset with its counts, llama_ridgefill_reset_counts).  Checks are
// windows of guard_window exact "canary" rows: the probe at the first position the prompt would fill (origin),
// then one every guard_period positions.  On each, the maps' prediction is compared with the exact values.
struct ridgefill_guard_seq {
    llama_pos origin = -1;         // first position this prompt would fill; -1: none seen yet
    int32_t verdict  = 0;          // 0 not checked yet, 1 passed, 2 fell back (the rest of the prompt is exact)
    int32_t n_checks = 0;
    float   score = 0.0f, max_score = 0.0f;  // the score after the last check (guard_decide), and the largest
    llama_pos fell_back_at = -1;   // first position computed exactly because of the guard
    int32_t window = -1;           // the check being accumulated (index k of origin + k·period)
    int32_t rows   = 0;
    // per late layer and part: sums of |y_hat - y|^2 and |y|^2 over all canary rows so far, over this check's rows,
    // over the previous check's
    std::vector<double> num, den, cur_num, cur_den, prev_num, prev_den;
};

// Per-context RidgeFill state, set through the C API in ridgefill.h.
struct ridgefill_context {
    std::shared_ptr<ridgefill_maps> maps;
    bool    enabled     = false;
    int32_t sink_tokens = -1; // -1: the maps' own sink_tokens

    int32_t sink() const { return sink_tokens >= 0 ? sink_tokens : (maps ? maps->sink_tokens : 0); }
    int32_t band_layers = -1, band_window = -1;  // -1: the maps' own
    bool    band_full_set = false;                // band_full_layers overrides the maps' own
    std::vector<int32_t> band_full_layers;
    bool    band_cost_warn = true;                // log once that a band without flash attention saves nothing
    int32_t band() const { return band_of(band_layers, maps.get()); }
    int32_t window() const { return window_of(band_layers, band_window, maps.get()); }
    // the band's layers that attend to every position (ascending; only those inside the band in effect)
    std::vector<int32_t> band_full() const;
    // the band in effect for overrides (-1: the maps' own) and maps; a band without a window anywhere gets
    // RIDGEFILL_BAND_WINDOW (the best measured trade at 8K: docs/maps.md, "The windowed band in the runtime")
    static constexpr int32_t RIDGEFILL_BAND_WINDOW = 1024;
    static int32_t band_of(int32_t layers, const ridgefill_maps * m) { return layers >= 0 ? layers : (m ? m->band_layers : 0); }
    static int32_t window_of(int32_t layers, int32_t window, const ridgefill_maps * m) {
        if (window >= 0) {
            return window;
        }
        if (m && m->band_window > 0) {
            return m->band_window;
        }
        return band_of(layers, m) > 0 ? RIDGEFILL_BAND_WINDOW : 0;
    }
    std::map<llama_seq_id, llama_pos> exact_from; // per sequence: positions >= it are the exact tail

    // tokens per sequence that took each path since the last reset
    std::map<llama_seq_id, int64_t> n_approx, n_exact;
    // positions filled approximately per sequence since the last take (sorted half-open ranges): the source of
    // every fill record (llama_ridgefill_take_filled)
    std::map<llama_seq_id, std::vector<int32_t>> filled;

    // splice: the pass now running and what earlier passes recorded for the current ubatch
    ridgefill_splice splice = ridgefill_splice::none;
    int pass = 0;
    std::vector<std::vector<float>> exact_inp;   // [n_layer] exact layer inputs, n_embd x n_tokens
    std::vector<std::vector<float>> exact_knorm; // [n_layer] exact per-head K norms, n_head_kv x n_tokens

    // context features: per sequence, the split layer's input of its last decoded positions (at most
    // context_tokens of them), exact (layers below the split are exact on every path).  Written after
    // every ubatch; entries the memory no longer holds as decoded are dropped (ridgefill_memory_changed).
    std::map<llama_seq_id, std::map<llama_pos, std::vector<float>>> carry;
    const void * memory = nullptr;  // the context's memory, whose changes reach `carry`

    // out-of-distribution guard: on by default for maps that carry its threshold; per-sequence overrides
    bool guard_on = true;
    std::map<llama_seq_id, bool> guard_seq_on;
    int32_t guard_period = 1024;   // positions between checks after the probe; 0: the probe only
    std::map<llama_seq_id, ridgefill_guard_seq> guard;
    std::set<std::pair<llama_seq_id, llama_pos>> canary;  // the canary rows of the current batch
    bool guard_active(llama_seq_id seq) const;

    // debug: the map outputs y_l of the approximate tokens of the last decode, per late layer, batch order
    bool capture_pred = false;
    std::vector<std::vector<float>> pred;  // [n_layer] rows of d_out floats

    ~ridgefill_context();
};

// What a graph needs to know: non-null maps only when the ubatch takes the approximate path.
// The other fields describe a splice pass; their defaults are the normal paths.
struct ridgefill_graph {
    const ridgefill_maps * maps = nullptr;
    uint64_t maps_generation = 0;
    int32_t split_layer = -1;

    const ridgefill_context * rf = nullptr; // splice passes: the recorded exact inputs and norms
    bool record_inp  = false; // exact graph that records copies of its late layer inputs
    bool exact_inp   = false; // fill from the recorded exact inputs instead of W h + b
    bool store_k     = true;  // fill-only layers write K ...
    bool store_v     = true;  // ... and V
    bool record_norm = false; // output the per-head norms of K
    bool rescale_k   = false; // rescale K to the recorded norms

    // context features (maps with context_tokens > 0, on every path): the graph copies out the split
    // layer's input of each sequence's last rows, and an approximate graph gathers each token's predecessors
    int32_t context_tokens = 0;
    const ridgefill_context * carry_rf = nullptr;
    bool record_pred = false; // output the map outputs (llama_ridgefill_capture_predicted)

    // guard: an exact graph holding canary rows also predicts them with these maps and outputs the error sums
    const ridgefill_maps * canary_maps = nullptr;
    int32_t n_canary = 0;

    // a windowed band (approximate graphs): layers [split_layer - band_layers, split_layer) attend through a mask
    // that keeps the first band_sink positions and each row's band_window latest ones; the band_full layers among
    // them take the layer input's ordinary mask
    int32_t band_layers = 0, band_window = 0, band_sink = 0;
    std::vector<int32_t> band_full;
    bool in_band(int il) const {
        return approx() && il >= split_layer - band_layers && il < split_layer &&
               std::find(band_full.begin(), band_full.end(), il) == band_full.end();
    }

    bool approx() const { return maps != nullptr; }
    bool operator==(const ridgefill_graph & o) const {
        return maps == o.maps && maps_generation == o.maps_generation && split_layer == o.split_layer && rf == o.rf && record_inp == o.record_inp &&
               exact_inp == o.exact_inp && store_k == o.store_k && store_v == o.store_v &&
               record_norm == o.record_norm && rescale_k == o.rescale_k && context_tokens == o.context_tokens &&
               carry_rf == o.carry_rf && record_pred == o.record_pred && canary_maps == o.canary_maps &&
               n_canary == o.n_canary && band_layers == o.band_layers && band_window == o.band_window &&
               band_sink == o.band_sink && band_full == o.band_full;
    }
    bool operator!=(const ridgefill_graph & o) const { return !(*this == o); }
};

// The one place where a token's path is decided: true = approximate (layers >= s only fill K/V).
// context_known: the exact states of its predecessors that the maps read are at hand.
bool ridgefill_token_is_approx(const ridgefill_context & rf, llama_seq_id seq_id, int32_t n_seq_id,
                               llama_pos pos, bool output, bool context_known = true);

// Marks every token of the batch held by `balloc` with its path (ubatches are then cut where it changes), and
// the guard's canary rows (exact rows checked against the maps).
void ridgefill_mark_batch(ridgefill_context * rf, llama_batch_allocr & balloc);

// Whether a ubatch marked approximate takes the approximate path now: not if the guard has sent one of its
// sequences to the exact path since the batch was marked (or has not yet checked it).
bool ridgefill_ubatch_approx(const ridgefill_context * rf, const llama_ubatch & ubatch);

// The graph parameters for one ubatch.
ridgefill_graph ridgefill_graph_for(const ridgefill_context * rf, const llama_ubatch & ubatch);

// Counts the tokens of a processed ubatch per sequence and path.
void ridgefill_count(ridgefill_context * rf, const llama_ubatch & ubatch);

// Splice passes of a ubatch (1 unless a splice mode is on and the ubatch is approximate), and the
// hooks around each: which graph the pass builds, and what it leaves for the next pass.
struct llm_graph_result;
int  ridgefill_n_passes(const ridgefill_context * rf, const llama_ubatch & ubatch);
void ridgefill_begin_pass(ridgefill_context * rf, int pass);
void ridgefill_end_pass(ridgefill_context * rf, const llama_ubatch & ubatch, const llm_graph_result * res,
                        ggml_backend_sched_t sched);

// The one function through which every map product goes: y_l = W_l f + b_l, f the features [(C+1)·d, n].
ggml_tensor * ridgefill_map_apply(ggml_context * ctx, const ridgefill_maps & maps, int il, ggml_tensor * f);

// The memory of a context changed other than by a decode (llama_memory_* calls, state loads): carried states
// of sequence `seq` (-1: all) at positions [p0, p1) (negative: unbounded) are dropped; keep_only drops
// every other sequence's instead.
void ridgefill_memory_changed(const void * memory, llama_seq_id seq, llama_pos p0, llama_pos p1, bool keep_only = false);

// Loads and validates maps for `model` from a map file or an augmented model; throws std::runtime_error.
std::shared_ptr<ridgefill_maps> ridgefill_maps_load(const llama_model & model, const std::string & maps_path,
                                                    const std::string & model_path);

// sha256 fingerprint of a base model file (see python/ridgefill/ggufio.py: fingerprint).
std::string ridgefill_fingerprint(const std::string & model_path);
