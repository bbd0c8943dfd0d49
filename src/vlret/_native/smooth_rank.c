/* The smooth rank of VSL (vlret.losses.smooth_rank) as one fused pass over each row.

   For a row x (already multiplied by the scale +-1/tau) the rank of entry j is
       rank_j = 1 + sum_{k != j} sigmoid(clamp(x_k - x_j, -50, 50))
   and the gradient of a loss with incoming gradient g is
       dL/dx_a = sum_j w_aj (g_j - g_a),   w_aj = sigmoid'(clamp(x_a - x_j)) (symmetric).
   Each unordered pair (j, k) is evaluated once: with e = exp(-|d|), d = clamp(x_k - x_j),
   sigmoid(|d|) = 1 / (1 + e) and sigmoid(-|d|) = e / (1 + e) are both accurate (neither is
   formed as 1 minus the other), one goes to rank_j and the other to rank_k, and
   w = e / (1 + e)^2 is their product. The derivative of the clamp is not applied: as in
   the PyTorch path, a saturated pair keeps w at the clamp's edge (about 2e-22).

   exp is evaluated branch-free (Cody-Waite reduction by ln 2, a degree-7 Taylor polynomial on
   |r| <= ln2 / 2, truncation error below 2^-26 relative, and the power of two assembled in
   the exponent bits), so that the compiler's vector extensions run 16 lanes at a time on any
   ISA (GCC and Clang lower the 64-byte vectors to what the target has). No fast-math: the
   sums are taken in a fixed order.

   Threads: rows are split over n_threads POSIX threads (no OpenMP runtime, which could clash
   with the one PyTorch ships). */

#include <pthread.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16
typedef float vf __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(LANES * sizeof(int32_t))));

static inline vf splat(float v) { return (vf){0} + v; }

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline vf select_f(vi mask, vf a, vf b) {
    vi ai, bi;
    memcpy(&ai, &a, sizeof ai);
    memcpy(&bi, &b, sizeof bi);
    vi r = (ai & mask) | (bi & ~mask);
    vf out;
    memcpy(&out, &r, sizeof out);
    return out;
}

/* 1 / x for x >= 1 or within float's normal range: on AVX-512 a 14-bit reciprocal estimate
   refined by one Newton step (relative error below 2^-26, within one rounding of the
   division's), elsewhere the division. */
static inline vf recip(vf x) {
#if defined(__AVX512F__)
    __m512 d, y;
    memcpy(&d, &x, sizeof d);
    y = _mm512_rcp14_ps(d);
    vf r;
    memcpy(&r, &y, sizeof r);
    return r * (2.0f - x * r);
#else
    return 1.0f / x;
#endif
}

/* exp(y) for |y| <= 87 (the power of two stays a normal float). */
static inline vf exp_vec(vf y) {
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693145751953125f;       /* exact in float, 12 bits of ln 2 */
    const float ln2_lo = 1.428606765330187045e-6f; /* ln 2 - ln2_hi */
    const float shifter = 12582912.0f;             /* 1.5 * 2^23: rounds to an integer */
    vf t = y * log2e + shifter;
    vf n = t - shifter; /* round(y / ln 2), in [-126, 126] */
    vf r = y - n * ln2_hi;
    r = r - n * ln2_lo;
    vf p = splat(1.0f / 5040.0f);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vi k = __builtin_convertvector(n, vi);
    vi bits = (k + 127) << 23; /* 2^n */
    vf scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline vf exp_neg(vf a) { return exp_vec(-a); }

typedef float vf8 __attribute__((vector_size(8 * sizeof(float))));
typedef float vf4 __attribute__((vector_size(4 * sizeof(float))));

/* The lanes' sum by halving (a fixed order, short dependency chain). */
static inline float hsum(vf v) {
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
    vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
    a += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    vf4 c = __builtin_shufflevector(a, a, 0, 1, 2, 3);
    c += __builtin_shufflevector(a, a, 4, 5, 6, 7);
#else
    vf8 a, b;
    memcpy(&a, &v, sizeof a);
    memcpy(&b, (const char *)&v + sizeof a, sizeof b);
    a += b;
    vf4 c, d;
    memcpy(&c, &a, sizeof c);
    memcpy(&d, (const char *)&a + sizeof c, sizeof d);
    c += d;
#endif
    return (c[0] + c[2]) + (c[1] + c[3]);
}

/* Lanes k + i with k + i < n: all of them but in a row's last vector. */
static inline vi real_lanes(int64_t k, int64_t n) {
    const vi idx = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    int64_t left = n - k;
    return idx < (int32_t)(left < LANES ? left : LANES);
}

/* Offset of pair row j's stored weights within one matrix row: segments of
   ceil((n - j - 1) / LANES) * LANES floats, j = 0..n-1. */
static int64_t segment(int64_t n, int64_t j) { return ((n - j - 1) + LANES - 1) / LANES * LANES; }

int64_t vlret_smooth_rank_pair_floats(int64_t n) {
    int64_t total = 0;
    for (int64_t j = 0; j < n; j++) total += segment(n, j);
    return total;
}

/* Entries within EXP_RANGE of the row's mean have E = exp(x - mean), computed once per
   entry; for two such entries exp(x_k - x_j) = E_k / E_j, so a pair costs one reciprocal,
   sigmoid(x_k - x_j) = E_k / (E_k + E_j), instead of one exp (see pair_sigmoids). EXP_RANGE
   keeps E and the sum of two normal and finite in float32 (e^80 = 5.5e34). A row with more
   than one entry in WIDE_SHARE out of that range whose entries all lie within WIDE_RANGE of
   their midpoint (a trained model's wide row) takes the same ratios with E in float64
   (e^700 = 1e304), see pair_sigmoids_wide. */
#define EXP_RANGE 80.0f
#define WIDE_RANGE 700.0
#define WIDE_SHARE 16

typedef double vd __attribute__((vector_size(8 * sizeof(double))));
typedef int64_t vl __attribute__((vector_size(8 * sizeof(int64_t))));

/* One thread's row buffers (n + LANES entries each) and the path the row takes. */
typedef struct {
    float *xs, *es, *acc, *gs, *gr;
    double *ed;
    int32_t *bad;
    int wide;
} row_t;

/* exp(y) in float64 for |y| <= 700, to float32's precision (the degree-7 polynomial). */
static inline vd exp_wide(vd y) {
    const double log2e = 1.4426950408889634;
    const double ln2 = 0.6931471805599453;
    const double shifter = 6755399441055744.0; /* 1.5 * 2^52: rounds to an integer */
    vd t = y * log2e + shifter;
    vd n = t - shifter;
    vd r = y - n * ln2;
    vd p = (vd){0} + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    vl bits = (__builtin_convertvector(n, vl) + 1023) << 52;
    vd scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* The scaled row xs, its path, and for the float32 paths E = exp(x - mean) (es; 0 for an
   entry out of range) with in bad the running count of entries out of range (bad[k]: among
   0..k-1; lanes k..k+15 are all in range when bad[k + LANES] == bad[k]), for the wide path E
   = exp(x - midpoint) in float64 (ed). Lanes past n: x = 0, E = 1 (masked out by the
   callers). */
static void prepare_row(const float *m, float scale, int64_t n, row_t *rw) {
    float *xs = rw->xs, *es = rw->es;
    int32_t *bad = rw->bad;
    double total = 0.0;
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        xs[i] = m[i] * scale;
        total += xs[i];
        lo = i == 0 || xs[i] < lo ? xs[i] : lo;
        hi = i == 0 || xs[i] > hi ? xs[i] : hi;
    }
    const float mean = (float)(total / (double)n);
    for (int64_t i = n; i < n + LANES; i++) xs[i] = 0.0f;
    for (int64_t i = 0; i < n; i += LANES) {
        vf y = load(xs + i) - mean;
        vi out = (y > EXP_RANGE) | (y < -EXP_RANGE);
        store(es + i, select_f(out, splat(0.0f), exp_vec(select_f(out, splat(0.0f), y))));
    }
    bad[0] = 0;
    for (int64_t i = 0; i < n; i++) bad[i + 1] = bad[i] + (es[i] == 0.0f);
    for (int64_t i = n; i < n + LANES; i++) {
        es[i] = 1.0f;
        bad[i + 1] = bad[i];
    }
    const double mid = 0.5 * ((double)lo + (double)hi);
    rw->wide = bad[n] > 1 && bad[n] * WIDE_SHARE > n && (double)hi - mid <= WIDE_RANGE;
    if (!rw->wide) return;
    double *ed = rw->ed;
    for (int64_t i = 0; i < n; i += 8) {
        vd y;
        for (int l = 0; l < 8; l++) y[l] = i + l < n ? (double)xs[i + l] - mid : 0.0;
        vd e = exp_wide(y);
        memcpy(ed + i, &e, sizeof e);
    }
    for (int64_t i = n; i < n + LANES; i++) ed[i] = 1.0;
}

/* Whether any lane of a mask is set. */
static inline int any_lane(vi mask) {
#if defined(__AVX512F__)
    __m512i v;
    memcpy(&v, &mask, sizeof v);
    return _mm512_test_epi32_mask(v, v) != 0;
#else
    int32_t acc = 0;
    for (int i = 0; i < LANES; i++) acc |= mask[i];
    return acc != 0;
#endif
}

/* sigmoid(clamp(x_k - x_j)) and sigmoid(clamp(x_j - x_k)) of one vector of k (not yet
   masked), on the float32 paths. sat_hi, sat_lo: the two sigmoids at the clamp, 50 and -50,
   as the exp path computes them.

   Three paths, by what the vector holds:
   - every entry in range: E_k / (E_k + E_j) and E_j / (E_k + E_j), without the clamp. For
     a pair 50 or more apart this gives sigmoid(-|d|) < sigmoid(-50) = 1.9e-22 (0 where it
     underflows) instead of the clamp's 1.9e-22 (and 1.0 either way on the other side): a
     difference below 1.9e-22 per pair, far below any rounding of a rank (>= 1) or of a
     gradient, where the clamp only ever mattered for keeping exp finite;
   - an entry out of range, but every such pair saturated (50 or more apart): the same
     ratios, with the clamp's values put in for the saturated pairs;
   - otherwise the exp of each pair's clamped difference. */
static inline void pair_sigmoids(const row_t *rw, int64_t k, int64_t j, vf sat_hi, vf sat_lo,
                                 vf *to_j, vf *to_k) {
    const float *xs = rw->xs, *es = rw->es;
    vf ek = load(es + k), ej = splat(es[j]);
    if (es[j] != 0.0f && rw->bad[k + LANES] == rw->bad[k]) {
        vf inv = recip(ek + ej);
        *to_j = ek * inv;
        *to_k = ej * inv;
        return;
    }
    vf d = load(xs + k) - xs[j];
    vi up = d >= 0.0f;
    vf a = select_f(up, d, -d);
    vi sat = a >= 50.0f;
    vi out = (ek == 0.0f) | (ej == 0.0f);
    vf hi, lo;
    if (!any_lane(out & ~sat)) {
        vf inv = recip(ek + ej);
        vf fj = ek * inv, fk = ej * inv;
        hi = select_f(up, fj, fk); /* sigmoid(|d|) */
        lo = select_f(up, fk, fj);
    } else {
        vf e = exp_neg(select_f(sat, splat(50.0f), a));
        hi = recip(e + 1.0f);
        lo = e * hi;
    }
    hi = select_f(sat, sat_hi, hi);
    lo = select_f(sat, sat_lo, lo);
    *to_j = select_f(up, hi, lo);
    *to_k = select_f(up, lo, hi);
}

static inline vd recip_wide(vd x) {
#if defined(__AVX512F__)
    __m512d d, y;
    memcpy(&d, &x, sizeof d);
    y = _mm512_rcp14_pd(d);
    vd r;
    memcpy(&r, &y, sizeof r);
    return r * (2.0 - x * r); /* relative error below 2^-27 */
#else
    return 1.0 / x;
#endif
}

static inline vf join_halves(vd a, vd b) {
    vf8 lo = __builtin_convertvector(a, vf8), hi = __builtin_convertvector(b, vf8);
    vf out;
    memcpy(&out, &lo, sizeof lo);
    memcpy((char *)&out + sizeof lo, &hi, sizeof hi);
    return out;
}

/* The wide path: the float32 path's separable ratios with E in float64, for every pair of
   the row (no clamp: as above, a difference below 1.9e-22 per pair). */
static inline void pair_sigmoids_wide(const row_t *rw, int64_t k, int64_t j, vf *to_j,
                                      vf *to_k) {
    vd ej = (vd){0} + rw->ed[j], e0, e1;
    memcpy(&e0, rw->ed + k, sizeof e0);
    memcpy(&e1, rw->ed + k + 8, sizeof e1);
    vd i0 = recip_wide(e0 + ej), i1 = recip_wide(e1 + ej);
    *to_j = join_halves(e0 * i0, e1 * i1);
    *to_k = join_halves(ej * i0, ej * i1);
}

/* The masked sigmoids of one vector of k against j, by the row's path. */
static inline void row_pairs(const row_t *rw, int64_t n, int64_t k, int64_t j, vf sat_hi,
                             vf sat_lo, vf *to_j, vf *to_k) {
    if (rw->wide)
        pair_sigmoids_wide(rw, k, j, to_j, to_k);
    else
        pair_sigmoids(rw, k, j, sat_hi, sat_lo, to_j, to_k);
    if (k + LANES > n) {
        vi real = real_lanes(k, n);
        *to_j = select_f(real, *to_j, splat(0.0f));
        *to_k = select_f(real, *to_k, splat(0.0f));
    }
}

/* The sigmoids at the clamp, 50 and -50, as pair_sigmoids's exp path computes them. */
static void saturated(vf *sat_hi, vf *sat_lo) {
    vf e = exp_neg(splat(50.0f));
    *sat_hi = recip(e + 1.0f);
    *sat_lo = e * *sat_hi;
}

/* One row: ranks into out[0..n), the pairs' derivatives (if w) into w's packed segments. */
static void rank_row(const float *m, float scale, int64_t n, float *out, float *w, row_t *rw) {
    vf sat_hi, sat_lo;
    saturated(&sat_hi, &sat_lo);
    prepare_row(m, scale, n, rw);
    float *acc = rw->acc;
    for (int64_t i = 0; i < n + LANES; i++) acc[i] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        vf mine = splat(0.0f);
        for (int64_t k = j + 1; k < n; k += LANES) {
            vf to_j, to_k;
            row_pairs(rw, n, k, j, sat_hi, sat_lo, &to_j, &to_k);
            mine += to_j;
            store(acc + k, load(acc + k) + to_k);
            if (w) {
                store(w, to_j * to_k);
                w += LANES;
            }
        }
        acc[j] += hsum(mine);
    }
    for (int64_t i = 0; i < n; i++) out[i] = acc[i] + 1.0f;
}

/* One row's gradient: grad_a = scale * sum_j w_aj (g_j - g_a); w from the forward's packed
   segments, or recomputed (the same operations, so the same numbers) when w is NULL. */
static void grad_row(const float *m, float scale, const float *g, int64_t n, const float *w,
                     float *grad, row_t *rw) {
    vf sat_hi, sat_lo;
    saturated(&sat_hi, &sat_lo);
    if (!w) prepare_row(m, scale, n, rw);
    float *acc = rw->acc, *gs = rw->gs;
    for (int64_t i = 0; i < n; i++) gs[i] = g[i];
    for (int64_t i = n; i < n + LANES; i++) gs[i] = 0.0f;
    for (int64_t i = 0; i < n + LANES; i++) acc[i] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const vf gj = splat(gs[j]);
        vf mine = splat(0.0f);
        for (int64_t k = j + 1; k < n; k += LANES) {
            vf wk;
            if (w) {
                wk = load(w);
                w += LANES;
            } else {
                vf to_j, to_k;
                row_pairs(rw, n, k, j, sat_hi, sat_lo, &to_j, &to_k);
                wk = to_j * to_k;
            }
            vf t = wk * (load(gs + k) - gj);
            mine += t;
            store(acc + k, load(acc + k) - t);
        }
        acc[j] += hsum(mine);
    }
    for (int64_t i = 0; i < n; i++) grad[i] = acc[i] * scale;
}

/* VSL's per-row term, Eq. (5): 1 - mean_j min(sr_j, cr_j) / max(sr_j, cr_j), with sr and cr
   the ranks of the row of s (derivatives into w) and of c. */
static float vsl_row(const float *s, const float *c, float scale, int64_t n, float *sr,
                     float *cr, float *w, row_t *rw) {
    rank_row(c, scale, n, cr, NULL, rw);
    rank_row(s, scale, n, sr, w, rw);
    double total = 0.0;
    for (int64_t j = 0; j < n; j++) total += sr[j] <= cr[j] ? sr[j] / cr[j] : cr[j] / sr[j];
    return (float)(1.0 - total / (double)n);
}

/* The gradient of a row's term (incoming gradient gterm) with respect to the row of s. */
static void vsl_grad_row(const float *s, float scale, float gterm, int64_t n, const float *sr,
                         const float *cr, const float *w, float *grad, row_t *rw) {
    const float coef = -gterm / (float)n;
    float *gr = rw->gr;
    for (int64_t j = 0; j < n; j++)
        gr[j] = sr[j] <= cr[j] ? coef / cr[j] : -coef * cr[j] / (sr[j] * sr[j]);
    grad_row(s, scale, gr, n, w, grad, rw);
}

enum { RANK_FORWARD, RANK_BACKWARD, VSL_FORWARD, VSL_BACKWARD };

typedef struct {
    const float *m, *g, *c;
    float *out, *w, *sr, *cr;
    float scale;
    int64_t n, r0, r1, seg;
    int mode;
} job_t;

static void *run(void *arg) {
    job_t *jb = (job_t *)arg;
    int64_t n = jb->n, width = n + LANES;
    float *scratch = (float *)malloc(sizeof(float) * 5 * (size_t)width);
    double *ed = (double *)malloc(sizeof(double) * (size_t)width);
    int32_t *bad = (int32_t *)malloc(sizeof(int32_t) * (size_t)(width + 1));
    if (!scratch || !ed || !bad) {
        free(scratch);
        free(ed);
        free(bad);
        return (void *)1;
    }
    row_t rw = {scratch, scratch + width, scratch + 2 * width, scratch + 3 * width,
                scratch + 4 * width, ed, bad, 0};
    for (int64_t r = jb->r0; r < jb->r1; r++) {
        float *w = jb->w ? jb->w + r * jb->seg : NULL;
        const float *m = jb->m + r * n;
        switch (jb->mode) {
        case RANK_FORWARD:
            rank_row(m, jb->scale, n, jb->out + r * n, w, &rw);
            break;
        case RANK_BACKWARD:
            grad_row(m, jb->scale, jb->g + r * n, n, w, jb->out + r * n, &rw);
            break;
        case VSL_FORWARD:
            jb->out[r] = vsl_row(m, jb->c + r * n, jb->scale, n, jb->sr + r * n,
                                 jb->cr + r * n, w, &rw);
            break;
        default:
            vsl_grad_row(m, jb->scale, jb->g[r], n, jb->sr + r * n, jb->cr + r * n, w,
                         jb->out + r * n, &rw);
        }
    }
    free(scratch);
    free(ed);
    free(bad);
    return NULL;
}

static int dispatch(job_t base, int64_t rows, int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > rows) n_threads = (int)rows;
    if (n_threads > 64) n_threads = 64;
    job_t jobs[64];
    pthread_t ids[64];
    int started[64] = {0};
    int64_t per = (rows + n_threads - 1) / n_threads;
    for (int t = 0; t < n_threads; t++) {
        jobs[t] = base;
        jobs[t].r0 = t * per < rows ? t * per : rows;
        jobs[t].r1 = (t + 1) * per < rows ? (t + 1) * per : rows;
    }
    int failed = 0;
    for (int t = 1; t < n_threads; t++)
        started[t] = pthread_create(&ids[t], NULL, run, &jobs[t]) == 0;
    for (int t = 1; t < n_threads; t++)
        if (!started[t]) failed |= run(&jobs[t]) != NULL; /* no thread: run it here */
    failed |= run(&jobs[0]) != NULL;
    for (int t = 1; t < n_threads; t++) {
        void *ret = NULL;
        if (started[t]) {
            pthread_join(ids[t], &ret);
            failed |= ret != NULL;
        }
    }
    return failed;
}

/* The entry points. Every array is float32, row-major and contiguous; rows x n unless said.
   w: NULL or rows * vlret_smooth_rank_pair_floats(n) floats (the forward writes the pairs'
   derivatives there, the backward reads them; NULL: recomputed). Each returns 0, or 1 when
   a thread's row buffers could not be allocated. */

/* ranks of m. */
int vlret_smooth_rank_forward(const float *m, float scale, int64_t rows, int64_t n, float *out,
                              float *w, int n_threads) {
    job_t base = {m, NULL, NULL, out, w, NULL, NULL, scale, n, 0, 0,
                  vlret_smooth_rank_pair_floats(n), RANK_FORWARD};
    return dispatch(base, rows, n_threads);
}

/* grad of sum(ranks * g) with respect to m. */
int vlret_smooth_rank_backward(const float *m, float scale, const float *g, int64_t rows,
                               int64_t n, const float *w, float *grad, int n_threads) {
    job_t base = {m, g, NULL, grad, (float *)w, NULL, NULL, scale, n, 0, 0,
                  vlret_smooth_rank_pair_floats(n), RANK_BACKWARD};
    return dispatch(base, rows, n_threads);
}

/* terms (rows) of VSL's Eq. (5) between the rows of s and c; sr and cr receive the ranks. */
int vlret_vsl_forward(const float *s, const float *c, float scale, int64_t rows, int64_t n,
                      float *terms, float *sr, float *cr, float *w, int n_threads) {
    job_t base = {s, NULL, c, terms, w, sr, cr, scale, n, 0, 0,
                  vlret_smooth_rank_pair_floats(n), VSL_FORWARD};
    return dispatch(base, rows, n_threads);
}

/* grad of sum(terms * gterms) with respect to s (gterms: rows). */
int vlret_vsl_backward(const float *s, float scale, const float *gterms, int64_t rows,
                       int64_t n, const float *sr, const float *cr, const float *w, float *grad,
                       int n_threads) {
    job_t base = {s, gterms, NULL, grad, (float *)w, (float *)sr, (float *)cr, scale, n, 0, 0,
                  vlret_smooth_rank_pair_floats(n), VSL_BACKWARD};
    return dispatch(base, rows, n_threads);
}
