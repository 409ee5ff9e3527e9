/* The Mse search's measure on the CPU: for every block and candidate scale, the exact integer error that
 * qcli.codec.search.block_errors computes with a dozen torch passes, here in one loop over each block
 * while it sits in registers (docs/arithmetic.md §6).
 *
 * Every step is one IEEE f32 operation, rounded once, as torch's are: the build (setup.py) turns off
 * contraction into fused multiply-adds and every fast-math licence, so each product and difference rounds
 * on its own. Rounding to an integer adds and subtracts 1.5 * 2^23, exact half-to-even for |v| < 2^22 (the
 * quotients are clamped to at most 57344 here, the fixed-point errors stay below 2^21),
 * which vectorizes on any x86-64 where rintf would not. Each term (an integer square times an integer
 * weight) and each partial sum is an integer below 2^53: summed in an int64 here, in torch's float64
 * there, exactly and so alike in any order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <float.h>
#include <math.h>
#include <string.h>

#define RINT_SHIFT 12582912.0f /* 1.5 * 2^23 */

/* On x86-64, gcc compiles the loops twice, for AVX2 and for the baseline, and picks one when loaded (by
 * the instructions the processor has: an "arch=" clone is taken only on that very processor). */
#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif
#if defined(__GNUC__)
#define INLINED static inline __attribute__((always_inline))
#else
#define INLINED static __forceinline
#endif

/* What a value type rounds to: an integer in [lo, hi], or a minifloat of `mbits` mantissa bits and bias
 * `bias` clamped to [-hi, hi] (lo = -hi). */
typedef struct {
    int minifloat;
    float lo, hi;
    int mbits, bias;
} Value;

static inline float rint_small(float v) { return (v + RINT_SHIFT) - RINT_SHIFT; }

static inline uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* The minifloat value nearest |v| (ties to even mantissa), with v's sign: qcli.codec.minifloat.encode
 * followed by its table's decode, on the f32 bits. */
static inline float minifloat_round(float v, int mbits, int bias) {
    uint32_t bits = bits_of(v);
    uint32_t mag = bits & 0x7FFFFFFFu;
    int shift = 23 - mbits;
    uint32_t normal = ((mag + (1u << (shift - 1)) - 1u + ((mag >> shift) & 1u)) >> shift) << shift;
    uint32_t min_normal = (uint32_t)(127 - bias + 1) << 23;
    float spacing = float_of((uint32_t)(127 + 1 - bias - mbits) << 23);
    float inverse = float_of((uint32_t)(127 - 1 + bias + mbits) << 23);
    float sub = rint_small(float_of(mag) * inverse) * spacing;
    float rounded = mag < min_normal ? sub : float_of(normal);
    return float_of(bits_of(rounded) | (bits & 0x80000000u));
}

/* The error of one block of n values at one effective scale s, its fixed-point unit u; `minifloat` and
 * `weighted` are constants where it is inlined, so each of the four loops is compiled on its own. The
 * terms are integers (|t| < 2^22, t * t * w < 2^53) summed in an int64, which the compiler may vectorize
 * as it would not a sum of doubles. An exact zero stays zero (v = x): x / s gives it already unless s is
 * zero (an underflowed effective scale under a global), so only then does a loop pick it out; the clamp
 * is written as the vector min and max compute it (no NaN reaches it). */
INLINED int64_t block_error(const float *x, const int32_t *w, Py_ssize_t n, float s, float u, Value v,
                            const int minifloat, const int weighted) {
    int64_t sum = 0;
    const int zero_scale = s == 0.0f;
    for (Py_ssize_t k = 0; k < n; k++) {
        float q = x[k] / s;
        if (zero_scale) q = x[k] == 0.0f ? x[k] : q;
        q = q > v.lo ? q : v.lo;
        q = q < v.hi ? q : v.hi;
        float d = minifloat ? x[k] - s * minifloat_round(q, v.mbits, v.bias) : x[k] - rint_small(q) * s;
        int32_t t = (int32_t)rint_small(d * u);
        int64_t square = (int64_t)t * t;
        sum += weighted ? square * w[k] : square;
    }
    return sum;
}

/* block_error where blocks of 32 (every preset's) take a loop of fixed length, unrolled. */
INLINED int64_t any_block_error(const float *x, const int32_t *w, Py_ssize_t n, float s, float u, Value v,
                                const int minifloat, const int weighted) {
    return n == 32 ? block_error(x, w, 32, s, u, v, minifloat, weighted)
                   : block_error(x, w, n, s, u, v, minifloat, weighted);
}

/* Every candidate's error on blocks [0, blocks), one loop for each kind of value and weighing. */
INLINED void measure_of(const float *x, const int32_t *w, const float *scales, const float *unit, double *out,
                        Py_ssize_t blocks, Py_ssize_t elements, Py_ssize_t candidates,
                        Py_ssize_t scale_candidate_stride, Py_ssize_t scale_block_stride, Py_ssize_t unit_stride,
                        Py_ssize_t out_stride, Value v, const int minifloat, const int weighted) {
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const float *xb = x + b * elements;
        const int32_t *wb = weighted ? w + b * elements : NULL;
        float u = unit[b * unit_stride];
        for (Py_ssize_t c = 0; c < candidates; c++) {
            float s = scales[c * scale_candidate_stride + b * scale_block_stride];
            out[c * out_stride + b] = (double)any_block_error(xb, wb, elements, s, u, v, minifloat, weighted);
        }
    }
}

CLONES static void measure(const float *x, const int32_t *w, const float *scales, const float *unit, double *out,
                           Py_ssize_t blocks, Py_ssize_t elements, Py_ssize_t candidates,
                           Py_ssize_t scale_candidate_stride, Py_ssize_t scale_block_stride,
                           Py_ssize_t unit_stride, Py_ssize_t out_stride, Value v) {
#define MEASURE(minifloat, weighted)                                                                           \
    measure_of(x, w, scales, unit, out, blocks, elements, candidates, scale_candidate_stride, scale_block_stride,  \
               unit_stride, out_stride, v, minifloat, weighted)
    if (v.minifloat) {
        if (w) MEASURE(1, 1); else MEASURE(1, 0);
    } else {
        if (w) MEASURE(0, 1); else MEASURE(0, 0);
    }
#undef MEASURE
}

/* A scale dtype's grid (qcli.scheme.ScaleTraits): `step` the low f32 bits it drops (0: every f32), its
 * `mantissa` bits (0: ties round up, UE8M0's powers of two), `floor` the value of code 0 where not zero,
 * a minifloat's smallest normal and subnormal spacing (F16, UE4M3; 0 for none), its largest value, and
 * whether it holds a sign. */
typedef struct {
    int step, mantissa;
    float floor, min_normal, spacing, max;
    int is_signed;
} Grid;

/* qcli.codec.scales.round_up: a positive scale up onto the grid, saturating at its largest value. */
static inline float round_up(float s, Grid g) {
    if (g.step == 0) return s;
    uint32_t bits = bits_of(s), step = 1u << g.step;
    uint32_t up = (bits + step - 1u) & ~(step - 1u);
    if (g.floor > 0.0f && bits <= bits_of(g.floor)) up = bits_of(g.floor);
    float rounded = float_of(up);
    if (g.spacing > 0.0f && s < g.min_normal) rounded = ceilf(s * (1.0f / g.spacing)) * g.spacing;
    return s >= g.max ? g.max : rounded;
}

/* qcli.codec.scales.nearest: a non-negative scale to the nearest grid value (ties to the even code, and
 * between two powers of two to the larger), saturating; it may round to zero. */
static inline float nearest(float s, Grid g) {
    if (g.step == 0) return s;
    uint32_t bits = bits_of(s);
    uint32_t half = (1u << (g.step - 1)) - (g.mantissa == 0 ? 0u : 1u - ((bits >> g.step) & 1u));
    uint32_t rounded = (bits + half) & ~((1u << g.step) - 1u);
    if (g.floor > 0.0f) {
        uint32_t floor = bits_of(g.floor), twice = bits_of(2.0f * g.floor);
        uint32_t low = bits < floor + (floor >> 1) ? floor : twice;
        rounded = bits < twice ? low : rounded;
    }
    float value = float_of(rounded);
    if (g.spacing > 0.0f && s < g.min_normal) value = rint_small(s * (1.0f / g.spacing)) * g.spacing;
    return s >= g.max ? g.max : (value > g.max ? g.max : value);
}

/* What a scheme's search needs: its values (whose range's ends the candidates use), its scale grid, the
 * half range, the clip factors, and the global scale of two levels (0 for one). */
#define MAX_CANDIDATES 64 /* more than any scheme has (qcli.codec.search.candidate_count) */

typedef struct {
    Value value;
    Grid grid;
    float half_range, global;
    const float *clips;
    int clip_count;
} Scheme;

/* qcli.codec.search.candidates for one block of largest magnitude `alpha`: the stored and effective scale
 * of candidate `k` (MinMax's first, in that order), or 0 where there is no such candidate. */
static inline int candidate(float alpha, int k, Scheme sc, float first_stored, float *stored, float *effective) {
    float part;
    int n = sc.clip_count;
    if (k == 0) {
        *stored = first_stored;
    } else {
        if (k <= n) part = (alpha / sc.half_range) * sc.clips[k - 1];
        else if (-sc.value.lo == sc.value.hi) return 0;
        else if (k == n + 1) part = alpha / sc.value.hi;
        else if (k == n + 2) part = alpha / -sc.value.lo;
        else if (!sc.grid.is_signed) return 0;
        else if (k == n + 3) part = alpha / sc.value.lo;
        else if (k <= 2 * n + 3) part = (alpha / sc.value.lo) * sc.clips[k - n - 4];
        else return 0;
        float relative = sc.global > 0.0f ? part / sc.global : part;
        float rounded = nearest(fabsf(relative), sc.grid);
        *stored = rounded > 0.0f ? copysignf(rounded, relative) : first_stored;
    }
    *effective = sc.global > 0.0f ? sc.global * *stored : *stored;
    return 1;
}

/* Each block's candidate of least error (the first of equal ones), its stored and effective scale; one
 * loop for each kind of value and weighing. The candidates are worked out first, then measured. */
INLINED void search_of(const float *x, const int32_t *w, const float *alpha, const float *unit, float *stored,
                       float *effective, Py_ssize_t blocks, Py_ssize_t elements, Scheme sc, const int minifloat,
                       const int weighted) {
    float stores[MAX_CANDIDATES], scales[MAX_CANDIDATES];
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const float *xb = x + b * elements;
        const int32_t *wb = weighted ? w + b * elements : NULL;
        float raw = alpha[b] / sc.half_range;
        if (sc.global > 0.0f) raw = raw / sc.global;
        float first = round_up(raw > 0.0f ? raw : FLT_MIN, sc.grid);
        int count = 0;
        while (count < MAX_CANDIDATES && candidate(alpha[b], count, sc, first, &stores[count], &scales[count]))
            count++;
        int64_t least = -1;
        int chosen = 0;
        for (int k = 0; k < count; k++) {
            int64_t e = any_block_error(xb, wb, elements, scales[k], unit[b], sc.value, minifloat, weighted);
            if (least < 0 || e < least) {
                least = e;
                chosen = k;
            }
        }
        stored[b] = stores[chosen];
        effective[b] = scales[chosen];
    }
}

CLONES static void search(const float *x, const int32_t *w, const float *alpha, const float *unit, float *stored,
                          float *effective, Py_ssize_t blocks, Py_ssize_t elements, Scheme sc) {
#define SEARCH(minifloat, weighted) search_of(x, w, alpha, unit, stored, effective, blocks, elements, sc, minifloat, weighted)
    if (sc.value.minifloat) {
        if (w) SEARCH(1, 1); else SEARCH(1, 0);
    } else {
        if (w) SEARCH(0, 1); else SEARCH(0, 0);
    }
#undef SEARCH
}

/* errors(x, weights, scales, unit, out, blocks, elements, candidates, scale_candidate_stride,
 *        scale_block_stride, unit_stride, out_stride, minifloat, lo, hi, mbits, bias)
 *
 * x: f32 [blocks, elements], contiguous; weights: int32 of the same shape, or 0 for none; scales: f32,
 * candidate c of block b at [c * scale_candidate_stride + b * scale_block_stride] (a block stride of 0
 * gives every block the same candidates, as a per-tensor scheme's); unit: f32 at [b * unit_stride]; out:
 * f64, candidate c of block b at [c * out_stride + b]. Addresses are integers (torch's data_ptr()); the
 * interpreter's lock is released while it runs, so threads may measure disjoint blocks at once. */
static PyObject *errors(PyObject *self, PyObject *args) {
    unsigned long long xp, wp, sp, up, op;
    Py_ssize_t blocks, elements, candidates, scale_candidate_stride, scale_block_stride, unit_stride, out_stride;
    int minifloat, mbits, bias;
    float lo, hi;
    if (!PyArg_ParseTuple(args, "KKKKKnnnnnnnpffii", &xp, &wp, &sp, &up, &op, &blocks, &elements, &candidates,
                          &scale_candidate_stride, &scale_block_stride, &unit_stride, &out_stride, &minifloat,
                          &lo, &hi, &mbits, &bias))
        return NULL;
    if (blocks < 0 || elements < 0 || candidates < 0 || (minifloat && (mbits < 1 || mbits > 22))) {
        PyErr_SetString(PyExc_ValueError, "errors: negative sizes or a minifloat format out of range");
        return NULL;
    }
    Value v = {minifloat, lo, hi, mbits, bias};
    Py_BEGIN_ALLOW_THREADS
    measure((const float *)(uintptr_t)xp, (const int32_t *)(uintptr_t)wp, (const float *)(uintptr_t)sp,
            (const float *)(uintptr_t)up, (double *)(uintptr_t)op, blocks, elements, candidates,
            scale_candidate_stride, scale_block_stride, unit_stride, out_stride, v);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* search(x, weights, alpha, unit, stored, effective, blocks, elements, clips, clip_count, global,
 *        half_range, minifloat, lo, hi, mbits, bias, step, mantissa, floor, min_normal, spacing, max, signed)
 *
 * x and weights as for errors; alpha, unit: f32 [blocks], the blocks' largest magnitude and fixed-point
 * unit; stored, effective: f32 [blocks], written. The candidates are qcli.codec.search.candidates' (the
 * clips f32 [clip_count]), for the value type (minifloat .. bias) on the scale grid (step .. signed). */
static PyObject *search_blocks(PyObject *self, PyObject *args) {
    unsigned long long xp, wp, ap, up, sp, ep, cp;
    Py_ssize_t blocks, elements;
    int clip_count, minifloat, mbits, bias, step, mantissa, is_signed;
    float global, half_range, lo, hi, floor, min_normal, spacing, max;
    if (!PyArg_ParseTuple(args, "KKKKKKnnKiffpffiiiiffffp", &xp, &wp, &ap, &up, &sp, &ep, &blocks, &elements, &cp,
                          &clip_count, &global, &half_range, &minifloat, &lo, &hi, &mbits, &bias, &step, &mantissa,
                          &floor, &min_normal, &spacing, &max, &is_signed))
        return NULL;
    if (blocks < 0 || elements < 0 || clip_count < 0 || 2 * clip_count + 4 > MAX_CANDIDATES || step < 0 || step > 23 ||
        (minifloat && (mbits < 1 || mbits > 22))) {
        PyErr_SetString(PyExc_ValueError, "search: negative sizes, or a grid or format out of range");
        return NULL;
    }
    Scheme sc = {{minifloat, lo, hi, mbits, bias}, {step, mantissa, floor, min_normal, spacing, max, is_signed},
                 half_range, global, (const float *)(uintptr_t)cp, clip_count};
    Py_BEGIN_ALLOW_THREADS
    search((const float *)(uintptr_t)xp, (const int32_t *)(uintptr_t)wp, (const float *)(uintptr_t)ap,
           (const float *)(uintptr_t)up, (float *)(uintptr_t)sp, (float *)(uintptr_t)ep, blocks, elements, sc);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* A chunk's encode measured where its codes are made: each block's decode q * s (q the field, or a
 * minifloat code's value from `table`, s its block's scale, one f32 product as the decode forms it) minus
 * its source, one f32 difference, as qcli.measure measures a decode. Per block: the largest |difference|
 * into errors[b] (kept where larger, NaN where any difference is NaN) and, with `peaks`, the largest |x|
 * likewise; over the blocks, the energies sum x^2 and sum difference^2 in double: each segment of a block
 * summed in f32 lanes, where the compiler has vectors, then in double, or again in double where its f32 sums
 * left the range in which they lose nothing that matters. */

/* The energies and largest magnitudes of elements [from, n) of a block, the squares in double. */
INLINED void block_tail(const float *xb, const int8_t *qb, const uint8_t *cb, const float *table, float s,
                        Py_ssize_t from, Py_ssize_t n, double *sx, double *se, float *m, float *p,
                        const int minifloat) {
    for (Py_ssize_t k = from; k < n; k++) {
        float xv = xb[k];
        float q = minifloat ? table[cb[k]] : (float)qb[k];
        float d = q * s - xv;
        float ad = fabsf(d), ax = fabsf(xv);
        *sx += (double)xv * xv;
        *se += (double)d * d;
        *m = ad > *m ? ad : *m;
        *p = ax > *p ? ax : *p;
    }
}

/* A segment's f32 sums of squares in this range lost nothing that matters to underflow and did not
 * overflow (else it is summed again in double), as qcli.codec.stats takes a chunk's. */
#define F32_ENERGY_FLOOR 0x1p-90f
#define F32_ENERGY_CEILING 0x1p120f

#if defined(__GNUC__)
/* Eight lanes at once in the compiler's vector types (AVX2's registers where the clone has them). */
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef int8_t i8x8 __attribute__((vector_size(8)));
#define LANES 8
#define SEGMENT 256 /* elements summed in f32 lanes before the sums go into double: 32 terms a lane */

/* `into` raised lane by lane to `a` where `a` is larger (a NaN lane of `a` is not; see the sums) */
#define RAISE(into, a)                                                                                        \
    do {                                                                                                      \
        f32x8 raised_ = (a);                                                                                  \
        i32x8 take_ = raised_ > (into);                                                                       \
        (into) = (f32x8)(((i32x8)raised_ & take_) | ((i32x8)(into) & ~take_));                               \
    } while (0)
#define MAGNITUDE(a) ((f32x8)((i32x8)(a) & 0x7FFFFFFF))
#else
#define LANES 0 /* the scalar loop alone */
#endif

INLINED void measure_encoded_of(const float *x, const void *fields, const float *table, const float *scales,
                                float *errors, float *peaks, Py_ssize_t blocks, Py_ssize_t elements,
                                double *signal, double *error, const int minifloat) {
    double total_signal = 0.0, total_error = 0.0;
#if LANES
    Py_ssize_t whole = elements / LANES * LANES;
#else
    Py_ssize_t whole = 0;
#endif
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const float *xb = x + b * elements;
        const int8_t *qb = (const int8_t *)fields + b * elements;
        const uint8_t *cb = (const uint8_t *)fields + b * elements;
        const float s = scales[b];
        double block_signal = 0.0, block_error = 0.0;
        float m = 0.0f, p = 0.0f;
#if LANES
        const f32x8 sv = (f32x8){0} + s;
        f32x8 worst = {0}, peak = {0};
        for (Py_ssize_t start = 0; start < whole; start += SEGMENT) {
            Py_ssize_t stop = start + SEGMENT < whole ? start + SEGMENT : whole;
            f32x8 sx = {0}, se = {0};
            for (Py_ssize_t k = start; k < stop; k += LANES) {
                f32x8 xv, q;
                memcpy(&xv, xb + k, sizeof xv);
                if (minifloat) {
                    q = (f32x8){table[cb[k]], table[cb[k + 1]], table[cb[k + 2]], table[cb[k + 3]],
                                table[cb[k + 4]], table[cb[k + 5]], table[cb[k + 6]], table[cb[k + 7]]};
                } else {
                    i8x8 codes;
                    memcpy(&codes, qb + k, sizeof codes);
                    q = __builtin_convertvector(codes, f32x8);
                }
                f32x8 d = q * sv - xv;
                sx += xv * xv;
                se += d * d;
                RAISE(worst, MAGNITUDE(d));
                RAISE(peak, MAGNITUDE(xv));
            }
            float fs = 0.0f, fe = 0.0f;
            for (int j = 0; j < LANES; j++) {
                fs += sx[j];
                fe += se[j];
            }
            if (fs >= F32_ENERGY_FLOOR && fs <= F32_ENERGY_CEILING && fe >= F32_ENERGY_FLOOR &&
                fe <= F32_ENERGY_CEILING) {
                for (int j = 0; j < LANES; j++) {
                    block_signal += sx[j];
                    block_error += se[j];
                }
            } else { /* summed again in double, a NaN kept */
                block_tail(xb, qb, cb, table, s, start, stop, &block_signal, &block_error, &m, &p, minifloat);
            }
        }
        for (int j = 0; j < LANES; j++) {
            m = worst[j] > m ? worst[j] : m;
            p = peak[j] > p ? peak[j] : p;
        }
#endif
        block_tail(xb, qb, cb, table, s, whole, elements, &block_signal, &block_error, &m, &p, minifloat);
        if (block_error != block_error) m = NAN; /* a NaN difference: its square made the sum NaN */
        if (m != m || m > errors[b]) errors[b] = m;
        if (peaks && p > peaks[b]) peaks[b] = p;
        total_signal += block_signal;
        total_error += block_error;
    }
    *signal = total_signal;
    *error = total_error;
}

CLONES static void measure_encoded(const float *x, const void *fields, const float *table, const float *scales,
                                   float *errors, float *peaks, Py_ssize_t blocks, Py_ssize_t elements,
                                   double *signal, double *error) {
    if (table) measure_encoded_of(x, fields, table, scales, errors, peaks, blocks, elements, signal, error, 1);
    else measure_encoded_of(x, fields, table, scales, errors, peaks, blocks, elements, signal, error, 0);
}

/* measured(x, fields, table, scales, errors, peaks, blocks, elements) -> (sum x^2, sum difference^2)
 *
 * x: f32 [blocks, elements], contiguous; fields: the codes of the same shape, one byte each (int8 integers,
 * or uint8 minifloat codes with `table` the f32 value of each of the 256 bytes; 0 for integers); scales:
 * f32 [blocks], each block's decode scale; errors, peaks (0 for none): f32 [blocks], raised to each block's
 * largest |difference| and |x|. The interpreter's lock is released while it runs. */
static PyObject *measured(PyObject *self, PyObject *args) {
    unsigned long long xp, fp, tp, sp, ep, pp;
    Py_ssize_t blocks, elements;
    if (!PyArg_ParseTuple(args, "KKKKKKnn", &xp, &fp, &tp, &sp, &ep, &pp, &blocks, &elements))
        return NULL;
    if (blocks < 0 || elements < 0) {
        PyErr_SetString(PyExc_ValueError, "measured: negative sizes");
        return NULL;
    }
    double signal = 0.0, error = 0.0;
    Py_BEGIN_ALLOW_THREADS
    measure_encoded((const float *)(uintptr_t)xp, (const void *)(uintptr_t)fp, (const float *)(uintptr_t)tp,
                    (const float *)(uintptr_t)sp, (float *)(uintptr_t)ep, (float *)(uintptr_t)pp, blocks, elements,
                    &signal, &error);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(dd)", signal, error);
}

/* qcli.codec.values.to_fields for an integer value type: each element's quotient by its block's scale
 * (one IEEE division; an exact zero stays zero where the scale is zero), clamped to [lo, hi] and rounded
 * half to even (|q| < 2^22 after the clamp: rint_small is exact), as one byte. */
CLONES static void integer_codes_of(const float *x, const float *scales, int8_t *out, Py_ssize_t blocks,
                                    Py_ssize_t elements, float lo, float hi) {
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const float *xb = x + b * elements;
        int8_t *ob = out + b * elements;
        const float s = scales[b];
        const int zero_scale = s == 0.0f;
        for (Py_ssize_t k = 0; k < elements; k++) {
            float q = xb[k] / s;
            if (zero_scale) q = xb[k] == 0.0f ? xb[k] : q;
            q = q > lo ? q : lo;
            q = q < hi ? q : hi;
            ob[k] = (int8_t)rint_small(q);
        }
    }
}

/* integer_codes(x, scales, out, blocks, elements, lo, hi): x f32 [blocks, elements] contiguous, scales f32
 * [blocks], out int8 [blocks, elements], written; lo and hi integers within a byte. The interpreter's lock
 * is released while it runs. */
static PyObject *integer_codes(PyObject *self, PyObject *args) {
    unsigned long long xp, sp, op;
    Py_ssize_t blocks, elements;
    float lo, hi;
    if (!PyArg_ParseTuple(args, "KKKnnff", &xp, &sp, &op, &blocks, &elements, &lo, &hi)) return NULL;
    if (blocks < 0 || elements < 0 || !(lo >= -128.0f && hi <= 127.0f && lo <= hi)) {
        PyErr_SetString(PyExc_ValueError, "integer_codes: negative sizes or a range wider than a byte");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    integer_codes_of((const float *)(uintptr_t)xp, (const float *)(uintptr_t)sp, (int8_t *)(uintptr_t)op, blocks,
                     elements, lo, hi);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* qcli.codec.minifloat.encode, one element at a time: the code (one byte) of each f32 value, already
 * clamped to the format's range, of `mbits` mantissa bits and bias `bias`: normal values round their f32
 * mantissa to nearest, ties to even, by the integer trick (which carries into the exponent), subnormal
 * ones (below `min_normal`, f32 bits) scale exactly by `inverse` (a power of two) onto the subnormal
 * spacing and round half to even; `sign_bit` is set for a negative value (a -0 code included). */
CLONES static void minifloat_codes_of(const float *v, uint8_t *out, Py_ssize_t n, int mbits, int bias,
                                      uint32_t sign_bit, uint32_t min_normal, float inverse) {
    const int shift = 23 - mbits;
    const int32_t rebias = (int32_t)(127 - bias) << mbits;
    for (Py_ssize_t k = 0; k < n; k++) {
        uint32_t bits = bits_of(v[k]);
        int32_t mag = (int32_t)(bits & 0x7FFFFFFFu);
        int32_t normal = (((mag >> shift) & 1) + mag + ((1 << (shift - 1)) - 1)) >> shift;
        normal -= rebias;
        float scaled = float_of((uint32_t)mag) * inverse;
        scaled = scaled < 4194304.0f ? scaled : 0.0f; /* only a subnormal's is used: below 2^22, rint_small exact */
        int32_t subnormal = (int32_t)rint_small(scaled);
        int32_t code = (uint32_t)mag < min_normal ? subnormal : normal;
        out[k] = (uint8_t)(code | (bits >> 31 ? (int32_t)sign_bit : 0));
    }
}

/* minifloat_codes(v, out, n, mbits, bias, sign_bit, min_normal, inverse): v f32 [n], contiguous, within the
 * format's range; out: uint8 [n], written. The interpreter's lock is released while it runs. */
static PyObject *minifloat_codes(PyObject *self, PyObject *args) {
    unsigned long long vp, op;
    Py_ssize_t n;
    int mbits, bias;
    unsigned int sign_bit, min_normal;
    float inverse;
    if (!PyArg_ParseTuple(args, "KKniiIIf", &vp, &op, &n, &mbits, &bias, &sign_bit, &min_normal, &inverse))
        return NULL;
    if (n < 0 || mbits < 1 || mbits > 22 || sign_bit > 0x80u) {
        PyErr_SetString(PyExc_ValueError, "minifloat_codes: a negative size or a format wider than a byte");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    minifloat_codes_of((const float *)(uintptr_t)vp, (uint8_t *)(uintptr_t)op, n, mbits, bias, sign_bit, min_normal,
                       inverse);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"errors", errors, METH_VARARGS, "Each candidate scale's exact error on each block (docs/arithmetic.md §6)."},
    {"search", search_blocks, METH_VARARGS, "Each block's candidate scale of least error (docs/arithmetic.md §6)."},
    {"measured", measured, METH_VARARGS, "A chunk's error sums and each block's largest error, from its codes."},
    {"minifloat_codes", minifloat_codes, METH_VARARGS, "Each f32 value's minifloat code (qcli.codec.minifloat)."},
    {"integer_codes", integer_codes, METH_VARARGS, "Each f32 value's integer code at its block's scale."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_search", NULL, -1, methods};

PyMODINIT_FUNC PyInit__search(void) { return PyModule_Create(&module); }
