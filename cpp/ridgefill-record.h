// RidgeFill fill record: which cells of a cached prompt were filled approximately.
//
// Header-only, for llama-server (ggml-patches/0008): a server_prompt carries one, and every path that
// keeps or moves cells between requests (slot reuse, the RAM prompt cache, /slots save and restore,
// context shift) carries it along.  What a new request may reuse is decided in one place, by
// llama_ridgefill_reusable_prefix (cpp/ridgefill.h).
#pragma once

#include "ridgefill.h"

#include <algorithm>
#include <cstdint>
#include <vector>

struct ridgefill_record {
    std::vector<int32_t> ranges;  // sorted half-open ranges [ranges[2i], ranges[2i+1]) of filled positions

    bool empty() const { return ranges.empty(); }

    // the positions a request fills approximately: [sink, n_prompt - tail), empty for an exact request
    // (tail < 1) or when nothing lies between the sink and the tail
    static ridgefill_record plan(int32_t n_prompt, int32_t tail, int32_t sink) {
        ridgefill_record r;
        if (tail >= 1 && n_prompt - tail > sink) {
            r.ranges = {sink, n_prompt - tail};
        }
        return r;
    }

    // how many of n_common cached tokens a request planned as `plan` may reuse
    int32_t reusable(int32_t n_common, const ridgefill_record & plan) const {
        const int32_t b = plan.empty() ? 0 : plan.ranges[0], e = plan.empty() ? 0 : plan.ranges[1];
        return llama_ridgefill_reusable_prefix(n_common, ranges.data(), (int32_t) ranges.size() / 2, b, e);
    }

    // the cells below n are kept, the others dropped
    void keep_first(int32_t n) {
        std::vector<int32_t> out;
        for (size_t i = 0; i < ranges.size(); i += 2) {
            if (ranges[i] < n) {
                out.push_back(ranges[i]);
                out.push_back(std::min(ranges[i + 1], n));
            }
        }
        ranges = std::move(out);
    }

    // cells [b, e) filled after the current ones
    void add(int32_t b, int32_t e) {
        if (b >= e) {
            return;
        }
        if (!ranges.empty() && ranges.back() >= b) {
            ranges.back() = std::max(ranges.back(), e);
        } else {
            ranges.push_back(b);
            ranges.push_back(e);
        }
    }

    // after a decode: of the cells [b, e) this sequence just computed, the runtime filled exactly `filled`
    // (n sorted ranges, from llama_ridgefill_take_filled); the rest of [b, e) was computed exactly (the tail,
    // the guard's canary rows and fallbacks), whatever the plan marked before the decode
    void settle(int32_t b, int32_t e, const int32_t * filled, int32_t n) {
        std::vector<std::pair<int32_t, int32_t>> parts;
        for (size_t i = 0; i < ranges.size(); i += 2) {
            if (ranges[i] < std::min(ranges[i + 1], b)) {
                parts.emplace_back(ranges[i], std::min(ranges[i + 1], b));
            }
            if (std::max(ranges[i], e) < ranges[i + 1]) {
                parts.emplace_back(std::max(ranges[i], e), ranges[i + 1]);
            }
        }
        for (int32_t i = 0; i < n; ++i) {
            parts.emplace_back(filled[2 * i], filled[2 * i + 1]);
        }
        std::sort(parts.begin(), parts.end());
        ranges.clear();
        for (const auto & [x, y] : parts) {
            add(x, y);
        }
    }

    // the filled cells of [0, n) are the same in both records
    bool same_below(const ridgefill_record & o, int32_t n) const {
        ridgefill_record a = *this, b = o;
        a.keep_first(n);
        b.keep_first(n);
        return a.ranges == b.ranges;
    }

    // context shift: [n_keep, n_keep + n_discard) is removed and later cells move down.  The moved cells
    // were computed on top of whatever was filled before them, so from the first filled cell at or
    // after n_keep on, every remaining cell counts as filled.
    void shift(int32_t n_keep, int32_t n_discard, int32_t n_tokens_after) {
        int32_t first = -1;
        for (size_t i = 0; i < ranges.size(); i += 2) {
            if (ranges[i + 1] > n_keep) {
                first = std::max(ranges[i], n_keep);
                break;
            }
        }
        keep_first(n_keep);
        if (first >= 0) {
            add(first < n_keep + n_discard ? n_keep : first - n_discard, n_tokens_after);
        }
    }

    // /slots save files: the record rides after the packed tokens as [ranges..., n_ranges, MAGIC].
    // MAGIC is no valid token id, so a stock server refuses such a file instead of trusting its cells.
    static constexpr int32_t MAGIC = 0x52464C52;  // "RFLR"

    void append_to(std::vector<int32_t> & packed) const {
        if (empty()) {
            return;  // an all-exact slot file stays readable by stock servers
        }
        packed.insert(packed.end(), ranges.begin(), ranges.end());
        packed.push_back((int32_t) ranges.size() / 2);
        packed.push_back(MAGIC);
    }

    // takes the record off the end of `packed`; false if it is malformed
    bool take_from(std::vector<int32_t> & packed) {
        ranges.clear();
        if (packed.size() < 2 || packed.back() != MAGIC) {
            return true;  // no record: saved without approximate cells
        }
        const int64_t n = packed[packed.size() - 2];
        if (n < 1 || (int64_t) packed.size() < 2 + 2 * n) {
            return false;
        }
        ranges.assign(packed.end() - 2 - 2 * n, packed.end() - 2);
        packed.resize(packed.size() - 2 - 2 * n);
        for (size_t i = 0; i < ranges.size(); i += 2) {
            if (ranges[i] < 0 || ranges[i] >= ranges[i + 1] || (i > 0 && ranges[i] < ranges[i - 1])) {
                ranges.clear();
                return false;
            }
        }
        return true;
    }
};
