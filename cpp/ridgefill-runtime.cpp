// RidgeFill at run time: the C API, the per-token path decision and the graph's helpers.
#include "ridgefill.h"
#include "ridgefill-internal.h"

#include "llama-batch.h"
#include "llama-context.h"
#include "llama-graph.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"
#include "llama-model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

// ---- the path of a token ---------------------------------------------------------------------

bool ridgefill_token_is_approx(const ridgefill_context & rf, llama_seq_id seq_id, int32_t n_seq_id,
                               llama_pos pos, bool output, bool context_known) {
    if (!rf.enabled || !rf.maps || n_seq_id != 1 || output) {
        return false;  // shared tokens and tokens whose logits are wanted stay exact
    }
    if (!context_known) {
        return false;  // the maps need the exact states of its predecessors, and they are not at hand
    }
    const auto it = rf.exact_from.find(seq_id);
    if (it == rf.exact_from.end()) {
        return false;  // no tail declared for this sequence: exact
    }
    return pos >= rf.sink() && pos < it->second;
}

bool ridgefill_context::guard_active(llama_seq_id seq) const {
    if (!maps || maps->guard_window <= 0 || splice != ridgefill_splice::none) {
        return false;  // maps without the guard's data, or a splice debug run
    }
    const auto it = guard_seq_on.find(seq);
    return it != guard_seq_on.end() ? it->second : guard_on;
}

// the guard's checks of a prompt: windows of guard_window positions at origin + k·period (k = 0: the probe)
static int32_t guard_window_of(const ridgefill_context & rf, const ridgefill_guard_seq & g, llama_pos pos) {
    const int32_t w = rf.maps->guard_window, period = rf.guard_period;
    if (g.origin < 0 || pos < g.origin) {
        return -1;
    }
    const llama_pos off = pos - g.origin;
    if (off < w) {
        return 0;
    }
    return period > 0 && off % period < w ? (int32_t) (off / period) : -1;
}

void ridgefill_mark_batch(ridgefill_context * rf, llama_batch_allocr & balloc) {
    if (rf) {
        rf->pred.clear();  // captured map outputs are those of the last decode
        rf->canary.clear();
    }
    if (!rf || !rf->enabled || !rf->maps) {
        return;
    }
    const llama_batch & b = balloc.get_batch();
    std::vector<uint8_t> approx(b.n_tokens, 0);
    bool any = false;
    // context features: a token's predecessors are known when an earlier token of this batch is one (it is
    // computed first) or the carry holds its state
    const int C = rf->maps->context_tokens;
    std::set<std::pair<llama_seq_id, llama_pos>> earlier;
    for (int32_t i = 0; i < b.n_tokens; ++i) {
        const llama_seq_id seq = b.seq_id[i][0];
        bool known = true;
        for (int j = 1; j <= C && known; ++j) {
            const auto c = rf->carry.find(seq);
            known = earlier.count({seq, b.pos[i] - j}) || (c != rf->carry.end() && c->second.count(b.pos[i] - j));
        }
        approx[i] = ridgefill_token_is_approx(*rf, seq, b.n_seq_id[i], b.pos[i], b.logits && b.logits[i], known);
        // the guard: a token it would fill is a canary row (exact, checked) inside a check window; after a
        // fallback it is exact.  Tokens after a check stay marked: the check's verdict is known when their ubatch
        // runs (ridgefill_ubatch_approx).
        if (approx[i] && rf->guard_active(seq)) {
            ridgefill_guard_seq & g = rf->guard[seq];
            if (g.origin < 0) {
                g.origin = b.pos[i];
            }
            if (g.verdict == 2) {
                approx[i] = 0;
            } else if (guard_window_of(*rf, g, b.pos[i]) >= 0) {
                approx[i] = 0;
                rf->canary.insert({seq, b.pos[i]});
            }
        }
        any |= approx[i] != 0;
        for (int32_t k = 0; C > 0 && k < b.n_seq_id[i]; ++k) {
            earlier.insert({b.seq_id[i][k], b.pos[i]});
        }
    }
    if (any) {
        balloc.ridgefill_approx = std::move(approx);
    }
}

bool ridgefill_ubatch_approx(const ridgefill_context * rf, const llama_ubatch & ubatch) {
    if (!rf || !ubatch.ridgefill_approx) {
        return false;
    }
    for (uint32_t i = 0; i < ubatch.n_tokens; ++i) {
        const llama_seq_id seq = ubatch.seq_id[i][0];
        if (rf->guard_active(seq)) {
            const auto g = rf->guard.find(seq);
            if (g == rf->guard.end() || g->second.verdict != 1) {
                return false;  // fell back, or (cannot happen: the probe comes first) not checked yet
            }
        }
    }
    return true;
}

// the rows of a ubatch that are canaries of the guard (in row order)
static std::vector<int32_t> canary_rows(const ridgefill_context & rf, const llama_ubatch & ub) {
    std::vector<int32_t> rows;
    for (uint32_t i = 0; !rf.canary.empty() && i < ub.n_tokens; ++i) {
        if (ub.n_seq_id[i] == 1 && rf.canary.count({ub.seq_id[i][0], ub.pos[i]})) {
            rows.push_back((int32_t) i);
        }
    }
    return rows;
}

ridgefill_graph ridgefill_graph_for(const ridgefill_context * rf, const llama_ubatch & ubatch) {
    if (!rf || !rf->maps) {
        return {};
    }
    ridgefill_graph g;
    if (rf->maps->context_tokens > 0) {  // every graph keeps the states later tokens' features need
        g.context_tokens = rf->maps->context_tokens;
        g.carry_rf       = rf;
        g.split_layer    = rf->maps->split_layer;
        g.maps_generation = rf->maps->generation;
    }
    if (!ridgefill_ubatch_approx(rf, ubatch)) {
        g.n_canary = (int32_t) canary_rows(*rf, ubatch).size();
        if (g.n_canary > 0) {  // the guard's check: this exact graph also predicts its canary rows
            g.canary_maps     = rf->maps.get();
            g.carry_rf        = rf;
            g.split_layer     = rf->maps->split_layer;
            g.maps_generation = rf->maps->generation;
        }
        return g;
    }
    g.maps        = rf->maps.get();
    g.maps_generation = rf->maps->generation;
    g.split_layer = rf->maps->split_layer;
    g.record_pred = rf->capture_pred;
    if (rf->band() > 0) {
        g.band_layers = rf->band();
        g.band_window = rf->window();
        g.band_sink   = rf->sink();
        g.band_full   = rf->band_full();
    }
    if (rf->splice == ridgefill_splice::none) {
        return g;
    }
    // splice passes (ridgefill_n_passes): 0 exact, 1 fill from exact inputs, 2 fill from predicted inputs
    using S = ridgefill_splice;
    const S m = rf->splice;
    g.rf = rf;
    if (rf->pass == 0) {
        g.maps       = nullptr;  // the exact graph, keeping its late layer inputs
        g.record_inp = true;
    } else if (rf->pass == 1) {
        g.exact_inp   = true;
        g.store_k     = m == S::k || m == S::kv;
        g.store_v     = m == S::v || m == S::kv;
        g.record_norm = m == S::kscale;
    } else {
        g.store_k   = m == S::v || m == S::kscale;
        g.store_v   = m == S::k || m == S::kscale;
        g.rescale_k = m == S::kscale;
    }
    return g;
}

void ridgefill_count(ridgefill_context * rf, const llama_ubatch & ubatch) {
    if (!rf) {
        return;
    }
    const bool approx = ridgefill_ubatch_approx(rf, ubatch);
    auto & counts = approx ? rf->n_approx : rf->n_exact;
    for (uint32_t i = 0; i < ubatch.n_tokens; ++i) {
        counts[ubatch.seq_id[i][0]] += 1;
        if (approx) {
            std::vector<int32_t> & r = rf->filled[ubatch.seq_id[i][0]];
            const int32_t pos = ubatch.pos[i];
            if (!r.empty() && r.back() == pos) {
                r.back() = pos + 1;
            } else {
                r.push_back(pos);
                r.push_back(pos + 1);
            }
        }
    }
}

// ---- splice passes ----------------------------------------------------------------------------
//
// With a splice mode on, an approximate ubatch runs as (ggml-patches/0011):
//   pass 0  the exact graph; its late layer inputs are copied to the host;
//   pass 1  the fill-only graph on those exact inputs: stores exact K (k, kv) and/or V (v, kv), or
//           only reports the exact per-head K norms (kscale);
//   pass 2  the fill-only graph on the predicted inputs: stores what pass 1 left (not run for kv),
//           K rescaled to the recorded norms for kscale.
// All passes write the cells chosen once for the ubatch.  Pass 0 attends to the cache as earlier
// ubatches left it, so with k, v or kscale its exact inputs are exact only for the first
// approximate ubatch: the eval harness puts the whole filled region in one ubatch.

int ridgefill_n_passes(const ridgefill_context * rf, const llama_ubatch & ubatch) {
    if (!rf || !rf->maps || rf->splice == ridgefill_splice::none || !ridgefill_ubatch_approx(rf, ubatch)) {
        return 1;
    }
    return rf->splice == ridgefill_splice::kv ? 2 : 3;
}

void ridgefill_begin_pass(ridgefill_context * rf, int pass) {
    if (rf) {
        rf->pass = pass;
    }
}

// A recorded tensor is a copy made for the purpose: a new node, so the graph allocator plans this graph
// afresh (it reuses the last plan for a graph with as many nodes, whose buffers may overlap an output).
static ggml_tensor * record(const llm_graph_context & g, ggml_tensor * t, const char * name, int il) {
    ggml_tensor * rec = ggml_cont(g.ctx0, t);
    ggml_format_name(rec, "%s-%d", name, il);
    ggml_set_output(rec);
    ggml_build_forward_expand(g.gf, rec);
    return rec;
}

static ggml_tensor * graph_output(const llm_graph_result * res, const char * name, int il) {
    const std::string full = std::string(name) + "-" + std::to_string(il);
    return ggml_graph_get_tensor(res->get_gf(), full.c_str());
}

static void read_output(ggml_tensor * t, std::vector<float> & dst) {
    GGML_ASSERT(t && t->type == GGML_TYPE_F32 && ggml_is_contiguous(t));
    dst.resize(ggml_nelements(t));
    ggml_backend_tensor_get(t, dst.data(), 0, ggml_nbytes(t));
}

// ---- context features ---------------------------------------------------------------------------
//
// Maps with context_tokens C > 0 take f = [h_t, h_{t-1}, .., h_{t-C}]: the split layer's input for the token
// and its C predecessors in the same sequence.  Layers below the split are exact on every path, so those
// states are exact wherever they were computed.  Inside a ubatch they are rows of h; across ubatches (and
// decodes) every graph copies out each sequence's last C rows of h and the context keeps them (`carry`), keyed
// by position.  A token whose predecessors are neither earlier in its batch nor carried is computed exactly
// (ridgefill_mark_batch), so a filled token never sees an approximate or missing predecessor.

namespace {

struct carry_row { int32_t row; llama_seq_id seq; llama_pos pos; };

// the rows of a ubatch kept for later ubatches: each sequence's last C positions, by sequence then position
std::vector<carry_row> carry_rows(const llama_ubatch & ub, int C) {
    std::map<llama_seq_id, std::vector<std::pair<llama_pos, int32_t>>> by_seq;
    for (uint32_t i = 0; i < ub.n_tokens; ++i) {
        for (int32_t k = 0; k < ub.n_seq_id[i]; ++k) {
            by_seq[ub.seq_id[i][k]].push_back({ub.pos[i], (int32_t) i});
        }
    }
    std::vector<carry_row> out;
    for (auto & [seq, rows] : by_seq) {
        std::sort(rows.begin(), rows.end());
        for (size_t k = rows.size() > (size_t) C ? rows.size() - C : 0; k < rows.size(); ++k) {
            out.push_back({rows[k].second, seq, rows[k].first});
        }
    }
    return out;
}

// where each token's j-th predecessor is: prev[(j-1)·n + i] indexes the rows of [h, carried], carried
// listing the (seq, pos) states the ubatch takes from the carry
struct context_plan {
    std::vector<int32_t> prev;
    std::vector<std::pair<llama_seq_id, llama_pos>> carried;
};

context_plan plan_context(const llama_ubatch & ub, int C, const std::vector<int32_t> & rows) {
    const int32_t n = (int32_t) ub.n_tokens, n_rows = (int32_t) rows.size();
    std::map<std::pair<llama_seq_id, llama_pos>, int32_t> row_of;
    for (int32_t i = 0; i < n; ++i) {
        row_of[{ub.seq_id[i][0], ub.pos[i]}] = i;  // approximate tokens belong to one sequence
    }
    context_plan plan;
    plan.prev.resize((size_t) C * n_rows);
    for (int j = 1; j <= C; ++j) {
        for (int32_t r = 0; r < n_rows; ++r) {
            const int32_t i = rows[r];
            const std::pair<llama_seq_id, llama_pos> key = {ub.seq_id[i][0], ub.pos[i] - j};
            auto it = row_of.find(key);
            if (it == row_of.end()) {
                it = row_of.emplace(key, n + (int32_t) plan.carried.size()).first;
                plan.carried.push_back(key);
            }
            plan.prev[(size_t) (j - 1) * n_rows + r] = it->second;
        }
    }
    return plan;
}

// the graph inputs of the map features: which rows of h to keep (context features), which rows are the guard's
// canaries (exact graphs checking them), and the predecessor indices and carried states of the feature rows
class context_input : public llm_graph_input_i {
public:
    context_input(const ridgefill_context * rf, int C, bool canary) : rf(rf), C(C), canary(canary) {}

    // the rows whose features the graph builds: every row (approximate graphs) or the canary rows
    std::vector<int32_t> feature_rows(const llama_ubatch & ub) const {
        if (canary) {
            return canary_rows(*rf, ub);
        }
        std::vector<int32_t> rows(ub.n_tokens);
        for (uint32_t i = 0; i < ub.n_tokens; ++i) {
            rows[i] = (int32_t) i;
        }
        return rows;
    }

    void set_input(const llama_ubatch * ub) override {
        if (keep_idx) {
            std::vector<int32_t> keep;
            for (const carry_row & r : carry_rows(*ub, C)) {
                keep.push_back(r.row);
            }
            GGML_ASSERT(keep.size() == n_keep);
            ggml_backend_tensor_set(keep_idx, keep.data(), 0, ggml_nbytes(keep_idx));
        }
        const std::vector<int32_t> rows = feature_rows(*ub);
        if (canary_idx) {
            GGML_ASSERT((int64_t) rows.size() == canary_idx->ne[0]);
            ggml_backend_tensor_set(canary_idx, rows.data(), 0, ggml_nbytes(canary_idx));
        }
        if (!prev_idx) {
            return;
        }
        const context_plan plan = plan_context(*ub, C, rows);
        GGML_ASSERT(plan.carried.size() == n_carried);
        ggml_backend_tensor_set(prev_idx, plan.prev.data(), 0, ggml_nbytes(prev_idx));
        const int64_t d = carried->ne[0];
        std::vector<float> data(ggml_nelements(carried), 0.0f);
        for (size_t k = 0; k < plan.carried.size(); ++k) {
            const auto [seq, pos] = plan.carried[k];
            const std::vector<float> * state = nullptr;
            if (const auto c = rf->carry.find(seq); c != rf->carry.end()) {
                if (const auto r = c->second.find(pos); r != c->second.end()) {
                    state = &r->second;
                }
            }
            if (!state || (int64_t) state->size() != d) {
                GGML_ABORT("ridgefill: the state of seq %d pos %d is not carried (path decision and carry disagree)",
                           seq, pos);
            }
            std::copy(state->begin(), state->end(), data.begin() + k * d);
        }
        ggml_backend_tensor_set(carried, data.data(), 0, ggml_nbytes(carried));
    }

    bool can_reuse(const llm_graph_params & params) override {
        const llama_ubatch & ub = params.ubatch;
        if (C > 0 && carry_rows(ub, C).size() != n_keep) {
            return false;
        }
        if (canary_idx && (int64_t) canary_rows(*rf, ub).size() != canary_idx->ne[0]) {
            return false;
        }
        return !prev_idx || plan_context(ub, C, feature_rows(ub)).carried.size() == n_carried;
    }

    const ridgefill_context * rf;
    const int C;
    const bool canary;
    ggml_tensor * keep_idx   = nullptr;  // I32 [n_keep]
    ggml_tensor * canary_idx = nullptr;  // I32 [n_canary]
    ggml_tensor * prev_idx   = nullptr;  // I32 [n_rows·C]
    ggml_tensor * carried    = nullptr;  // F32 [d, max(1, n_carried)]
    size_t n_keep = 0, n_carried = 0;
};

// keeps the split-layer states a processed ubatch copied out
void store_carry(ridgefill_context & rf, const llama_ubatch & ub, ggml_tensor * t) {
    const int C = rf.maps->context_tokens;
    const std::vector<carry_row> rows = carry_rows(ub, C);
    std::vector<float> data;
    read_output(t, data);
    const int64_t d = t->ne[0];
    GGML_ASSERT((size_t) t->ne[1] == rows.size());
    std::map<llama_seq_id, llama_pos> first;  // a decode rewrites a sequence from its first position here on
    for (uint32_t i = 0; i < ub.n_tokens; ++i) {
        for (int32_t k = 0; k < ub.n_seq_id[i]; ++k) {
            auto [it, fresh] = first.emplace(ub.seq_id[i][k], ub.pos[i]);
            it->second = std::min(it->second, ub.pos[i]);
        }
    }
    for (const auto & [seq, p0] : first) {
        auto & m = rf.carry[seq];
        m.erase(m.lower_bound(p0), m.end());
    }
    for (size_t k = 0; k < rows.size(); ++k) {
        rf.carry[rows[k].seq][rows[k].pos].assign(data.begin() + k * d, data.begin() + (k + 1) * d);
    }
    for (const auto & [seq, p0] : first) {
        auto & m = rf.carry[seq];
        while (m.size() > (size_t) C) {
            m.erase(m.begin());
        }
    }
}

std::mutex g_memory_mutex;
std::map<const void *, ridgefill_context *> g_memory_owner;  // a context's memory -> its RidgeFill state

} // namespace

std::vector<int32_t> ridgefill_context::band_full() const {
    const std::vector<int32_t> & all =
        band_full_set || !maps ? band_full_layers : maps->band_full_layers;
    std::vector<int32_t> in;
    const int32_t split = maps ? maps->split_layer : 0;
    for (int32_t il : all) {
        if (il >= split - band() && il < split) {
            in.push_back(il);
        }
    }
    return in;
}

ridgefill_context::~ridgefill_context() {
    std::lock_guard<std::mutex> lock(g_memory_mutex);
    auto it = g_memory_owner.find(memory);
    if (it != g_memory_owner.end() && it->second == this) {
        g_memory_owner.erase(it);
    }
}

void ridgefill_memory_changed(const void * memory, llama_seq_id seq, llama_pos p0, llama_pos p1, bool keep_only) {
    std::lock_guard<std::mutex> lock(g_memory_mutex);
    auto it = memory ? g_memory_owner.find(memory) : g_memory_owner.end();
    if (it == g_memory_owner.end()) {
        return;
    }
    auto & carry = it->second->carry;
    for (auto c = carry.begin(); c != carry.end();) {
        if (keep_only) {
            c = c->first == seq ? std::next(c) : carry.erase(c);
            continue;
        }
        if (seq < 0 || c->first == seq) {
            const llama_pos lo = std::max<llama_pos>(p0, 0);
            const llama_pos hi = p1 < 0 ? std::numeric_limits<llama_pos>::max() : p1;
            c->second.erase(c->second.lower_bound(lo), c->second.lower_bound(hi));
        }
        ++c;
    }
}

// ---- the guard's verdict ----------------------------------------------------------------------------
//
// After each check the prompt's score is the mean, over late layers (and for kv maps over K and V), of a relative
// squared error sum|y_hat - y|^2 / sum|y|^2 divided by the same error on the calibration's held-out text
// (ridgefill.guard.layer_error): about 1 on text like the calibration text.  The error is that of pooled canary
// rows, the larger of two pools: all of the prompt's so far (the probe's and every check's since: its noise shrinks
// as checks add up, where each single check would be one more noisy draw against the threshold) and those of the
// last two checks (so a register change late in a long prompt is not diluted by everything before it).  Above
// ridgefill.guard.threshold (or not finite) the rest of the prompt is computed exactly; cells filled before a later
// check failed stay.

static float guard_score(const ridgefill_maps & m, const std::vector<double> & num, const std::vector<double> & den) {
    double sum = 0.0;
    int n = 0;
    for (size_t k = 0; k < num.size(); ++k) {
        if (den[k] > 0.0 && m.guard_error[k] > 0.0f) {
            sum += num[k] / den[k] / m.guard_error[k];
            ++n;
        }
    }
    return n > 0 ? (float) (sum / n) : NAN;
}

static void guard_decide(ridgefill_context & rf, llama_seq_id seq, ridgefill_guard_seq & g, llama_pos next) {
    const ridgefill_maps & m = *rf.maps;
    std::vector<double> num = g.cur_num, den = g.cur_den;   // the last two checks' rows
    for (size_t k = 0; k < num.size() && !g.prev_num.empty(); ++k) {
        num[k] += g.prev_num[k];
        den[k] += g.prev_den[k];
    }
    const float all = guard_score(m, g.num, g.den), recent = guard_score(m, num, den);
    const float score = std::isnan(all) || std::isnan(recent) ? NAN : std::max(all, recent);
    g.prev_num = g.cur_num;
    g.prev_den = g.cur_den;
    g.n_checks += 1;
    g.score     = score;
    g.max_score = g.n_checks == 1 || !(score <= g.max_score) ? score : g.max_score;
    g.rows      = 0;
    g.window    = -1;
    if (!(score <= m.guard_threshold)) {
        if (g.verdict != 2) {
            g.verdict      = 2;
            g.fell_back_at = next;
            LLAMA_LOG_INFO("ridgefill: guard: seq %d falls back to exact prefill from position %d (check %d: score "
                           "%.2f > threshold %.2f)\n", seq, next, g.n_checks, score, m.guard_threshold);
        }
    } else if (g.verdict == 0) {
        g.verdict = 1;
    }
}

static void guard_check(ridgefill_context & rf, const llama_ubatch & ub, const llm_graph_result * res) {
    const ridgefill_maps & m = *rf.maps;
    const int s = m.split_layer, L = m.n_layer - s - 1, P = m.guard_parts();
    const std::vector<int32_t> rows = canary_rows(rf, ub);
    std::vector<std::vector<float>> sums(L);  // per late layer: [n_canary][num, den per part]
    for (int i = 0; i < L; ++i) {
        read_output(graph_output(res, "ridgefill_guard", s + 1 + i), sums[i]);
        GGML_ASSERT(sums[i].size() == rows.size() * 2 * P);
    }
    for (size_t r = 0; r < rows.size(); ++r) {
        const llama_seq_id seq = ub.seq_id[rows[r]][0];
        const llama_pos pos = ub.pos[rows[r]];
        ridgefill_guard_seq & g = rf.guard[seq];
        if (g.verdict == 2 && g.window < 0) {
            continue;  // canary rows marked before the fallback in the same batch: exact anyway, not checked
        }
        const int32_t w = guard_window_of(rf, g, pos);
        if (w != g.window) {
            if (g.rows > 0) {
                guard_decide(rf, seq, g, pos);  // an earlier check left unfinished
            }
            g.window = w;
            g.rows   = 0;
            if (g.num.empty()) {  // the prompt's first check; later ones add their rows to the same sums
                g.num.assign((size_t) L * P, 0.0);
                g.den.assign((size_t) L * P, 0.0);
            }
            g.cur_num.assign((size_t) L * P, 0.0);
            g.cur_den.assign((size_t) L * P, 0.0);
        }
        for (int i = 0; i < L; ++i) {
            for (int p = 0; p < P; ++p) {
                const double e = sums[i][r * 2 * P + 2 * p], y = sums[i][r * 2 * P + 2 * p + 1];
                g.num[i * P + p] += e;
                g.den[i * P + p] += y;
                g.cur_num[i * P + p] += e;
                g.cur_den[i * P + p] += y;
            }
        }
        g.rows += 1;
        // decide at the check's last row, or at the last row before the exact tail
        const llama_pos end = g.origin + (llama_pos) w * rf.guard_period + m.guard_window;
        const auto tail = rf.exact_from.find(seq);
        if (pos + 1 >= end || (tail != rf.exact_from.end() && pos + 1 >= tail->second)) {
            guard_decide(rf, seq, g, pos + 1);
        }
    }
}

void ridgefill_end_pass(ridgefill_context * rf, const llama_ubatch & ubatch, const llm_graph_result * res,
                        ggml_backend_sched_t sched) {
    if (!rf || !rf->maps) {
        return;
    }
    const int s = rf->maps->split_layer, n_layer = rf->maps->n_layer;
    ggml_tensor * carry = rf->maps->context_tokens > 0 ? graph_output(res, "ridgefill_carry", s) : nullptr;
    const bool pred   = rf->capture_pred && ridgefill_ubatch_approx(rf, ubatch);
    const bool guard  = graph_output(res, "ridgefill_guard", s + 1) != nullptr;
    const bool splice = ridgefill_n_passes(rf, ubatch) > 1 && rf->pass <= 1;
    if (!carry && !pred && !splice && !guard) {
        return;
    }
    ggml_backend_sched_synchronize(sched);
    if (carry) {
        store_carry(*rf, ubatch, carry);
    }
    if (guard) {
        guard_check(*rf, ubatch, res);
    }
    if (pred) {
        rf->pred.resize(n_layer);
        std::vector<float> rows;
        for (int il = s + 1; il < n_layer; ++il) {
            if (ggml_tensor * t = graph_output(res, "ridgefill_rec_pred", il)) {
                read_output(t, rows);
                rf->pred[il].insert(rf->pred[il].end(), rows.begin(), rows.end());
            }
        }
    }
    if (!splice) {
        return;
    }
    if (rf->pass == 0) {
        rf->exact_inp.resize(n_layer);
        for (int il = s + 1; il < n_layer; ++il) {
            read_output(graph_output(res, "ridgefill_rec_inp", il), rf->exact_inp[il]);
        }
    } else if (rf->splice == ridgefill_splice::kscale) {
        rf->exact_knorm.resize(n_layer);
        for (int il = s; il < n_layer; ++il) {
            read_output(graph_output(res, "ridgefill_rec_knorm", il), rf->exact_knorm[il]);
        }
    }
}

// a graph input filled from host memory recorded by an earlier pass
class ridgefill_host_input : public llm_graph_input_i {
public:
    ridgefill_host_input(ggml_tensor * t, const std::vector<float> & src) : t(t), src(src) {}
    void set_input(const llama_ubatch * /*ubatch*/) override {
        GGML_ASSERT(src.size() == (size_t) ggml_nelements(t) && "splice pass recorded another ubatch");
        ggml_backend_tensor_set(t, src.data(), 0, ggml_nbytes(t));
    }
private:
    ggml_tensor * t;
    const std::vector<float> & src;
};

static ggml_tensor * host_input(const llm_graph_context & g, const std::vector<float> & src, int64_t ne0,
                                int64_t ne1, int64_t ne2, const char * name, int il) {
    ggml_tensor * t = ggml_new_tensor_3d(g.ctx0, GGML_TYPE_F32, ne0, ne1, ne2);
    ggml_set_input(t);
    ggml_format_name(t, "%s-%d", name, il);
    g.res->add_input(std::make_unique<ridgefill_host_input>(t, src));
    return t;
}

static ggml_tensor * head_norms(ggml_context * ctx, ggml_tensor * k) {  // k: [head_dim, n_head, n_tokens]
    return ggml_sqrt(ctx, ggml_sum_rows(ctx, ggml_sqr(ctx, k)));
}

// What a fill-only layer writes in a splice pass: K and V as given, rescaled, or nothing (nullptr).
static void splice_kv(const llm_graph_context & g, ggml_tensor *& k, ggml_tensor *& v, int il) {
    const ridgefill_graph & rg = g.ridgefill;
    if (rg.record_norm) {
        record(g, head_norms(g.ctx0, k), "ridgefill_rec_knorm", il);
    }
    if (rg.rescale_k) {
        ggml_tensor * target = host_input(g, rg.rf->exact_knorm[il], 1, k->ne[1], k->ne[2], "ridgefill_exact_knorm", il);
        ggml_tensor * own    = ggml_clamp(g.ctx0, head_norms(g.ctx0, k), 1e-20f, 1e30f);
        k = ggml_mul(g.ctx0, k, ggml_div(g.ctx0, target, own));
    }
    k = rg.store_k ? k : nullptr;
    v = rg.store_v ? v : nullptr;
}

// The guard's check on the canary rows of an exact graph: per row, |y_hat - y|^2 and |y|^2 (ne = {2, n_canary}).
static ggml_tensor * guard_sums(ggml_context * ctx, ggml_tensor * y_hat, ggml_tensor * y) {
    ggml_tensor * num = ggml_sum_rows(ctx, ggml_sqr(ctx, ggml_sub(ctx, y_hat, y)));
    ggml_tensor * den = ggml_sum_rows(ctx, ggml_sqr(ctx, y));
    return ggml_concat(ctx, num, den, 0);
}

static ggml_tensor * canary_idx(const llm_graph_context & g) {
    ggml_tensor * idx = ggml_get_tensor(g.ctx0, "ridgefill_canary_idx");
    GGML_ASSERT(idx && "ridgefill: canary rows without their index (build_ridgefill_context not run)");
    return idx;
}

// ---- graph helpers (declared on llm_graph_context by ggml-patches/0006) ----------------------------

ggml_tensor * llm_graph_context::build_ridgefill_input(ggml_tensor * inpL, int il) const {
    if (il == ridgefill.split_layer) {  // inpL is h here: the maps' features, built once per graph
        ridgefill_feat = ridgefill.context_tokens > 0 || ridgefill.n_canary > 0 ? build_ridgefill_context(inpL) : inpL;
    }
    if (!ridgefill.approx() && ridgefill.n_canary > 0 && il > ridgefill.split_layer &&
        ridgefill.canary_maps->kind == ridgefill_map_kind::input) {  // the guard: predicted vs exact input
        ggml_tensor * x_hat = ridgefill_map_apply(ctx0, *ridgefill.canary_maps, il, ridgefill_feat);
        record(*this, guard_sums(ctx0, x_hat, ggml_get_rows(ctx0, inpL, canary_idx(*this))), "ridgefill_guard", il);
        return inpL;
    }
    if (ridgefill.record_inp && il > ridgefill.split_layer) {
        record(*this, inpL, "ridgefill_rec_inp", il);  // splice pass 0: the exact input of a late layer
        return inpL;
    }
    if (!ridgefill.approx() || il <= ridgefill.split_layer) {
        return inpL;  // exact path, or the split layer itself (its input is h)
    }
    if (ridgefill.exact_inp) {  // splice pass 1: the exact input recorded by pass 0
        return host_input(*this, ridgefill.rf->exact_inp[il], hparams.n_embd, n_tokens, 1, "ridgefill_exact_inp", il);
    }
    if (ridgefill.maps->kind != ridgefill_map_kind::input) {
        return inpL;  // kv maps replace K/V instead (build_ridgefill_kv); the layer's norm and projections go unused
    }
    ggml_tensor * x = ridgefill_map_apply(ctx0, *ridgefill.maps, il, ridgefill_feat);
    if (ridgefill.record_pred) {
        record(*this, x, "ridgefill_rec_pred", il);
    }
    cb(x, "ridgefill_inp", il);
    return x;
}

// At the split layer (graphs with context features, or checking the guard's canary rows): copies out each
// sequence's last C rows of h (kept by ridgefill_end_pass) and returns the maps' features f = [h, h_{-1}, ..,
// h_{-C}] of every row (approximate graphs), of the canary rows (exact graphs checking them), or nullptr.
ggml_tensor * llm_graph_context::build_ridgefill_context(ggml_tensor * h) const {
    const int C = ridgefill.context_tokens;
    const bool canary = !ridgefill.approx() && ridgefill.n_canary > 0;
    auto inp = std::make_unique<context_input>(ridgefill.carry_rf, C, canary);
    if (C > 0) {
        inp->n_keep = carry_rows(ubatch, C).size();
    }
    if (inp->n_keep > 0) {  // none in the graphs measured at reserve time (tokens of no sequence)
        inp->keep_idx = ggml_new_tensor_1d(ctx0, GGML_TYPE_I32, (int64_t) inp->n_keep);
        ggml_set_input(inp->keep_idx);
        record(*this, ggml_get_rows(ctx0, h, inp->keep_idx), "ridgefill_carry", ridgefill.split_layer);
    }
    ggml_tensor * f = nullptr;
    if (ridgefill.approx() || canary) {
        int64_t n_rows = n_tokens;
        f = h;
        if (canary) {
            inp->canary_idx = ggml_new_tensor_1d(ctx0, GGML_TYPE_I32, ridgefill.n_canary);
            ggml_set_input(inp->canary_idx);
            ggml_set_name(inp->canary_idx, "ridgefill_canary_idx");  // the late layers gather their rows too
            f = ggml_get_rows(ctx0, h, inp->canary_idx);
            n_rows = ridgefill.n_canary;
        }
        if (C > 0) {
            inp->n_carried = plan_context(ubatch, C, inp->feature_rows(ubatch)).carried.size();
            inp->prev_idx  = ggml_new_tensor_1d(ctx0, GGML_TYPE_I32, n_rows * C);
            inp->carried   = ggml_new_tensor_2d(ctx0, GGML_TYPE_F32, h->ne[0], std::max<int64_t>(1, inp->n_carried));
            ggml_set_input(inp->prev_idx);
            ggml_set_input(inp->carried);
            ggml_tensor * rows = ggml_concat(ctx0, h, inp->carried, 1);  // [d, n_tokens + carried]
            for (int j = 1; j <= C; ++j) {
                ggml_tensor * idx = ggml_view_1d(ctx0, inp->prev_idx, n_rows, (j - 1) * n_rows * sizeof(int32_t));
                f = ggml_concat(ctx0, f, ggml_get_rows(ctx0, rows, idx), 0);
            }
        }
        cb(f, "ridgefill_features", ridgefill.split_layer);
    }
    res->add_input(std::move(inp));
    return f;
}

void llm_graph_context::build_ridgefill_kv(ggml_tensor *& k_cur, ggml_tensor *& v_cur, int il) const {
    if (!ridgefill.approx() && ridgefill.n_canary > 0 && il > ridgefill.split_layer &&
        ridgefill.canary_maps->kind == ridgefill_map_kind::kv) {  // the guard: predicted vs exact K and V
        const ridgefill_maps & maps = *ridgefill.canary_maps;
        ggml_tensor * idx = canary_idx(*this);
        const auto rows = [&](ggml_tensor * t, int64_t width) {
            t = ggml_is_contiguous(t) ? t : ggml_cont(ctx0, t);
            return ggml_get_rows(ctx0, ggml_reshape_2d(ctx0, t, width, n_tokens), idx);
        };
        ggml_tensor * y = ridgefill_map_apply(ctx0, maps, il, ridgefill_feat);  // [d_k + d_v, n_canary]
        const size_t es = ggml_element_size(y);
        ggml_tensor * k_hat = ggml_cont(ctx0, ggml_view_2d(ctx0, y, maps.d_k, y->ne[1], y->nb[1], 0));
        ggml_tensor * v_hat = ggml_cont(ctx0, ggml_view_2d(ctx0, y, maps.d_v, y->ne[1], y->nb[1], maps.d_k * es));
        record(*this, ggml_concat(ctx0, guard_sums(ctx0, k_hat, rows(k_cur, maps.d_k)),
                                  guard_sums(ctx0, v_hat, rows(v_cur, maps.d_v)), 0), "ridgefill_guard", il);
        return;
    }
    if (!ridgefill.approx() || il <= ridgefill.split_layer || ridgefill.exact_inp ||
        ridgefill.maps->kind != ridgefill_map_kind::kv) {
        return;  // exact path, the split layer, a splice pass on exact inputs, or input maps
    }
    const ridgefill_maps & maps = *ridgefill.maps;
    ggml_tensor * y = ridgefill_map_apply(ctx0, maps, il, ridgefill_feat);  // [d_k + d_v, n_tokens]
    if (ridgefill.record_pred) {
        record(*this, y, "ridgefill_rec_pred", il);
    }
    cb(y, "ridgefill_kv", il);
    const int64_t hd_k = hparams.n_embd_head_k(il), hd_v = hparams.n_embd_head_v(il);
    const size_t es = ggml_element_size(y);
    k_cur = ggml_view_3d(ctx0, y, hd_k, maps.d_k / hd_k, n_tokens, hd_k * es, y->nb[1], 0);
    v_cur = ggml_view_3d(ctx0, y, hd_v, maps.d_v / hd_v, n_tokens, hd_v * es, y->nb[1], maps.d_k * es);
}

// ---- the band's mask ---------------------------------------------------------------------------------
//
// A band layer of an approximate graph attends through its own mask: the causal mask of the ubatch over the cache,
// further limited to the sink positions and each row's band_window latest positions (upstream's standard sliding
// window with an exception for the sink, set_input_kq_mask_window in ggml-patches/0015).  One mask per graph,
// shared by the band's layers, filled beside the layer input's own mask from the same cache view.

namespace {

class band_mask_input : public llm_graph_input_i {
public:
    band_mask_input(ggml_tensor * mask, const llm_graph_input_attn_kv * inp, bool causal, int32_t window, int32_t sink)
        : mask(mask), inp(inp), causal(causal), window(window), sink(sink) {}

    void set_input(const llama_ubatch * ub) override {
        if (mask->buffer) {
            inp->mctx->set_input_kq_mask_window(mask, ub, causal, (uint32_t) window, sink);
        }
    }

    // the layer input's own can_reuse checks the shape both masks share; the band's settings are graph parameters
    bool can_reuse(const llm_graph_params & /*params*/) override { return ggml_are_same_shape(mask, inp->self_kq_mask); }

    ggml_tensor * mask;
    const llm_graph_input_attn_kv * inp;
    const bool causal;
    const int32_t window, sink;
};

} // namespace

ggml_tensor * llm_graph_context::build_ridgefill_kq_mask(llm_graph_input_attn_kv * inp, int il) const {
    if (!ridgefill.in_band(il)) {
        return inp->get_kq_mask();
    }
    ggml_tensor * mask = ggml_get_tensor(ctx0, "ridgefill_band_mask");
    if (!mask) {
        mask = ggml_dup_tensor(ctx0, inp->self_kq_mask);
        ggml_set_input(mask);
        ggml_set_name(mask, "ridgefill_band_mask");
        res->add_input(std::make_unique<band_mask_input>(mask, inp, cparams.causal_attn, ridgefill.band_window,
                                                         ridgefill.band_sink));
    }
    return mask;
}

bool llm_graph_context::ridgefill_fill_only(int il) const {
    return ridgefill.approx() && il >= ridgefill.split_layer;
}

void llm_graph_context::build_ridgefill_store(llm_graph_input_attn_kv * inp, ggml_tensor * k_cur,
                                              ggml_tensor * v_cur, int il) const {
    splice_kv(*this, k_cur, v_cur, il);
    if (k_cur) {
        if (inp->self_k_rot) {
            k_cur = llama_mul_mat_hadamard(ctx0, k_cur, inp->self_k_rot);
        }
        ggml_build_forward_expand(gf, inp->mctx->cpy_k(ctx0, k_cur, inp->get_k_idxs(), il));
    }
    if (v_cur) {
        if (inp->self_v_rot) {
            v_cur = llama_mul_mat_hadamard(ctx0, v_cur, inp->self_v_rot);
        }
        ggml_build_forward_expand(gf, inp->mctx->cpy_v(ctx0, v_cur, inp->get_v_idxs(), il));
    }
}

void llm_graph_context::build_ridgefill_store(llm_graph_input_attn_kv_iswa * inp, ggml_tensor * k_cur,
                                              ggml_tensor * v_cur, int il) const {
    splice_kv(*this, k_cur, v_cur, il);
    const bool is_swa = hparams.is_swa(il);
    const auto * mctx_cur = is_swa ? inp->mctx->get_swa() : inp->mctx->get_base();
    if (k_cur) {
        if (ggml_tensor * k_rot = is_swa ? inp->self_k_rot_swa : inp->self_k_rot) {
            k_cur = llama_mul_mat_hadamard(ctx0, k_cur, k_rot);
        }
        ggml_build_forward_expand(gf, mctx_cur->cpy_k(ctx0, k_cur, is_swa ? inp->get_k_idxs_swa() : inp->get_k_idxs(), il));
    }
    if (v_cur) {
        if (ggml_tensor * v_rot = is_swa ? inp->self_v_rot_swa : inp->self_v_rot) {
            v_cur = llama_mul_mat_hadamard(ctx0, v_cur, v_rot);
        }
        ggml_build_forward_expand(gf, mctx_cur->cpy_v(ctx0, v_cur, is_swa ? inp->get_v_idxs_swa() : inp->get_v_idxs(), il));
    }
}

ggml_tensor * llm_graph_context::build_ridgefill_outputs(ggml_tensor * inpL, ggml_tensor * inp_out_ids, int il) const {
    if (il != n_layer - 1 || !inp_out_ids) {
        return inpL;
    }
    return ggml_get_rows(ctx0, inpL, inp_out_ids);
}

int32_t llama_ridgefill_reusable_prefix(int32_t n_common, const int32_t * ranges, int32_t n_ranges,
                                        int32_t plan_begin, int32_t plan_end) {
    int32_t k = std::max(n_common, 0);
    for (int32_t i = 0; i < n_ranges; ++i) {
        const int32_t b = ranges[2 * i], e = ranges[2 * i + 1];
        if (b >= e || b >= k) {
            continue;  // empty, or not inside the reused prefix
        }
        if (b < plan_begin || b >= plan_end) {
            k = b;  // a filled cell this request would compute exactly: keep what lies before it
        } else if (e > plan_end) {
            k = std::min(k, plan_end);  // filled beyond this request's fill: keep up to its end
        }
    }
    return k;
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
        ctx->ridgefill->memory = ctx->get_memory();  // its changes reach the carried states
        std::lock_guard<std::mutex> lock(g_memory_mutex);
        g_memory_owner[ctx->ridgefill->memory] = ctx->ridgefill.get();
    }
    return *ctx->ridgefill;
}

// the maps were fitted on positions >= their sink_tokens only
static int32_t check_sink(int32_t n, const ridgefill_maps * maps) {
    if (maps && n >= 0 && n < maps->sink_tokens) {
        return fail("sink_tokens " + std::to_string(n) + " is below the " + std::to_string(maps->sink_tokens) +
                    " the maps were calibrated with (" + maps->path + "): the maps never saw those positions");
    }
    return 0;
}

// a band needs layers below the split, a window, and a cache whose attention takes the band's mask
static int32_t check_band(const llama_context * ctx, int32_t layers, int32_t window, const ridgefill_maps & maps) {
    if (layers < 0 || layers > maps.split_layer) {
        return fail("band_layers " + std::to_string(layers) + " outside 0.." + std::to_string(maps.split_layer) +
                    " (the band is made of layers below the split layer " + std::to_string(maps.split_layer) + ")");
    }
    if (layers > 0 && window < 1) {
        return fail("band_window " + std::to_string(window) + ": a band of " + std::to_string(layers) +
                    " layers needs a window of at least 1 position");
    }
    if (layers > 0 && ctx->get_model().hparams.swa_type != LLAMA_SWA_TYPE_NONE) {
        return fail(std::string("a band needs a model without sliding-window attention; ") +
                    llm_arch_name(ctx->get_model().arch) + " has it (use band_layers 0)");
    }
    return 0;
}

// unwindowed band layers: ascending layers below the split (outside the band in effect they change nothing)
static int32_t check_band_full(const std::vector<int32_t> & layers, const ridgefill_maps & maps) {
    for (size_t i = 0; i < layers.size(); ++i) {
        if (layers[i] < 0 || layers[i] >= maps.split_layer) {
            return fail("band_full_layers: layer " + std::to_string(layers[i]) + " is not below the split layer " +
                        std::to_string(maps.split_layer) + " (only band layers can attend to every position)");
        }
        if (i > 0 && layers[i] <= layers[i - 1]) {
            return fail("band_full_layers must be ascending without repeats (" + std::to_string(layers[i - 1]) +
                        " then " + std::to_string(layers[i]) + ")");
        }
    }
    return 0;
}

// the window is a mask: only an attention kernel that skips masked positions (the CPU's flash attention) turns it
// into a saving; without one the band layers cost what exact layers cost (said once per context)
static void warn_band_cost(llama_context * ctx, int32_t layers, const ridgefill_maps & maps) {
    if (layers > 0 && !ctx->get_cparams().flash_attn && state(ctx).band_cost_warn) {
        state(ctx).band_cost_warn = false;
        LLAMA_LOG_WARN("ridgefill: band of %d layers with flash attention off: their attention still computes every "
                       "position (the window only masks), so the band saves nothing over split layer %d alone; "
                       "use flash attention (-fa on)\n", layers, maps.split_layer);
    }
}

int32_t llama_ridgefill_load_maps(llama_context * ctx, const char * maps_path, const char * model_path) {
    if (!maps_path) {
        return fail("no maps path given");
    }
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
        auto maps = ridgefill_maps_load(model, maps_path, model_path ? model_path : maps_path);
        if (check_sink(state(ctx).sink_tokens, maps.get()) != 0) {
            return -1;
        }
        const ridgefill_context & rf = state(ctx);
        if (check_band(ctx, ridgefill_context::band_of(rf.band_layers, maps.get()),
                       ridgefill_context::window_of(rf.band_layers, rf.band_window, maps.get()), *maps) != 0) {
            return -1;
        }
        if (rf.band_full_set && check_band_full(rf.band_full_layers, *maps) != 0) {
            return -1;
        }
        warn_band_cost(ctx, ridgefill_context::band_of(rf.band_layers, maps.get()), *maps);
        std::string where;  // the buffers, one per device holding maps: "1.2 MiB on RPC0[host:port], ..."
        for (ggml_backend_buffer_t buf : maps->bufs) {
            char part[160];
            snprintf(part, sizeof(part), "%s%.1f MiB on %s", where.empty() ? "" : ", ",
                     ggml_backend_buffer_get_size(buf) / 1048576.0, ggml_backend_buffer_name(buf));
            where += part;
        }
        state(ctx).maps = std::move(maps);
        state(ctx).carry.clear();
        const ridgefill_maps & m = *state(ctx).maps;
        state(ctx).guard.clear();
        LLAMA_LOG_INFO("ridgefill: loaded maps for split layer %d from %s (%s); map_kind %s, context_tokens %d\n",
                       m.split_layer, maps_path, where.c_str(), m.kind == ridgefill_map_kind::kv ? "kv" : "input",
                       m.context_tokens);
        if (state(ctx).band() > 0) {
            std::string full;
            for (int32_t il : state(ctx).band_full()) {
                full += (full.empty() ? "; layers " : ", ") + std::to_string(il);
            }
            LLAMA_LOG_INFO("ridgefill: band: layers %d-%d of filled rows attend to the sink and their %d latest "
                           "positions%s\n", m.split_layer - state(ctx).band(), m.split_layer - 1, state(ctx).window(),
                           full.empty() ? "" : (full + " attend to every position").c_str());
        }
        if (m.guard_window > 0) {
            LLAMA_LOG_INFO("ridgefill: guard: %d-row checks, threshold %.2f (from the held-out calibration text)\n",
                           m.guard_window, m.guard_threshold);
        } else {
            LLAMA_LOG_WARN("ridgefill: %s carries no guard threshold (calibrated before the guard existed): the "
                           "out-of-distribution guard is off; recalibrate to enable it\n", maps_path);
        }
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
    if (n < -1) {
        return fail("sink_tokens must be >= 0 (or -1: the maps' own)");
    }
    if (check_sink(n, state(ctx).maps.get()) != 0) {
        return -1;
    }
    state(ctx).sink_tokens = n;
    return 0;
}

int32_t llama_ridgefill_sink_tokens(const llama_context * ctx) {
    if (!ctx->ridgefill) {
        return -1;
    }
    return ctx->ridgefill->sink_tokens >= 0 || ctx->ridgefill->maps ? ctx->ridgefill->sink() : -1;
}

int32_t llama_ridgefill_maps_sink_tokens(const llama_context * ctx) {
    return ctx->ridgefill && ctx->ridgefill->maps ? ctx->ridgefill->maps->sink_tokens : -1;
}

int32_t llama_ridgefill_set_band(llama_context * ctx, int32_t n_layers, int32_t window) {
    ridgefill_context & rf = state(ctx);
    if (!rf.maps) {
        return fail("no maps loaded (llama_ridgefill_load_maps): a band is set for the maps' split layer");
    }
    if (n_layers < -1 || window < -1) {
        return fail("band_layers and band_window must be >= 0 (or -1: the maps' own)");
    }
    const int32_t layers = ridgefill_context::band_of(n_layers, rf.maps.get());
    if (check_band(ctx, layers, ridgefill_context::window_of(n_layers, window, rf.maps.get()), *rf.maps) != 0) {
        return -1;
    }
    warn_band_cost(ctx, layers, *rf.maps);
    rf.band_layers = n_layers;
    rf.band_window = window;
    return 0;
}

void llama_ridgefill_set_band_cost_warning(llama_context * ctx, bool enabled) {
    state(ctx).band_cost_warn = enabled;
}

int32_t llama_ridgefill_band(const llama_context * ctx, int32_t * n_layers, int32_t * window) {
    const bool on = ctx->ridgefill && ctx->ridgefill->maps;
    if (n_layers) {
        *n_layers = on ? ctx->ridgefill->band() : -1;
    }
    if (window) {
        *window = on ? ctx->ridgefill->window() : -1;
    }
    return on ? 0 : -1;
}

int32_t llama_ridgefill_set_band_full_layers(llama_context * ctx, const int32_t * layers, int32_t n) {
    ridgefill_context & rf = state(ctx);
    if (!rf.maps) {
        return fail("no maps loaded (llama_ridgefill_load_maps): band_full_layers are set for the maps' split layer");
    }
    if (n < 0) {
        rf.band_full_set = false;
        rf.band_full_layers.clear();
        return 0;
    }
    if (n > 0 && !layers) {
        return fail("band_full_layers: " + std::to_string(n) + " layers but no array");
    }
    std::vector<int32_t> v(layers, layers + n);
    if (check_band_full(v, *rf.maps) != 0) {
        return -1;
    }
    rf.band_full_set    = true;
    rf.band_full_layers = std::move(v);
    return 0;
}

int32_t llama_ridgefill_band_full_layers(const llama_context * ctx, int32_t * out, int32_t cap) {
    if (!ctx->ridgefill || !ctx->ridgefill->maps) {
        return -1;
    }
    const std::vector<int32_t> full = ctx->ridgefill->band_full();
    for (int32_t i = 0; out && i < cap && i < (int32_t) full.size(); ++i) {
        out[i] = full[i];
    }
    return (int32_t) full.size();
}

int32_t llama_ridgefill_set_splice(llama_context * ctx, const char * mode) {
    static const std::map<std::string, ridgefill_splice> modes = {
        {"", ridgefill_splice::none}, {"none", ridgefill_splice::none}, {"k", ridgefill_splice::k},
        {"v", ridgefill_splice::v},   {"kv", ridgefill_splice::kv},     {"kscale", ridgefill_splice::kscale},
    };
    const auto it = modes.find(mode ? mode : "");
    if (it == modes.end()) {
        return fail(std::string("unknown splice mode '") + mode + "' (none, k, v, kv, kscale)");
    }
    state(ctx).splice = it->second;
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

const char * llama_ridgefill_map_kind(const llama_context * ctx) {
    if (!ctx->ridgefill || !ctx->ridgefill->maps) {
        return nullptr;
    }
    return ctx->ridgefill->maps->kind == ridgefill_map_kind::kv ? "kv" : "input";
}

int32_t llama_ridgefill_context_tokens(const llama_context * ctx) {
    return ctx->ridgefill && ctx->ridgefill->maps ? ctx->ridgefill->maps->context_tokens : -1;
}

int32_t llama_ridgefill_capture_predicted(llama_context * ctx, bool enable) {
    state(ctx).capture_pred = enable;
    state(ctx).pred.clear();
    return 0;
}

const float * llama_ridgefill_predicted(const llama_context * ctx, int32_t il, int32_t * n_rows, int32_t * n_cols) {
    *n_rows = *n_cols = 0;
    if (!ctx->ridgefill || !ctx->ridgefill->maps || il < 0 || il >= (int32_t) ctx->ridgefill->pred.size() ||
        !ctx->ridgefill->maps->weight[il]) {
        return nullptr;
    }
    const auto & rows = ctx->ridgefill->pred[il];
    *n_cols = (int32_t) ctx->ridgefill->maps->bias[il]->ne[0];
    *n_rows = (int32_t) (rows.size() / *n_cols);
    return rows.empty() ? nullptr : rows.data();
}

int32_t llama_ridgefill_split_layer(const llama_context * ctx) {
    return ctx->ridgefill && ctx->ridgefill->maps ? ctx->ridgefill->maps->split_layer : -1;
}

static const char * device_name(const ggml_tensor * t) {
    if (!t || !t->buffer) {
        return nullptr;
    }
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(t->buffer);
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    if (dev) {
        return ggml_backend_dev_name(dev);
    }
    return ggml_backend_buft_is_host(buft) ? "CPU" : ggml_backend_buft_name(buft);  // e.g. mmapped weights
}

const char * llama_ridgefill_placement(const llama_context * ctx, int32_t il, bool map) {
    const llama_model & model = ctx->get_model();
    if (il < 0 || il >= (int32_t) model.hparams.n_layer()) {
        return nullptr;
    }
    if (!map) {
        const llama_layer & layer = model.layers[il];
        return device_name(layer.wk ? layer.wk : layer.attn_norm);
    }
    const auto & maps = ctx->ridgefill ? ctx->ridgefill->maps : nullptr;
    return maps ? device_name(maps->weight[il]) : nullptr;
}

int32_t llama_ridgefill_add_rpc_servers(const char * endpoints) {
    ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    if (!rpc) {
        return fail("this build has no RPC backend (rebuild with -DGGML_RPC=ON)");
    }
    using add_server_fn = ggml_backend_reg_t (*)(const char *);
    auto add_server = (add_server_fn) ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server");
    if (!add_server) {
        return fail("the RPC backend has no ggml_backend_rpc_add_server");
    }
    static std::set<std::string> registered;
    int32_t n_added = 0;
    const std::string all = endpoints ? endpoints : "";
    size_t start = 0;
    while (start <= all.size()) {
        const size_t comma = std::min(all.find(',', start), all.size());
        const std::string ep = all.substr(start, comma - start);
        start = comma + 1;
        const size_t colon = ep.rfind(':');
        if (ep.empty() || colon == std::string::npos || colon == 0 || colon + 1 == ep.size() ||
            ep.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
            return fail("RPC server '" + ep + "' is not host:port (in '" + all + "')");
        }
        if (registered.count(ep)) {
            continue;
        }
        ggml_backend_reg_t reg = add_server(ep.c_str());
        if (!reg) {
            return fail("RPC server " + ep + " reports no devices");
        }
        ggml_backend_register(reg);
        registered.insert(ep);
        n_added += (int32_t) ggml_backend_reg_dev_count(reg);
    }
    return n_added;
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
        ctx->ridgefill->guard.erase(seq_id);  // the guard's verdict is per prompt too
        ctx->ridgefill->filled.erase(seq_id); // and positions of an earlier prompt not taken
    }
}

int32_t llama_ridgefill_set_guard(llama_context * ctx, llama_seq_id seq_id, bool enabled) {
    if (seq_id < -1) {
        return fail("invalid seq_id");
    }
    ridgefill_context & rf = state(ctx);
    if (seq_id < 0) {
        rf.guard_on = enabled;
        rf.guard_seq_on.clear();
    } else {
        rf.guard_seq_on[seq_id] = enabled;
    }
    return 0;
}

int32_t llama_ridgefill_set_guard_period(llama_context * ctx, int32_t period) {
    ridgefill_context & rf = state(ctx);
    const int32_t w = rf.maps ? rf.maps->guard_window : 0;
    if (period < 0 || (period > 0 && period <= w)) {
        return fail("guard period " + std::to_string(period) + ": must be 0 (the probe only) or more than the " +
                    std::to_string(w) + " rows of a check");
    }
    rf.guard_period = period;
    return 0;
}

int32_t llama_ridgefill_guard(const llama_context * ctx, llama_seq_id seq_id, float * score, float * max_score,
                              float * threshold, int32_t * n_checks, int32_t * fell_back_at) {
    const ridgefill_context * rf = ctx->ridgefill.get();
    const bool active = rf && rf->enabled && rf->guard_active(seq_id);
    const ridgefill_guard_seq none;
    const ridgefill_guard_seq * found = nullptr;
    if (rf) {
        const auto it = rf->guard.find(seq_id);
        found = it != rf->guard.end() ? &it->second : nullptr;
    }
    const ridgefill_guard_seq & g = found ? *found : none;
    if (score)        *score        = g.score;
    if (max_score)    *max_score    = g.max_score;
    if (threshold)    *threshold    = rf && rf->maps ? rf->maps->guard_threshold : 0.0f;
    if (n_checks)     *n_checks     = g.n_checks;
    if (fell_back_at) *fell_back_at = g.fell_back_at;
    return active || g.n_checks > 0 ? g.verdict : -1;
}

int32_t llama_ridgefill_take_filled(llama_context * ctx, llama_seq_id seq_id, int32_t * ranges, int32_t max_ranges) {
    if (!ctx->ridgefill) {
        return 0;
    }
    auto it = ctx->ridgefill->filled.find(seq_id);
    if (it == ctx->ridgefill->filled.end()) {
        return 0;
    }
    const int32_t n = (int32_t) it->second.size() / 2;
    if (n > max_ranges) {
        return fail("llama_ridgefill_take_filled: " + std::to_string(n) + " ranges, room for " +
                    std::to_string(max_ranges));
    }
    std::copy(it->second.begin(), it->second.end(), ranges);
    ctx->ridgefill->filled.erase(it);
    return n;
}
