// RidgeFill maps: the base-model fingerprint and loading maps onto the layers' backends.
#include "ridgefill-internal.h"

#include "llama-model.h"
#include "gguf.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

// ---- SHA-256 (FIPS 180-4), enough for the fingerprint ------------------------------------------

namespace {

struct sha256 {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    uint8_t  block[64];
    size_t   used  = 0;
    uint64_t total = 0;

    static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

    void compress(const uint8_t * p) {
        static const uint32_t k[64] = {
            0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
            0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
            0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
            0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
            0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
            0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
            0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
            0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
        uint32_t w[64];
        for (int i = 0; i < 16; ++i) {
            w[i] = (uint32_t) p[4*i] << 24 | (uint32_t) p[4*i+1] << 16 | (uint32_t) p[4*i+2] << 8 | p[4*i+3];
        }
        for (int i = 16; i < 64; ++i) {
            const uint32_t s0 = rotr(w[i-15], 7) ^ rotr(w[i-15], 18) ^ (w[i-15] >> 3);
            const uint32_t s1 = rotr(w[i-2], 17) ^ rotr(w[i-2], 19) ^ (w[i-2] >> 10);
            w[i] = w[i-16] + s0 + w[i-7] + s1;
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        for (int i = 0; i < 64; ++i) {
            const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
            const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
    }

    void update(const void * data, size_t n) {
        const uint8_t * p = (const uint8_t *) data;
        total += n;
        while (n > 0) {
            const size_t take = std::min(n, sizeof(block) - used);
            memcpy(block + used, p, take);
            used += take; p += take; n -= take;
            if (used == sizeof(block)) {
                compress(block);
                used = 0;
            }
        }
    }

    void update(const std::string & s) { update(s.data(), s.size()); }

    std::string hex() {
        const uint64_t bits = total * 8;
        const uint8_t pad = 0x80, zero = 0;
        update(&pad, 1);
        while (used != 56) {
            update(&zero, 1);
        }
        uint8_t len[8];
        for (int i = 0; i < 8; ++i) {
            len[i] = (uint8_t) (bits >> (56 - 8*i));
        }
        update(len, 8);
        char out[65];
        for (int i = 0; i < 8; ++i) {
            snprintf(out + 8*i, 9, "%08x", h[i]);
        }
        return std::string(out, 64);
    }
};

struct gguf_file {
    gguf_context * gguf = nullptr;
    ggml_context * meta = nullptr;
    FILE * f = nullptr;
    std::string path;

    explicit gguf_file(const std::string & path) : path(path) {
        gguf_init_params params = { /*.no_alloc =*/ true, /*.ctx =*/ &meta };
        gguf = gguf_init_from_file(path.c_str(), params);
        if (!gguf) {
            throw std::runtime_error("cannot read " + path + " as GGUF");
        }
        f = fopen(path.c_str(), "rb");
        if (!f) {
            throw std::runtime_error("cannot open " + path);
        }
    }
    ~gguf_file() {
        if (f) fclose(f);
        if (meta) ggml_free(meta);
        if (gguf) gguf_free(gguf);
    }

    void read(size_t offset, void * dst, size_t n) const {
        if (fseek(f, (long) offset, SEEK_SET) != 0 || fread(dst, 1, n, f) != n) {
            throw std::runtime_error("file is truncated");
        }
    }

    // typed metadata: a key of another type is an error naming it (gguf_get_val_* would abort)
    std::string str(const char * key, const std::string & def = "") const {
        const int64_t id = gguf_find_key(gguf, key);
        if (id < 0) return def;
        expect(id, key, gguf_get_kv_type(gguf, id) == GGUF_TYPE_STRING, "a string");
        return gguf_get_val_str(gguf, id);
    }

    int64_t u(const char * key, int64_t def = -1) const {
        const int64_t id = gguf_find_key(gguf, key);
        if (id < 0) return def;
        switch (gguf_get_kv_type(gguf, id)) {
            case GGUF_TYPE_UINT32: return gguf_get_val_u32(gguf, id);
            case GGUF_TYPE_INT32:  return gguf_get_val_i32(gguf, id);
            case GGUF_TYPE_UINT64: {
                const uint64_t v = gguf_get_val_u64(gguf, id);
                expect(id, key, v <= (uint64_t) INT32_MAX, "an integer below 2^31");
                return (int64_t) v;
            }
            default: expect(id, key, false, "an integer"); return def;
        }
    }

    // an integer array (empty when absent)
    std::vector<int32_t> i32s(const char * key) const {
        const int64_t id = gguf_find_key(gguf, key);
        if (id < 0) return {};
        const gguf_type t = gguf_get_kv_type(gguf, id);
        const gguf_type at = t == GGUF_TYPE_ARRAY ? gguf_get_arr_type(gguf, id) : t;
        expect(id, key, t == GGUF_TYPE_ARRAY && (at == GGUF_TYPE_UINT32 || at == GGUF_TYPE_INT32),
               "an array of 32-bit integers");
        const int32_t * p = (const int32_t *) gguf_get_arr_data(gguf, id);
        std::vector<int32_t> v(p, p + gguf_get_arr_n(gguf, id));
        for (int32_t x : v) {
            expect(id, key, at == GGUF_TYPE_INT32 || x >= 0, "integers below 2^31");
        }
        return v;
    }

    // a float32 scalar or array (def when absent)
    std::vector<float> f32s(const char * key) const {
        const int64_t id = gguf_find_key(gguf, key);
        if (id < 0) return {};
        const gguf_type t = gguf_get_kv_type(gguf, id);
        if (t == GGUF_TYPE_FLOAT32) {
            return {gguf_get_val_f32(gguf, id)};
        }
        expect(id, key, t == GGUF_TYPE_ARRAY && gguf_get_arr_type(gguf, id) == GGUF_TYPE_FLOAT32, "float32 values");
        const float * p = (const float *) gguf_get_arr_data(gguf, id);
        return std::vector<float>(p, p + gguf_get_arr_n(gguf, id));
    }

    void expect(int64_t id, const char * key, bool ok, const char * what) const {
        if (!ok) {
            throw std::runtime_error(path + ": key " + key + " has GGUF type " +
                                     gguf_type_name(gguf_get_kv_type(gguf, id)) + ", expected " + what);
        }
    }
};

bool starts_with(const char * s, const char * prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

} // namespace

std::string ridgefill_fingerprint(const std::string & model_path) {
    gguf_file file(model_path);
    struct item { std::string name; ggml_tensor * t; size_t offset; };
    std::vector<item> items;
    const size_t data_offset = gguf_get_data_offset(file.gguf);
    for (int64_t i = 0; i < gguf_get_n_tensors(file.gguf); ++i) {
        const char * name = gguf_get_tensor_name(file.gguf, i);
        if (starts_with(name, "ridgefill.")) continue;
        items.push_back({name, ggml_get_tensor(file.meta, name), data_offset + gguf_get_tensor_offset(file.gguf, i)});
    }
    std::sort(items.begin(), items.end(), [](const item & a, const item & b) { return a.name < b.name; });

    sha256 h;
    h.update("ridgefill-fingerprint-v1\n");
    h.update("arch=" + file.str("general.architecture") + "\n");
    for (const auto & it : items) {
        std::string line = it.name + " " + std::to_string((int) it.t->type) + " ";
        for (int d = 0; d < ggml_n_dims(it.t); ++d) {
            line += (d ? "," : "") + std::to_string(it.t->ne[d]);
        }
        h.update(line + "\n");
    }
    std::vector<uint8_t> buf(3 * 4096);
    for (const auto & it : items) {
        const size_t n = ggml_nbytes(it.t);
        std::vector<std::pair<size_t, size_t>> spans;
        if (n <= 3 * 4096) {
            spans = {{0, n}};
        } else {
            spans = {{0, 4096}, {n / 2 - 2048, 4096}, {n - 4096, 4096}};
        }
        for (auto [off, len] : spans) {
            file.read(it.offset + off, buf.data(), len);
            h.update(buf.data(), len);
        }
    }
    return "sha256:" + h.hex();
}

ridgefill_maps::~ridgefill_maps() {
    for (auto * b : bufs) ggml_backend_buffer_free(b);
    for (auto * c : ctxs) ggml_free(c);
}

static void check_finite(const std::vector<uint8_t> & raw, ggml_type type, int64_t n, const std::string & name) {
    std::vector<float> f(n);
    if (type == GGML_TYPE_F32) {
        memcpy(f.data(), raw.data(), n * sizeof(float));
    } else {
        ggml_get_type_traits(type)->to_float(raw.data(), f.data(), n);
    }
    for (float v : f) {
        if (!std::isfinite(v)) {
            throw std::runtime_error(name + " holds NaN or Inf");
        }
    }
}

std::shared_ptr<ridgefill_maps> ridgefill_maps_load(const llama_model & model, const std::string & maps_path,
                                                    const std::string & model_path) {
    gguf_file file(maps_path);
    auto maps = std::make_shared<ridgefill_maps>();
    maps->path        = maps_path;
    static std::atomic<uint64_t> n_loaded{0};
    maps->generation  = ++n_loaded;
    maps->split_layer = (int32_t) file.u("ridgefill.split_layer", INT32_MIN);
    maps->sink_tokens = (int32_t) file.u("ridgefill.sink_tokens", 0);
    maps->n_layer     = (int32_t) file.u("ridgefill.n_layer");
    maps->fingerprint = file.str("ridgefill.base_fingerprint");
    maps->prior       = file.str("ridgefill.prior");
    maps->map_type    = file.str("ridgefill.map_type");
    maps->format_version = (int32_t) file.u("ridgefill.format_version", 1);
    maps->context_tokens = (int32_t) file.u("ridgefill.context_tokens", 0);
    maps->band_layers = (int32_t) file.u("ridgefill.band_layers", 0);
    maps->band_window = (int32_t) file.u("ridgefill.band_window", 0);
    maps->band_full_layers = file.i32s("ridgefill.band_full_layers");
    const std::string kind = file.str("ridgefill.map_kind", "input");

    const int32_t n_layer = (int32_t) model.hparams.n_layer();
    const int64_t n_embd  = model.hparams.n_embd;
    if (maps->format_version < 1 || maps->format_version > 3) {
        throw std::runtime_error(maps_path + ": format_version " + std::to_string(maps->format_version) +
                                 " is not one this build reads (1..3): the file is from a newer RidgeFill");
    }
    if (kind != "input" && kind != "kv") {
        throw std::runtime_error(maps_path + ": map_kind '" + kind + "' is not one this build knows (input, kv)");
    }
    maps->kind = kind == "kv" ? ridgefill_map_kind::kv : ridgefill_map_kind::input;
    if (maps->context_tokens < 0 || maps->context_tokens > 2) {
        throw std::runtime_error(maps_path + ": context_tokens " + std::to_string(maps->context_tokens) +
                                 " outside 0..2");
    }
    if (maps->sink_tokens < 0) {
        throw std::runtime_error(maps_path + ": sink_tokens " + std::to_string(maps->sink_tokens) + " is negative");
    }
    if (maps->sink_tokens < maps->context_tokens) {
        throw std::runtime_error(maps_path + ": sink_tokens " + std::to_string(maps->sink_tokens) +
                                 " is below context_tokens " + std::to_string(maps->context_tokens) +
                                 " (the first filled token's predecessors must exist)");
    }
    if (maps->split_layer == INT32_MIN) {
        throw std::runtime_error(maps_path + " holds no RidgeFill maps (no ridgefill.split_layer)");
    }
    if (maps->n_layer != n_layer) {
        throw std::runtime_error(maps_path + ": maps for a " + std::to_string(maps->n_layer) + "-layer model, this model has " +
                                 std::to_string(n_layer));
    }
    if (maps->split_layer < 1 || maps->split_layer > n_layer - 1) {
        throw std::runtime_error(maps_path + ": split_layer " + std::to_string(maps->split_layer) + " outside 1.." +
                                 std::to_string(n_layer - 1));
    }
    for (size_t i = 0; i < maps->band_full_layers.size(); ++i) {  // format 3: unwindowed layers of the file's band
        const int32_t il = maps->band_full_layers[i];
        if (il < maps->split_layer - maps->band_layers || il >= maps->split_layer ||
            (i > 0 && il <= maps->band_full_layers[i - 1])) {
            throw std::runtime_error(maps_path + ": band_full_layers must be ascending layers of the band " +
                                     std::to_string(maps->split_layer - maps->band_layers) + ".." +
                                     std::to_string(maps->split_layer - 1) + " (layer " + std::to_string(il) + ")");
        }
    }
    const std::string fp = ridgefill_fingerprint(model_path);
    if (fp != maps->fingerprint) {
        throw std::runtime_error(maps_path + " holds maps for another model (fingerprint " + maps->fingerprint.substr(0, 19) +
                                 "..., the model is " + fp.substr(0, 19) + "...)");
    }

    // the guard (optional keys): per late layer and part the held-out error, and the threshold of a check
    maps->guard_window = (int32_t) file.u("ridgefill.guard.window", 0);
    if (maps->guard_window != 0) {
        const size_t want = (size_t) (n_layer - maps->split_layer - 1) * maps->guard_parts();
        maps->guard_error = file.f32s("ridgefill.guard.layer_error");
        const std::vector<float> thr = file.f32s("ridgefill.guard.threshold");
        bool ok = maps->guard_window > 0 && maps->guard_error.size() == want && thr.size() == 1 &&
                  std::isfinite(thr[0]) && thr[0] > 0.0f;
        for (float e : maps->guard_error) {
            ok = ok && std::isfinite(e) && e > 0.0f;
        }
        if (!ok) {
            throw std::runtime_error(maps_path + ": the guard's keys are malformed (ridgefill.guard.window > 0, "
                                     "layer_error: " + std::to_string(want) + " positive floats, threshold: one positive float)");
        }
        maps->guard_threshold = thr[0];
    }

    // y_l = W_l f + b_l: f is [(C+1)·d], y is the layer input [d] or its [K; V] [d_k + d_v] (same for all late layers)
    const int64_t d_in = (maps->context_tokens + 1) * n_embd;
    int64_t d_out = n_embd;
    if (maps->kind == ridgefill_map_kind::kv) {
        maps->d_k = model.hparams.n_embd_k_gqa(maps->split_layer + 1);
        maps->d_v = model.hparams.n_embd_v_gqa(maps->split_layer + 1);
        for (int il = maps->split_layer + 1; il < n_layer; ++il) {
            if ((int64_t) model.hparams.n_embd_k_gqa(il) != maps->d_k || (int64_t) model.hparams.n_embd_v_gqa(il) != maps->d_v) {
                throw std::runtime_error(maps_path + ": kv maps need equal K/V widths in every late layer; layer " +
                                         std::to_string(il) + " differs");
            }
        }
        d_out = maps->d_k + maps->d_v;
    }
    maps->weight.assign(n_layer, nullptr);
    maps->bias.assign(n_layer, nullptr);
    std::map<ggml_backend_buffer_type_t, ggml_context *> ctx_of;
    struct pending { ggml_tensor * dst; size_t offset; };
    std::vector<pending> todo;
    const size_t data_offset = gguf_get_data_offset(file.gguf);

    for (int il = maps->split_layer + 1; il < n_layer; ++il) {
        const llama_layer & layer = model.layers[il];
        ggml_tensor * anchor = layer.wk ? layer.wk : layer.attn_norm;
        if (!anchor || !anchor->buffer) {
            throw std::runtime_error("layer " + std::to_string(il) + " has no K projection to place its map beside");
        }
        // the default buffer type of the layer's device (not an "extra" one such as CPU repacking)
        ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(anchor->buffer);
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
        buft = (ggml_backend_buft_is_host(buft) || !dev) ? ggml_backend_cpu_buffer_type() : ggml_backend_dev_buffer_type(dev);
        ggml_context *& ctx = ctx_of[buft];
        if (!ctx) {
            ggml_init_params ip = { /*.mem_size =*/ 2 * (size_t) n_layer * ggml_tensor_overhead(), /*.mem_buffer =*/ nullptr,
                                    /*.no_alloc =*/ true };
            ctx = ggml_init(ip);
            maps->ctxs.push_back(ctx);
        }
        for (int which = 0; which < 2; ++which) {
            const std::string name = "ridgefill.blk." + std::to_string(il) + (which ? ".map.bias" : ".map.weight");
            const int64_t id = gguf_find_tensor(file.gguf, name.c_str());
            if (id < 0) {
                throw std::runtime_error(maps_path + ": missing tensor " + name);
            }
            const ggml_tensor * meta = ggml_get_tensor(file.meta, name.c_str());
            const bool ok_type = which ? meta->type == GGML_TYPE_F32
                                       : (meta->type == GGML_TYPE_F32 || meta->type == GGML_TYPE_F16 || meta->type == GGML_TYPE_Q8_0);
            const bool ok_shape = which ? (meta->ne[0] == d_out && ggml_n_dims(meta) == 1)
                                        : (meta->ne[0] == d_in && meta->ne[1] == d_out && ggml_n_dims(meta) == 2);
            if (!ok_type || !ok_shape) {
                throw std::runtime_error(maps_path + ": tensor " + name + " has type " + ggml_type_name(meta->type) +
                                         " and shape [" + std::to_string(meta->ne[0]) + ", " + std::to_string(meta->ne[1]) +
                                         "], expected " + (which ? "f32 [" + std::to_string(d_out) + "]" :
                                         "f32/f16/q8_0 [" + std::to_string(d_in) + ", " + std::to_string(d_out) + "]") +
                                         " (" + kind + " maps, context_tokens " + std::to_string(maps->context_tokens) + ")");
            }
            ggml_tensor * t = ggml_dup_tensor(ctx, meta);
            ggml_set_name(t, name.c_str());
            (which ? maps->bias : maps->weight)[il] = t;
            todo.push_back({t, data_offset + gguf_get_tensor_offset(file.gguf, id)});
        }
    }
    for (auto & [buft, ctx] : ctx_of) {
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
        if (!buf) {
            throw std::runtime_error("cannot allocate memory for the RidgeFill maps");
        }
        ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        maps->bufs.push_back(buf);
        maps->n_bytes += ggml_backend_buffer_get_size(buf);
    }
    std::vector<uint8_t> raw;
    for (const auto & p : todo) {
        raw.resize(ggml_nbytes(p.dst));
        file.read(p.offset, raw.data(), raw.size());
        check_finite(raw, p.dst->type, ggml_nelements(p.dst), maps_path + ": " + ggml_get_name(p.dst));
        ggml_backend_tensor_set(p.dst, raw.data(), 0, raw.size());
    }
    return maps;
}

ggml_tensor * ridgefill_map_apply(ggml_context * ctx, const ridgefill_maps & maps, int il, ggml_tensor * f) {
    return ggml_add(ctx, ggml_mul_mat(ctx, maps.weight[il], f), maps.bias[il]);
}
