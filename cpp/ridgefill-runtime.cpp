// RidgeFill at run time: the C API, the per-token path decision and the graph's helpers.
#include "ridgefill.h"
#include "ridgefill-internal.h"

#include "llama-batch.h"
#include "llama-context.h"
#include "llama-graph.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"
#include "llama-model.h"

#include <stdexcept>

// ---- the path of a token ---------------------------------------------------------------------

bool ridgefill_token_is_approx(const ridgefill_context & rf, llama_seq_id seq_id, int32_t n_seq_id,
                               llama_pos pos, bool output) {
    if (!rf.enabled || !rf.maps || n_seq_id != 1 || output) {
        return false;  // shared tokens and tokens whose logits are wanted stay exact
    }
    const auto it = rf.exact_from.find(seq_id);
    if (it == rf.exact_from.end()) {
        return false;  // no tail declared for this sequence: exact
    }
    return pos >= rf.sink_tokens && pos < it->second;
}

void ridgefill_mark_batch(ridgefill_context * rf, llama_batch_allocr & balloc) {
    if (!rf || !rf->enabled || !rf->maps) {
        return;
    }
    const llama_batch & b = balloc.get_batch();
    std::vector<uint8_t> approx(b.n_tokens, 0);
    bool any = false;
    for (int32_t i = 0; i < b.n_tokens; ++i) {
        approx[i] = ridgefill_token_is_approx(*rf, b.seq_id[i][0], b.n_seq_id[i], b.pos[i], b.logits && b.logits[i]);
        any |= approx[i] != 0;
    }
    if (any) {
        balloc.ridgefill_approx = std::move(approx);
    }
}

ridgefill_graph ridgefill_graph_for(const ridgefill_context * rf, const llama_ubatch & ubatch) {
    if (!rf || !rf->maps || !ubatch.ridgefill_approx) {
        return {};
    }
    return {rf->maps.get(), rf->maps->split_layer};
}

void ridgefill_count(ridgefill_context * rf, const llama_ubatch & ubatch) {
    if (!rf) {
        return;
    }
    auto & counts = ubatch.ridgefill_approx ? rf->n_approx : rf->n_exact;
    for (uint32_t i = 0; i < ubatch.n_tokens; ++i) {
        counts[ubatch.seq_id[i][0]] += 1;
    }
}

// ---- graph helpers (declared on llm_graph_context by ggml-patches/0007) ----------------------------

ggml_tensor * llm_graph_context::build_ridgefill_input(ggml_tensor * inpL, int il) const {
    if (!ridgefill.approx() || il <= ridgefill.split_layer) {
        return inpL;  // exact path, or the split layer itself (its input is h)
    }
    ggml_tensor * x = ridgefill_map_apply(ctx0, *ridgefill.maps, il, inpL);  // inpL stays h on this path
    cb(x, "ridgefill_inp", il);
    return x;
}

bool llm_graph_context::ridgefill_fill_only(int il) const {
    return ridgefill.approx() && il >= ridgefill.split_layer;
}

void llm_graph_context::build_ridgefill_store(llm_graph_input_attn_kv * inp, ggml_tensor * k_cur,
                                              ggml_tensor * v_cur, int il) const {
    if (inp->self_k_rot) {
        k_cur = llama_mul_mat_hadamard(ctx0, k_cur, inp->self_k_rot);
    }
    if (inp->self_v_rot) {
        v_cur = llama_mul_mat_hadamard(ctx0, v_cur, inp->self_v_rot);
    }
    ggml_build_forward_expand(gf, inp->mctx->cpy_k(ctx0, k_cur, inp->get_k_idxs(), il));
    ggml_build_forward_expand(gf, inp->mctx->cpy_v(ctx0, v_cur, inp->get_v_idxs(), il));
}

void llm_graph_context::build_ridgefill_store(llm_graph_input_attn_kv_iswa * inp, ggml_tensor * k_cur,
                                              ggml_tensor * v_cur, int il) const {
    const bool is_swa = hparams.is_swa(il);
    ggml_tensor * k_rot = is_swa ? inp->self_k_rot_swa : inp->self_k_rot;
    ggml_tensor * v_rot = is_swa ? inp->self_v_rot_swa : inp->self_v_rot;
    if (k_rot) {
        k_cur = llama_mul_mat_hadamard(ctx0, k_cur, k_rot);
    }
    if (v_rot) {
        v_cur = llama_mul_mat_hadamard(ctx0, v_cur, v_rot);
    }
    const auto * mctx_cur = is_swa ? inp->mctx->get_swa() : inp->mctx->get_base();
    ggml_build_forward_expand(gf, mctx_cur->cpy_k(ctx0, k_cur, is_swa ? inp->get_k_idxs_swa() : inp->get_k_idxs(), il));
    ggml_build_forward_expand(gf, mctx_cur->cpy_v(ctx0, v_cur, is_swa ? inp->get_v_idxs_swa() : inp->get_v_idxs(), il));
}

ggml_tensor * llm_graph_context::build_ridgefill_outputs(ggml_tensor * inpL, ggml_tensor * inp_out_ids, int il) const {
    if (il != n_layer - 1 || !inp_out_ids) {
        return inpL;
    }
    return ggml_get_rows(ctx0, inpL, inp_out_ids);
}

int32_t llama_ridgefill_reusable_prefix(int32_t n_common, int32_t cached_begin, int32_t cached_end,
                                        int32_t new_begin, int32_t new_end) {
    if (cached_begin >= cached_end || n_common <= cached_begin) {
        return n_common;  // the reused prefix holds exact cells only
    }
    const bool same_begin = new_begin < new_end && new_begin == cached_begin;
    if (n_common <= cached_end ? (same_begin && new_end >= n_common) : (same_begin && new_end == cached_end)) {
        return n_common;  // filled exactly as this request would fill it
    }
    return cached_begin;  // keep the exact rows before the approximate ones
}

// ---- C API ------------------------------------------------------------------------------------

static thread_local std::string g_last_error;

static int32_t fail(const std::string & msg) {
    g_last_error = msg;
    LLAMA_LOG_ERROR("ridgefill: %s\n", msg.c_str());
    return -1;
}

const char * llama_ridgefill_last_error(void) { return g_last_error.c_str(); }

static ridgefill_context & state(llama_context * ctx) {
    if (!ctx->ridgefill) {
        ctx->ridgefill = std::make_shared<ridgefill_context>();
    }
    return *ctx->ridgefill;
}

int32_t llama_ridgefill_load_maps(llama_context * ctx, const char * maps_path, const char * model_path) {
    try {
        const llama_model & model = ctx->get_model();
        const std::string arch = llm_arch_name(model.arch);
        if (arch != "llama" && arch != "qwen3" && arch != "gemma3") {
            return fail("architecture " + arch + " does not support RidgeFill yet (supported: llama, qwen3, gemma3)");
        }
        const auto & cp = ctx->get_cparams();
        if (!cp.kv_unified && cp.n_seq_max > 1) {
            return fail("RidgeFill needs a unified KV cache when n_seq_max > 1 (llama-server's default; -kvu)");
        }
        state(ctx).maps = ridgefill_maps_load(model, maps_path, model_path ? model_path : maps_path);
        LLAMA_LOG_INFO("ridgefill: loaded maps for split layer %d from %s (%.1f MiB)\n", state(ctx).maps->split_layer,
                       maps_path, state(ctx).maps->n_bytes / 1048576.0);
        return 0;
    } catch (const std::exception & e) {
        return fail(e.what());
    }
}

int32_t llama_ridgefill_set_enabled(llama_context * ctx, bool enabled) {
    if (enabled && !state(ctx).maps) {
        return fail("no maps loaded (llama_ridgefill_load_maps)");
    }
    state(ctx).enabled = enabled;
    return 0;
}

int32_t llama_ridgefill_set_sink_tokens(llama_context * ctx, int32_t n) {
    if (n < 0) {
        return fail("sink_tokens must be >= 0");
    }
    state(ctx).sink_tokens = n;
    return 0;
}

int32_t llama_ridgefill_set_exact_from(llama_context * ctx, llama_seq_id seq_id, llama_pos pos) {
    if (seq_id < 0) {
        return fail("invalid seq_id");
    }
    if (pos < 0) {
        state(ctx).exact_from.erase(seq_id);
    } else {
        state(ctx).exact_from[seq_id] = pos;
    }
    return 0;
}

int32_t llama_ridgefill_split_layer(const llama_context * ctx) {
    return ctx->ridgefill && ctx->ridgefill->maps ? ctx->ridgefill->maps->split_layer : -1;
}

int64_t llama_ridgefill_maps_size(const llama_context * ctx) {
    return ctx->ridgefill && ctx->ridgefill->maps ? (int64_t) ctx->ridgefill->maps->n_bytes : 0;
}

void llama_ridgefill_get_counts(const llama_context * ctx, llama_seq_id seq_id, int64_t * n_approx, int64_t * n_exact) {
    *n_approx = *n_exact = 0;
    if (!ctx->ridgefill) {
        return;
    }
    const auto & rf = *ctx->ridgefill;
    if (auto it = rf.n_approx.find(seq_id); it != rf.n_approx.end()) *n_approx = it->second;
    if (auto it = rf.n_exact.find(seq_id);  it != rf.n_exact.end())  *n_exact  = it->second;
}

void llama_ridgefill_reset_counts(llama_context * ctx, llama_seq_id seq_id) {
    if (ctx->ridgefill) {
        ctx->ridgefill->n_approx.erase(seq_id);
        ctx->ridgefill->n_exact.erase(seq_id);
    }
}
