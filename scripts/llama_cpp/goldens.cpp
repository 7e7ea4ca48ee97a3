// Golden kept distributions from llama.cpp's own samplers, for decoda's
// tests/suite/llama_cpp_goldens.rs. Built and run by scripts/llama_cpp/make_goldens.sh, which
// writes crates/decoda/tests/golden/llama_cpp_kept.jsonl; `cargo test` reads that file
// and needs no C++ build.
//
// Each case: random logits, a history with repeats, and parameters; llama.cpp's
// samplers applied one by one in decoda's pipeline order (logit bias, penalties, DRY,
// temperature, top-n-sigma, top-k, typical-p, top-p, min-p, XTC with probability 1),
// then the surviving candidates (logit > -inf) with their softmax in double: their
// number and the 256 most likely.
#include "llama.h"
#include "llama-sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

static uint64_t rng_state = 0x2545F4914F6CDD1DULL;
static uint64_t next_u64() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static uint32_t below(uint32_t n) { return (uint32_t)(next_u64() % n); }
static float uniform01() { return (float)((next_u64() >> 40) * (1.0 / 16777216.0)); }
// roughly Gaussian: the sum of four uniforms, centred
static float gauss() { return (uniform01() + uniform01() + uniform01() + uniform01() - 2.0f) * 1.7320508f; }

struct Case {
    std::string stage;
    int vocab;
    std::vector<float> logits;
    std::vector<int> history;
    float temperature = 1.0f;
    int top_k = 0;
    float top_p = 1.0f, min_p = 0.0f, typical_p = 1.0f, top_n_sigma = 0.0f;
    float xtc_threshold = 0.0f; bool xtc = false;
    float repetition = 1.0f, frequency = 0.0f, presence = 0.0f;
    float dry_multiplier = 0.0f, dry_base = 1.75f; int dry_allowed_length = 2, dry_last_n = -1;
    std::vector<std::vector<int>> breakers;
    std::vector<std::pair<int, float>> bias;
};

static std::vector<int> history_with_repeats(int vocab, int len) {
    std::vector<int> h;
    // a small alphabet so that repeats happen, with copied stretches
    int alphabet = 4 + below(std::min(vocab - 4, 40));
    while ((int)h.size() < len) {
        if (h.size() > 6 && below(3) == 0) {
            int from = below(h.size() - 3), n = 2 + below(6);
            for (int i = 0; i < n && (int)h.size() < len; ++i) h.push_back(h[from + i % (h.size() - from)]);
        } else {
            h.push_back(below(alphabet));
        }
    }
    return h;
}

static void apply(llama_sampler * s, const std::vector<int> & hist, llama_token_data_array * arr, bool accept) {
    // Candidates at -inf (removed by top-n-sigma or a bias) leave the list first: they are
    // in no kept set, and llama.cpp's typical-p would take their 0 * log(0) as NaN.
    size_t n = 0;
    for (size_t i = 0; i < arr->size; ++i)
        if (arr->data[i].logit > -INFINITY) arr->data[n++] = arr->data[i];
    if (n > 0 && n < arr->size) { arr->size = n; arr->sorted = false; }
    if (accept) for (int t : hist) llama_sampler_accept(s, t);
    llama_sampler_apply(s, arr);
    llama_sampler_free(s);
}

static void run(const Case & c) {
    std::vector<llama_token_data> data(c.vocab);
    for (int i = 0; i < c.vocab; ++i) data[i] = {i, c.logits[i], 0.0f};
    llama_token_data_array arr = {data.data(), data.size(), -1, false};
    if (!c.bias.empty()) {
        std::vector<llama_logit_bias> b;
        for (auto & e : c.bias) b.push_back({e.first, e.second});
        apply(llama_sampler_init_logit_bias(c.vocab, b.size(), b.data()), c.history, &arr, false);
    }
    if (c.repetition != 1.0f || c.frequency != 0.0f || c.presence != 0.0f)
        apply(llama_sampler_init_penalties(c.vocab, 1 << 20, c.repetition, c.frequency, c.presence), c.history, &arr, true);
    if (c.dry_multiplier != 0.0f) {
        // -1 (the whole history) is llama.cpp's context length; the history is shorter
        int last_n = c.dry_last_n == -1 ? (1 << 20) : c.dry_last_n;
        apply(llama_sampler_init_dry_testing(c.dry_multiplier, c.dry_base, c.dry_allowed_length, last_n, c.breakers), c.history, &arr, true);
    }
    apply(llama_sampler_init_temp(c.temperature), c.history, &arr, false);
    if (c.top_n_sigma > 0.0f) apply(llama_sampler_init_top_n_sigma(c.top_n_sigma), c.history, &arr, false);
    if (c.top_k > 0) apply(llama_sampler_init_top_k(c.top_k), c.history, &arr, false);
    if (c.typical_p < 1.0f) apply(llama_sampler_init_typical(c.typical_p, 1), c.history, &arr, false);
    if (c.top_p < 1.0f) apply(llama_sampler_init_top_p(c.top_p, 1), c.history, &arr, false);
    if (c.min_p > 0.0f) apply(llama_sampler_init_min_p(c.min_p, 1), c.history, &arr, false);
    if (c.xtc) apply(llama_sampler_init_xtc(1.0f, c.xtc_threshold, 1, 1234), c.history, &arr, false);

    std::vector<std::pair<int, float>> kept;
    for (size_t i = 0; i < arr.size; ++i)
        if (arr.data[i].logit > -INFINITY) kept.push_back({arr.data[i].id, arr.data[i].logit});
    double m = -INFINITY;
    for (auto & e : kept) m = std::max(m, (double)e.second);
    double sum = 0;
    for (auto & e : kept) sum += std::exp((double)e.second - m);
    std::sort(kept.begin(), kept.end(), [](auto & a, auto & b) {
        return a.second != b.second ? a.second > b.second : a.first < b.first;
    });

    printf("{\"stage\":\"%s\",\"vocab\":%d,\"temperature\":%.9g,\"top_k\":%d,\"top_p\":%.9g,\"min_p\":%.9g,"
           "\"typical_p\":%.9g,\"top_n_sigma\":%.9g,\"xtc_probability\":%d,\"xtc_threshold\":%.9g,"
           "\"repetition_penalty\":%.9g,\"frequency_penalty\":%.9g,\"presence_penalty\":%.9g,"
           "\"dry_multiplier\":%.9g,\"dry_base\":%.9g,\"dry_allowed_length\":%d,\"dry_penalty_last_n\":%d,",
           c.stage.c_str(), c.vocab, c.temperature, c.top_k, c.top_p, c.min_p, c.typical_p, c.top_n_sigma,
           c.xtc ? 1 : 0, c.xtc_threshold, c.repetition, c.frequency, c.presence, c.dry_multiplier, c.dry_base,
           c.dry_allowed_length, c.dry_last_n);
    printf("\"dry_sequence_breakers\":[");
    for (size_t i = 0; i < c.breakers.size(); ++i) {
        printf(i ? ",[" : "[");
        for (size_t j = 0; j < c.breakers[i].size(); ++j) printf(j ? ",%d" : "%d", c.breakers[i][j]);
        printf("]");
    }
    printf("],\"logit_bias\":{");
    for (size_t i = 0; i < c.bias.size(); ++i) printf(i ? ",\"%d\":%.9g" : "\"%d\":%.9g", c.bias[i].first, c.bias[i].second);
    printf("},\"history\":[");
    for (size_t i = 0; i < c.history.size(); ++i) printf(i ? ",%d" : "%d", c.history[i]);
    printf("],\"logits\":[");
    for (int i = 0; i < c.vocab; ++i) printf(i ? ",%.5g" : "%.5g", c.logits[i]);
    printf("],\"candidates\":%zu,\"top\":[", kept.size());
    for (size_t i = 0; i < kept.size() && i < 256; ++i)
        printf(i ? ",[%d,%.8g]" : "[%d,%.8g]", kept[i].first, std::exp((double)kept[i].second - m) / sum);
    printf("]}\n");
}

int main() {
    const char * stages[] = {"top_n_sigma", "typical_p", "xtc", "dry", "top_k", "top_p", "min_p",
                             "penalties", "bias", "combined"};
    const int vocabs[] = {64, 256, 1000, 2048};
    for (const char * stage : stages) {
        std::string st = stage;
        for (int n = 0; n < 16; ++n) {
            Case c;
            c.stage = st;
            c.vocab = vocabs[n % 4];
            float spread = 0.5f + 3.0f * uniform01();
            for (int i = 0; i < c.vocab; ++i) {
                // printed exactly: rounded to 5 significant digits first
                char buf[32];
                snprintf(buf, sizeof buf, "%.5g", gauss() * spread);
                c.logits.push_back(strtof(buf, nullptr));
            }
            c.history = history_with_repeats(c.vocab, 8 + below(120));
            c.temperature = 0.3f + 1.4f * uniform01();
            bool all = st == "combined";
            if (st == "top_n_sigma" || (all && below(2))) c.top_n_sigma = 0.25f + 2.5f * uniform01();
            if (st == "top_k" || all) c.top_k = 1 + below(std::min(c.vocab - 1, 200));
            if (st == "typical_p" || (all && below(2))) c.typical_p = 0.2f + 0.75f * uniform01();
            if (st == "top_p" || (all && below(2))) c.top_p = 0.3f + 0.65f * uniform01();
            if (st == "min_p" || (all && below(2))) c.min_p = 0.01f + 0.3f * uniform01();
            if (st == "xtc" || (all && below(2))) { c.xtc = true; c.xtc_threshold = 0.02f + 0.2f * uniform01(); }
            // XTC alone: a few dozen candidates, so that some pass the threshold
            if (st == "xtc") c.top_k = 8 + below(40);
            if (st == "penalties" || (all && below(2))) {
                c.repetition = 1.0f + 0.5f * uniform01();
                c.frequency = -1.0f + 2.0f * uniform01();
                c.presence = -1.0f + 2.0f * uniform01();
            }
            if (st == "dry" || (all && below(2))) {
                c.dry_multiplier = 0.2f + 1.5f * uniform01();
                c.dry_base = 1.0f + 1.5f * uniform01();
                c.dry_allowed_length = below(4);
                c.dry_last_n = below(3) == 0 ? -1 : (int)(1 + below(c.history.size() + 10));
                int nb = below(4);
                for (int b = 0; b < nb; ++b) {
                    std::vector<int> seq;
                    int len = 1 + below(3);
                    for (int j = 0; j < len; ++j) seq.push_back(below(12));
                    c.breakers.push_back(seq);
                }
            }
            if (st == "bias" || (all && below(2))) {
                int nb = 1 + below(8);
                for (int b = 0; b < nb; ++b) c.bias.push_back({(int)below(c.vocab), -4.0f + 8.0f * uniform01()});
                std::sort(c.bias.begin(), c.bias.end());
                c.bias.erase(std::unique(c.bias.begin(), c.bias.end(), [](auto & a, auto & b) { return a.first == b.first; }), c.bias.end());
            }
            run(c);
        }
    }
    return 0;
}
