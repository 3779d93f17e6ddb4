/* gradnode native CPU encoder: chunked top-k, level fitting, quantisation and index coding.
 *
 * Plain C99, no torch headers. gradnode.node.native compiles this file at first use and registers it
 * with gradnode.protocol.codec.set_cpu_kernel; the torch code in protocol/ is the specification and
 * every byte written here must equal what it writes (tests/test_native.py checks that).
 *
 * One call encodes a whole update. Phase A runs over every chunk of every tensor (OpenMP when built
 * with it): the chunk is gathered once as |x| bit patterns into an L1-resident buffer while the next
 * chunk is prefetched; for non-negative floats the uint32 bit pattern orders like the value, so all
 * selection is integer compares. Column maxima (column c = positions c, c+L, c+2L, ...) give a bound
 * t: k columns reach it, so k distinct values do, so the k-th largest is >= t. One branch-free
 * vector scan collects the candidates (values >= t, ~2% of a chunk) in ascending position order;
 * the exact k-th largest T among them comes from bisection on the bit pattern; values > T are kept,
 * and of the values == T the lowest positions (the torch path's tie rule). Phase B runs per tensor:
 * levels, codes, packed values, then packed12 positions or the two Rice streams. A final pass moves
 * the tensors' sections together into one contiguous body.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __AVX2__
#include <immintrin.h>
#endif

enum { GN_OK = 0, GN_NONFINITE = 1, GN_NOMEM = 2, GN_OVERFLOW = 3 };
enum { GN_PACKED = 0, GN_RICE = 1 };

#define GN_ABI 1
#define GN_INF_BITS 0x7f800000u
#define GN_MAX_RICE 16
#define GN_QUANTILE_SAMPLE 2048
#define GN_LLOYD_ITERS 2
#define GN_FIXED_BITS 32
#define GN_BOUND_ITERS 7

typedef struct {
    int64_t offset, stride, a, h, b, w;
} gn_group;

typedef struct {
    const uint32_t *x;   /* contiguous fp32 tensor, read as bit patterns */
    const gn_group *groups;
    int64_t n_groups;
    int64_t n_sel;       /* kept values: sum over groups of n_chunks * min(k, chunk_numel) */
    int64_t *flat_index; /* out [n_sel] */
    float *values;       /* out [n_sel]: raw kept values after phase A, reconstruction after B */
    int32_t *pos;        /* scratch [n_sel]: in-chunk positions, then Rice gaps */
    float *levels;       /* out [1 << (bits - 1)] */
    uint8_t *out;        /* out: this tensor's sections, at most out_cap bytes */
    int64_t out_cap;
    int64_t section_len[3]; /* out: values, then packed positions or Rice low bits and unary bits */
    int64_t n_sections;     /* out */
    int64_t rice_r;         /* out */
    int64_t rice_ubits;     /* out */
    int64_t status;         /* out: GN_OK or an error */
} gn_tensor;

int gn_abi_version(void) { return GN_ABI; }

int gn_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* ------------------------------------------------------------------ selection (phase A) */

static int count_ge(const uint32_t *v, int n, uint32_t t) {
    int c = 0;
    for (int i = 0; i < n; i++) c += v[i] >= t;
    return c;
}

/* Given count_ge(lo) >= k > count_ge(hi), narrow [lo, hi) by bisection; iters < 0 runs to the exact
 * k-th largest value. Returns lo, which always has count_ge(lo) >= k. */
static uint32_t bisect_kth(const uint32_t *v, int n, int k, uint32_t lo, uint32_t hi, int iters) {
    while (hi - lo > 1 && iters-- != 0) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (count_ge(v, n, mid) >= k) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Exact k-th largest of v[0..n), given count_ge(lo) >= k and hi = max(v). Bisection first on the top
 * bits only (few steps: the range spans a few binades), then on the few values sharing the found
 * prefix, compacted into band (room for n). */
static uint32_t kth_largest(const uint32_t *v, int n, int k, uint32_t lo, uint32_t hi, uint32_t *band) {
    enum { LOW = 12 };
    uint32_t plo = lo >> LOW, phi = (hi >> LOW) + 1;
    while (phi - plo > 1) {
        const uint32_t mid = plo + (phi - plo) / 2;
        if (count_ge(v, n, mid << LOW) >= k) plo = mid;
        else phi = mid;
    }
    const uint32_t floor_ = plo << LOW, ceil_ = floor_ + (1u << LOW);
    int nb = 0, above = 0;
    for (int i = 0; i < n; i++) {
        band[nb] = v[i];
        nb += (v[i] >= floor_) & (v[i] < ceil_);
        above += v[i] >= ceil_;
    }
    return bisect_kth(band, nb, k - above, floor_ > lo ? floor_ : lo, ceil_, -1);
}

/* Columns of the bound: about 4k of them, or 0 when the chunk is too small for a useful bound. */
static int bound_columns(int n, int k) {
    int cols = (4 * k + 7) / 8 * 8;
    return 2 * cols <= n ? cols : 0;
}

/* Per-thread buffers for one chunk of up to n values, with 8 spare entries for whole-vector stores. */
typedef struct {
    uint32_t *mag, *colmax, *cmag, *band;
    int32_t *cand;
} gn_scratch;

static int scratch_alloc(gn_scratch *s, int64_t n) {
    s->mag = malloc((size_t)(n + 8) * 4);
    s->colmax = malloc((size_t)(n + 8) * 4);
    s->cmag = malloc((size_t)(n + 8) * 4);
    s->band = malloc((size_t)(n + 8) * 4);
    s->cand = malloc((size_t)(n + 8) * 4);
    return s->mag && s->colmax && s->cmag && s->band && s->cand;
}

static void scratch_free(gn_scratch *s) {
    free(s->mag);
    free(s->colmax);
    free(s->cmag);
    free(s->band);
    free(s->cand);
}

#ifdef __AVX2__
/* lanes set in each 8-bit mask, lowest first (zero padded) */
static const int32_t compress_lut[256][8] = {
    {0,0,0,0,0,0,0,0}, {0,0,0,0,0,0,0,0}, {1,0,0,0,0,0,0,0}, {0,1,0,0,0,0,0,0}, {2,0,0,0,0,0,0,0}, {0,2,0,0,0,0,0,0},
    {1,2,0,0,0,0,0,0}, {0,1,2,0,0,0,0,0}, {3,0,0,0,0,0,0,0}, {0,3,0,0,0,0,0,0}, {1,3,0,0,0,0,0,0}, {0,1,3,0,0,0,0,0},
    {2,3,0,0,0,0,0,0}, {0,2,3,0,0,0,0,0}, {1,2,3,0,0,0,0,0}, {0,1,2,3,0,0,0,0}, {4,0,0,0,0,0,0,0}, {0,4,0,0,0,0,0,0},
    {1,4,0,0,0,0,0,0}, {0,1,4,0,0,0,0,0}, {2,4,0,0,0,0,0,0}, {0,2,4,0,0,0,0,0}, {1,2,4,0,0,0,0,0}, {0,1,2,4,0,0,0,0},
    {3,4,0,0,0,0,0,0}, {0,3,4,0,0,0,0,0}, {1,3,4,0,0,0,0,0}, {0,1,3,4,0,0,0,0}, {2,3,4,0,0,0,0,0}, {0,2,3,4,0,0,0,0},
    {1,2,3,4,0,0,0,0}, {0,1,2,3,4,0,0,0}, {5,0,0,0,0,0,0,0}, {0,5,0,0,0,0,0,0}, {1,5,0,0,0,0,0,0}, {0,1,5,0,0,0,0,0},
    {2,5,0,0,0,0,0,0}, {0,2,5,0,0,0,0,0}, {1,2,5,0,0,0,0,0}, {0,1,2,5,0,0,0,0}, {3,5,0,0,0,0,0,0}, {0,3,5,0,0,0,0,0},
    {1,3,5,0,0,0,0,0}, {0,1,3,5,0,0,0,0}, {2,3,5,0,0,0,0,0}, {0,2,3,5,0,0,0,0}, {1,2,3,5,0,0,0,0}, {0,1,2,3,5,0,0,0},
    {4,5,0,0,0,0,0,0}, {0,4,5,0,0,0,0,0}, {1,4,5,0,0,0,0,0}, {0,1,4,5,0,0,0,0}, {2,4,5,0,0,0,0,0}, {0,2,4,5,0,0,0,0},
    {1,2,4,5,0,0,0,0}, {0,1,2,4,5,0,0,0}, {3,4,5,0,0,0,0,0}, {0,3,4,5,0,0,0,0}, {1,3,4,5,0,0,0,0}, {0,1,3,4,5,0,0,0},
    {2,3,4,5,0,0,0,0}, {0,2,3,4,5,0,0,0}, {1,2,3,4,5,0,0,0}, {0,1,2,3,4,5,0,0}, {6,0,0,0,0,0,0,0}, {0,6,0,0,0,0,0,0},
    {1,6,0,0,0,0,0,0}, {0,1,6,0,0,0,0,0}, {2,6,0,0,0,0,0,0}, {0,2,6,0,0,0,0,0}, {1,2,6,0,0,0,0,0}, {0,1,2,6,0,0,0,0},
    {3,6,0,0,0,0,0,0}, {0,3,6,0,0,0,0,0}, {1,3,6,0,0,0,0,0}, {0,1,3,6,0,0,0,0}, {2,3,6,0,0,0,0,0}, {0,2,3,6,0,0,0,0},
    {1,2,3,6,0,0,0,0}, {0,1,2,3,6,0,0,0}, {4,6,0,0,0,0,0,0}, {0,4,6,0,0,0,0,0}, {1,4,6,0,0,0,0,0}, {0,1,4,6,0,0,0,0},
    {2,4,6,0,0,0,0,0}, {0,2,4,6,0,0,0,0}, {1,2,4,6,0,0,0,0}, {0,1,2,4,6,0,0,0}, {3,4,6,0,0,0,0,0}, {0,3,4,6,0,0,0,0},
    {1,3,4,6,0,0,0,0}, {0,1,3,4,6,0,0,0}, {2,3,4,6,0,0,0,0}, {0,2,3,4,6,0,0,0}, {1,2,3,4,6,0,0,0}, {0,1,2,3,4,6,0,0},
    {5,6,0,0,0,0,0,0}, {0,5,6,0,0,0,0,0}, {1,5,6,0,0,0,0,0}, {0,1,5,6,0,0,0,0}, {2,5,6,0,0,0,0,0}, {0,2,5,6,0,0,0,0},
    {1,2,5,6,0,0,0,0}, {0,1,2,5,6,0,0,0}, {3,5,6,0,0,0,0,0}, {0,3,5,6,0,0,0,0}, {1,3,5,6,0,0,0,0}, {0,1,3,5,6,0,0,0},
    {2,3,5,6,0,0,0,0}, {0,2,3,5,6,0,0,0}, {1,2,3,5,6,0,0,0}, {0,1,2,3,5,6,0,0}, {4,5,6,0,0,0,0,0}, {0,4,5,6,0,0,0,0},
    {1,4,5,6,0,0,0,0}, {0,1,4,5,6,0,0,0}, {2,4,5,6,0,0,0,0}, {0,2,4,5,6,0,0,0}, {1,2,4,5,6,0,0,0}, {0,1,2,4,5,6,0,0},
    {3,4,5,6,0,0,0,0}, {0,3,4,5,6,0,0,0}, {1,3,4,5,6,0,0,0}, {0,1,3,4,5,6,0,0}, {2,3,4,5,6,0,0,0}, {0,2,3,4,5,6,0,0},
    {1,2,3,4,5,6,0,0}, {0,1,2,3,4,5,6,0}, {7,0,0,0,0,0,0,0}, {0,7,0,0,0,0,0,0}, {1,7,0,0,0,0,0,0}, {0,1,7,0,0,0,0,0},
    {2,7,0,0,0,0,0,0}, {0,2,7,0,0,0,0,0}, {1,2,7,0,0,0,0,0}, {0,1,2,7,0,0,0,0}, {3,7,0,0,0,0,0,0}, {0,3,7,0,0,0,0,0},
    {1,3,7,0,0,0,0,0}, {0,1,3,7,0,0,0,0}, {2,3,7,0,0,0,0,0}, {0,2,3,7,0,0,0,0}, {1,2,3,7,0,0,0,0}, {0,1,2,3,7,0,0,0},
    {4,7,0,0,0,0,0,0}, {0,4,7,0,0,0,0,0}, {1,4,7,0,0,0,0,0}, {0,1,4,7,0,0,0,0}, {2,4,7,0,0,0,0,0}, {0,2,4,7,0,0,0,0},
    {1,2,4,7,0,0,0,0}, {0,1,2,4,7,0,0,0}, {3,4,7,0,0,0,0,0}, {0,3,4,7,0,0,0,0}, {1,3,4,7,0,0,0,0}, {0,1,3,4,7,0,0,0},
    {2,3,4,7,0,0,0,0}, {0,2,3,4,7,0,0,0}, {1,2,3,4,7,0,0,0}, {0,1,2,3,4,7,0,0}, {5,7,0,0,0,0,0,0}, {0,5,7,0,0,0,0,0},
    {1,5,7,0,0,0,0,0}, {0,1,5,7,0,0,0,0}, {2,5,7,0,0,0,0,0}, {0,2,5,7,0,0,0,0}, {1,2,5,7,0,0,0,0}, {0,1,2,5,7,0,0,0},
    {3,5,7,0,0,0,0,0}, {0,3,5,7,0,0,0,0}, {1,3,5,7,0,0,0,0}, {0,1,3,5,7,0,0,0}, {2,3,5,7,0,0,0,0}, {0,2,3,5,7,0,0,0},
    {1,2,3,5,7,0,0,0}, {0,1,2,3,5,7,0,0}, {4,5,7,0,0,0,0,0}, {0,4,5,7,0,0,0,0}, {1,4,5,7,0,0,0,0}, {0,1,4,5,7,0,0,0},
    {2,4,5,7,0,0,0,0}, {0,2,4,5,7,0,0,0}, {1,2,4,5,7,0,0,0}, {0,1,2,4,5,7,0,0}, {3,4,5,7,0,0,0,0}, {0,3,4,5,7,0,0,0},
    {1,3,4,5,7,0,0,0}, {0,1,3,4,5,7,0,0}, {2,3,4,5,7,0,0,0}, {0,2,3,4,5,7,0,0}, {1,2,3,4,5,7,0,0}, {0,1,2,3,4,5,7,0},
    {6,7,0,0,0,0,0,0}, {0,6,7,0,0,0,0,0}, {1,6,7,0,0,0,0,0}, {0,1,6,7,0,0,0,0}, {2,6,7,0,0,0,0,0}, {0,2,6,7,0,0,0,0},
    {1,2,6,7,0,0,0,0}, {0,1,2,6,7,0,0,0}, {3,6,7,0,0,0,0,0}, {0,3,6,7,0,0,0,0}, {1,3,6,7,0,0,0,0}, {0,1,3,6,7,0,0,0},
    {2,3,6,7,0,0,0,0}, {0,2,3,6,7,0,0,0}, {1,2,3,6,7,0,0,0}, {0,1,2,3,6,7,0,0}, {4,6,7,0,0,0,0,0}, {0,4,6,7,0,0,0,0},
    {1,4,6,7,0,0,0,0}, {0,1,4,6,7,0,0,0}, {2,4,6,7,0,0,0,0}, {0,2,4,6,7,0,0,0}, {1,2,4,6,7,0,0,0}, {0,1,2,4,6,7,0,0},
    {3,4,6,7,0,0,0,0}, {0,3,4,6,7,0,0,0}, {1,3,4,6,7,0,0,0}, {0,1,3,4,6,7,0,0}, {2,3,4,6,7,0,0,0}, {0,2,3,4,6,7,0,0},
    {1,2,3,4,6,7,0,0}, {0,1,2,3,4,6,7,0}, {5,6,7,0,0,0,0,0}, {0,5,6,7,0,0,0,0}, {1,5,6,7,0,0,0,0}, {0,1,5,6,7,0,0,0},
    {2,5,6,7,0,0,0,0}, {0,2,5,6,7,0,0,0}, {1,2,5,6,7,0,0,0}, {0,1,2,5,6,7,0,0}, {3,5,6,7,0,0,0,0}, {0,3,5,6,7,0,0,0},
    {1,3,5,6,7,0,0,0}, {0,1,3,5,6,7,0,0}, {2,3,5,6,7,0,0,0}, {0,2,3,5,6,7,0,0}, {1,2,3,5,6,7,0,0}, {0,1,2,3,5,6,7,0},
    {4,5,6,7,0,0,0,0}, {0,4,5,6,7,0,0,0}, {1,4,5,6,7,0,0,0}, {0,1,4,5,6,7,0,0}, {2,4,5,6,7,0,0,0}, {0,2,4,5,6,7,0,0},
    {1,2,4,5,6,7,0,0}, {0,1,2,4,5,6,7,0}, {3,4,5,6,7,0,0,0}, {0,3,4,5,6,7,0,0}, {1,3,4,5,6,7,0,0}, {0,1,3,4,5,6,7,0},
    {2,3,4,5,6,7,0,0}, {0,2,3,4,5,6,7,0}, {1,2,3,4,5,6,7,0}, {0,1,2,3,4,5,6,7},
};
#endif

/* Positions with mag >= t, ascending, and their magnitudes; returns how many. cand and cmag need
 * room for n + 8 entries (the vector path stores whole vectors). Branch-free: hits are rare and
 * scattered, so branching on them mispredicts. */
static int collect(const uint32_t *restrict mag, int n, uint32_t t, int32_t *restrict cand, uint32_t *restrict cmag) {
    int nc = 0, i = 0;
#ifdef __AVX2__
    /* |x| bit patterns are below 2**31, so a signed compare orders them (and t = 0 takes all) */
    const __m256i below = _mm256_set1_epi32((int32_t)t - 1), eight = _mm256_set1_epi32(8);
    __m256i at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (; i + 8 <= n; i += 8) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(mag + i));
        const int hits = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(v, below)));
        const __m256i perm = _mm256_loadu_si256((const __m256i *)compress_lut[hits]);
        _mm256_storeu_si256((__m256i *)(cand + nc), _mm256_permutevar8x32_epi32(at, perm));
        _mm256_storeu_si256((__m256i *)(cmag + nc), _mm256_permutevar8x32_epi32(v, perm));
        nc += __builtin_popcount((unsigned)hits);
        at = _mm256_add_epi32(at, eight);
    }
#endif
    for (; i < n; i++) {
        cand[nc] = i;
        cmag[nc] = mag[i];
        nc += mag[i] >= t;
    }
    return nc;
}

/* Gather one chunk as |x| bit patterns into mag (row r at mag + r * w), with fused set also its column
 * maxima. Meanwhile prefetch the chunk at next (if >= 0, same geometry): its rows are more streams
 * than hardware prefetchers follow, and the prefetch overlaps this chunk's selection work. */
static void gather_chunk(const uint32_t *x, int64_t base, int64_t stride, int h, int w, int L, int fused,
                         uint32_t *restrict mag, uint32_t *restrict colmax, int64_t next) {
    if (fused) memset(colmax, 0, (size_t)L * 4);
    for (int r = 0; r < h; r++) {
        const uint32_t *restrict src = x + base + (int64_t)r * stride;
        uint32_t *restrict dst = mag + r * w;
        if (fused) {
            uint32_t *restrict cm = colmax + (r * w) % L;
            for (int c = 0; c < w; c++) {
                const uint32_t a = src[c] & 0x7fffffffu;
                dst[c] = a;
                cm[c] = a > cm[c] ? a : cm[c];
            }
        } else {
            for (int c = 0; c < w; c++) dst[c] = src[c] & 0x7fffffffu;
        }
        if (next >= 0)
            for (int c = 0; c < w; c += 16) __builtin_prefetch(x + next + (int64_t)r * stride + c, 0, 2);
    }
}

/* Top-k of one gathered chunk of h rows of w values (row r at x + base + r * stride in the tensor).
 * Writes the k positions ascending to pos, their flat indices and raw values. GN_NONFINITE on NaN/Inf. */
static int select_chunk(const uint32_t *x, int64_t base, int64_t stride, int h, int w, int k, int L, int fused,
                        const uint32_t *mag, uint32_t *colmax, gn_scratch *s, int32_t *pos, int64_t *flat_index,
                        float *values) {
    const int n = h * w;
    uint32_t top = 0;
    const uint32_t *cmag = mag;
    const int32_t *cand = NULL;
    int nc = n;
    uint32_t t = 0;
    if (L) {
        if (!fused) {
            const int rows = n / L, rem = n % L;
            memcpy(colmax, mag, (size_t)L * 4);
            for (int rr = 1; rr < rows; rr++) {
                const uint32_t *restrict row = mag + rr * L;
                for (int c = 0; c < L; c++) colmax[c] = row[c] > colmax[c] ? row[c] : colmax[c];
            }
            const uint32_t *restrict last = mag + rows * L;
            for (int c = 0; c < rem; c++) colmax[c] = last[c] > colmax[c] ? last[c] : colmax[c];
        }
        uint32_t lo = colmax[0];
        for (int c = 0; c < L; c++) {
            top = colmax[c] > top ? colmax[c] : top;
            lo = colmax[c] < lo ? colmax[c] : lo;
        }
        if (top >= GN_INF_BITS) return GN_NONFINITE;
        t = bisect_kth(colmax, L, k, lo, top + 1, GN_BOUND_ITERS);
        nc = collect(mag, n, t, s->cand, s->cmag);
        cmag = s->cmag;
        cand = s->cand;
    } else {
        for (int i = 0; i < n; i++) top = mag[i] > top ? mag[i] : top;
        if (top >= GN_INF_BITS) return GN_NONFINITE;
    }
    /* exact k-th largest T among the candidates, then > T, and == T from the lowest position up */
    int kept = 0;
    if (k >= nc) {
        for (int i = 0; i < nc; i++) pos[i] = cand ? cand[i] : i;
        kept = nc;
    } else {
        const uint32_t T = kth_largest(cmag, nc, k, t, top, s->band);
        const int need = k - count_ge(cmag, nc, T + 1);
        for (int i = 0, seen = 0; kept < k; i++) {
            const uint32_t m = cmag[i];
            const int eq = m == T;
            const int take = (m > T) | (eq & (seen < need));
            seen += eq;
            pos[kept] = cand ? cand[i] : i;
            kept += take;
        }
    }
    const int shift = (w & (w - 1)) == 0 ? __builtin_ctz((unsigned)w) : -1;
    for (int j = 0; j < kept; j++) {
        const int p = pos[j];
        const int row = shift >= 0 ? p >> shift : p / w;
        const int64_t fi = stride == w ? base + p : base + (int64_t)row * stride + (p - row * w);
        uint32_t bits = x[fi];
        float v;
        memcpy(&v, &bits, 4);
        flat_index[j] = fi;
        values[j] = v;
    }
    return GN_OK;
}

/* ------------------------------------------------------------------ levels and codes (phase B) */

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Moves the values of v[lo..hi) below pivot to the front (branch-free swaps); returns where they end. */
static int partition_below(uint32_t *v, int lo, int hi, uint32_t pivot) {
    int store = lo;
    for (int i = lo; i < hi; i++) {
        const uint32_t e = v[i];
        v[i] = v[store];
        v[store] = e;
        store += e < pivot;
    }
    return store;
}

/* Value of rank `rank` (ascending) in v[lo..hi), leaving smaller values before it and larger after
 * (quickselect; each round splits off < pivot and == pivot, so repeated values cannot stall it). */
static uint32_t select_rank(uint32_t *v, int lo, int hi, int rank) {
    while (hi - lo > 1) {
        const uint32_t a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi - 1];
        const uint32_t pivot = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
        const int lt = partition_below(v, lo, hi, pivot);
        const int le = partition_below(v, lt, hi, pivot + 1);
        if (rank < lt) hi = lt;
        else if (rank >= le) lo = le;
        else return pivot;
    }
    return v[rank];
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Index of the level a magnitude falls in: the number of edges <= m (edges ascending). */
static int level_index(float m, const float *edges, int n_edges) {
    int lo = 0, hi = n_edges;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (edges[mid] <= m) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void sort_floats(float *v, int n) {
    for (int i = 1; i < n; i++) {
        const float e = v[i];
        int j = i;
        for (; j > 0 && v[j - 1] > e; j--) v[j] = v[j - 1];
        v[j] = e;
    }
}

/* trunc(|v| * 2**s) for |v| given as bit pattern a, exactly as (int64_t)((double)|v| * 2**s), in
 * integer ops the compiler vectorises; callers guarantee the result is below 2**32. */
static uint32_t fixed_of(uint32_t a, int s) {
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | (e ? 0x800000u : 0);
    const int sh = (int)(e ? e : 1) - 150 + s;
    /* a nonzero m has sh <= 31 (the result fits 32 bits); m < 2**24, so a right shift by 31 is 0 */
    const int left = sh > 0 ? (sh < 31 ? sh : 31) : 0, right = sh < 0 ? (-sh < 31 ? -sh : 31) : 0;
    return (m << left) >> right;
}

/* Mirrors gradnode.protocol.quant.fit_levels exactly: sums are integers in fixed point
 * (|v| * 2**s truncated, s = 32 - exponent of the max), so no summation order can change a level. */
static int fit_levels(const float *values, int64_t n, int n_levels, float *levels) {
    if (n == 0) {
        for (int j = 0; j < n_levels; j++) levels[j] = 0.0f;
        return GN_OK;
    }
    uint32_t top = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint32_t m = fbits(values[i]) & 0x7fffffffu;
        top = m > top ? m : top;
    }
    int e;
    frexp((double)float_of(top), &e);
    const int s = GN_FIXED_BITS - e;
    const double unscale = ldexp(1.0, -s);
    if (n_levels == 1) {
        uint64_t sum = 0;
        for (int64_t i = 0; i < n; i++) sum += fixed_of(fbits(values[i]) & 0x7fffffffu, s);
        levels[0] = (float)(((double)sum / (double)n) * unscale);
        return GN_OK;
    }
    const int64_t step = n / GN_QUANTILE_SAMPLE > 1 ? n / GN_QUANTILE_SAMPLE : 1;
    const int64_t m = (n + step - 1) / step;
    uint32_t *sample = malloc((size_t)m * 4);
    int64_t *counts = malloc((size_t)n_levels * 8), *sums = malloc((size_t)n_levels * 8);
    float *edges = malloc((size_t)n_levels * 4);
    if (!sample || !counts || !sums || !edges) {
        free(sample), free(counts), free(sums), free(edges);
        return GN_NOMEM;
    }
    for (int64_t i = 0; i < m; i++) sample[i] = fbits(values[i * step]) & 0x7fffffffu;
    int from = 0;
    for (int j = 0; j < n_levels; j++) { /* ranks ascend, so each search starts past the previous */
        const int64_t rank = ((2 * (int64_t)j + 1) * (m - 1) + n_levels) / (2 * (int64_t)n_levels);
        levels[j] = float_of(select_rank(sample, from, (int)m, (int)rank));
        from = (int)rank;
    }
    for (int it = 0; it < GN_LLOYD_ITERS; it++) {
        for (int j = 0; j + 1 < n_levels; j++) edges[j] = (levels[j] + levels[j + 1]) / 2.0f;
        memset(counts, 0, (size_t)n_levels * 8);
        memset(sums, 0, (size_t)n_levels * 8);
        if (n_levels == 2) {
            uint64_t n_up = 0, s_up = 0, s_all = 0;
            const uint32_t edge = fbits(edges[0]); /* >= 0, so bit patterns order like values */
            for (int64_t i = 0; i < n; i++) {
                const uint32_t a = fbits(values[i]) & 0x7fffffffu;
                const uint32_t f = fixed_of(a, s), up = a >= edge;
                s_all += f;
                n_up += up;
                s_up += f & (0u - up);
            }
            counts[0] = n - (int64_t)n_up, counts[1] = (int64_t)n_up;
            sums[0] = (int64_t)(s_all - s_up), sums[1] = (int64_t)s_up;
        } else {
            for (int64_t i = 0; i < n; i++) {
                const float a = fabsf(values[i]);
                const int idx = level_index(a, edges, n_levels - 1);
                counts[idx] += 1;
                sums[idx] += fixed_of(fbits(a), s);
            }
        }
        for (int j = 0; j < n_levels; j++)
            if (counts[j] > 0) levels[j] = (float)(((double)sums[j] / (double)counts[j]) * unscale);
        sort_floats(levels, n_levels);
    }
    free(sample), free(counts), free(sums), free(edges);
    return GN_OK;
}

/* LSB-first fixed-width fields (width <= 32), exactly (n * width + 7) / 8 bytes in all. */
typedef struct {
    uint8_t *out;
    uint64_t acc;
    int nbits;
} bit_writer;

static void put_bits(bit_writer *bw, uint32_t v, int width) {
    bw->acc |= (uint64_t)v << bw->nbits;
    bw->nbits += width;
    if (bw->nbits >= 32) {
        for (int b = 0; b < 4; b++) bw->out[b] = (uint8_t)(bw->acc >> (8 * b));
        bw->out += 4;
        bw->acc >>= 32;
        bw->nbits -= 32;
    }
}

static void flush_bits(bit_writer *bw) {
    for (; bw->nbits > 0; bw->nbits -= 8) {
        *bw->out++ = (uint8_t)bw->acc;
        bw->acc >>= 8;
    }
    bw->acc = 0;
    bw->nbits = 0;
}

static void store_le(uint8_t *out, uint64_t word, int nbytes) {
    for (int b = 0; b < nbytes; b++) out[b] = (uint8_t)(word >> (8 * b));
}

static int64_t packed_nbytes(int64_t count, int width) { return (count * width + 7) / 8; }

/* Values: quantise, write codes, and replace each raw value by its reconstruction. */
static int64_t encode_values(float *values, int64_t n, int bits, const float *levels, uint8_t *out) {
    const int n_levels = 1 << (bits - 1);
    float edges[128];
    for (int j = 0; j + 1 < n_levels; j++) edges[j] = (levels[j] + levels[j + 1]) / 2.0f;
    bit_writer bw = {out, 0, 0};
    if (bits == 2) { /* integer ops only: branches on random signs mispredict */
        const uint32_t edge = fbits(edges[0]), lv[2] = {fbits(levels[0]), fbits(levels[1])};
        for (int64_t i = 0; i < n; i += 4) {
            uint32_t byte = 0;
            for (int64_t q = 0; q < 4 && i + q < n; q++) {
                uint32_t u;
                memcpy(&u, values + i + q, 4);
                const uint32_t a = u & 0x7fffffffu;
                const uint32_t neg = (u >> 31) & (a != 0); /* v < 0: -0.0 counts as positive */
                const uint32_t idx = a >= edge;
                byte |= (neg << 1 | idx) << (2 * q);
                u = lv[idx] | neg << 31;
                memcpy(values + i + q, &u, 4);
            }
            out[i >> 2] = (uint8_t)byte;
        }
        return packed_nbytes(n, bits);
    } else {
        for (int64_t i = 0; i < n; i++) {
            const float v = values[i];
            const int neg = v < 0.0f;
            const int idx = n_levels == 1 ? 0 : level_index(fabsf(v), edges, n_levels - 1);
            put_bits(&bw, (uint32_t)((neg << (bits - 1)) | idx), bits);
            values[i] = neg ? -levels[idx] : levels[idx];
        }
    }
    flush_bits(&bw);
    return packed_nbytes(n, bits);
}

/* Mirrors gradnode.protocol.indexcode.best_rice_param. */
static int best_rice_param(const int32_t *g, int64_t n, int64_t *ubits) {
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) total += g[i];
    double x = ((double)total / (double)n) * 0.6931;
    if (x < 1.0) x = 1.0;
    int e;
    frexp(x, &e);
    int guess = e - 1;
    guess = guess < 0 ? 0 : (guess > GN_MAX_RICE ? GN_MAX_RICE : guess);
    int best_r = guess;
    int64_t best_cost = -1, best_high = 0;
    for (int r = guess > 0 ? guess - 1 : 0; r <= (guess < GN_MAX_RICE ? guess + 1 : GN_MAX_RICE); r++) {
        int64_t high = 0;
        for (int64_t i = 0; i < n; i++) high += g[i] >> r;
        const int64_t cost = n * r + high;
        if (best_cost < 0 || cost < best_cost) best_r = r, best_cost = cost, best_high = high;
    }
    *ubits = n + best_high;
    return best_r;
}

static int finish_tensor(gn_tensor *t, int k, int bits, int index_mode, int index_width) {
    const int64_t n = t->n_sel;
    const int n_levels = 1 << (bits - 1);
    int rc = fit_levels(t->values, n, n_levels, t->levels);
    if (rc != GN_OK) return rc;
    const int64_t vbytes = packed_nbytes(n, bits);
    if (vbytes > t->out_cap) return GN_OVERFLOW;
    encode_values(t->values, n, bits, t->levels, t->out);
    t->section_len[0] = vbytes;
    uint8_t *idx_out = t->out + vbytes;
    const int64_t room = t->out_cap - vbytes;
    if (index_mode == GN_PACKED) {
        const int64_t ibytes = packed_nbytes(n, index_width);
        if (ibytes > room) return GN_OVERFLOW;
        bit_writer bw = {idx_out, 0, 0};
        for (int64_t i = 0; i < n; i++) put_bits(&bw, (uint32_t)t->pos[i], index_width);
        flush_bits(&bw);
        t->section_len[1] = ibytes;
        t->n_sections = 2;
        return GN_OK;
    }
    int32_t *g = t->pos; /* positions -> gaps p_i - p_{i-1} - 1, p_{-1} = -1 per chunk */
    int64_t at = 0;
    for (int64_t gi = 0; gi < t->n_groups; gi++) {
        const gn_group *gr = &t->groups[gi];
        const int64_t numel = gr->h * gr->w, kg = k < numel ? k : numel;
        for (int64_t c = 0; c < gr->a * gr->b; c++, at += kg) {
            int32_t prev = -1;
            for (int64_t j = 0; j < kg; j++) {
                const int32_t p = g[at + j];
                g[at + j] = p - prev - 1;
                prev = p;
            }
        }
    }
    int64_t ubits = 0;
    const int r = n ? best_rice_param(g, n, &ubits) : 0;
    const int64_t lbytes = packed_nbytes(n, r), ubytes = (ubits + 7) / 8;
    if (lbytes + ubytes > room) return GN_OVERFLOW;
    if (r) {
        bit_writer bw = {idx_out, 0, 0};
        const uint32_t mask = (1u << r) - 1;
        for (int64_t i = 0; i < n; i++) put_bits(&bw, (uint32_t)g[i] & mask, r);
        flush_bits(&bw);
    }
    uint8_t *unary = idx_out + lbytes;
    memset(unary, 0, (size_t)ubytes);
    uint64_t word = 0;
    int64_t bit = -1, at_word = 0;
    for (int64_t i = 0; i < n; i++) {
        bit += (int64_t)(g[i] >> r) + 1;
        if (bit >> 6 != at_word) {
            store_le(unary + 8 * at_word, word, 8);
            at_word = bit >> 6, word = 0;
        }
        word |= (uint64_t)1 << (bit & 63);
    }
    store_le(unary + 8 * at_word, word, ubytes - 8 * at_word < 8 ? (int)(ubytes - 8 * at_word) : 8);
    t->section_len[1] = lbytes;
    t->section_len[2] = ubytes;
    t->n_sections = 3;
    t->rice_r = r;
    t->rice_ubits = ubits;
    return GN_OK;
}

/* ------------------------------------------------------------------ the batch entry point */

typedef struct {
    int32_t tensor, group;
    int64_t chunk;     /* index within the group: grid row chunk / b, column chunk % b */
    int64_t first_sel; /* offset of the chunk's first kept value in the tensor's arrays */
} gn_unit;

static int64_t chunk_base(const gn_group *g, int64_t chunk) {
    return g->offset + chunk / g->b * g->h * g->stride + chunk % g->b * g->w;
}

/* Encode n tensors; on return each tensor's status is set, and if all are GN_OK the sections lie
 * back to back from body (body_len bytes). Returns the first non-OK status, or GN_OK. */
int gn_encode_batch(gn_tensor *tensors, int64_t n, int64_t k, int64_t bits, int64_t index_mode,
                    int64_t index_width, int64_t n_threads, uint8_t *body, int64_t *body_len) {
    int64_t n_units = 0, max_numel = 1;
    (void)n_threads; /* unused without OpenMP */
    for (int64_t i = 0; i < n; i++) {
        tensors[i].status = GN_OK;
        tensors[i].section_len[0] = tensors[i].section_len[1] = tensors[i].section_len[2] = 0;
        tensors[i].n_sections = 0, tensors[i].rice_r = 0, tensors[i].rice_ubits = 0;
        for (int64_t gi = 0; gi < tensors[i].n_groups; gi++) {
            const gn_group *g = &tensors[i].groups[gi];
            n_units += g->a * g->b;
            max_numel = g->h * g->w > max_numel ? g->h * g->w : max_numel;
        }
    }
    gn_unit *units = malloc((size_t)(n_units ? n_units : 1) * sizeof(gn_unit));
    if (!units) return GN_NOMEM;
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t sel = 0;
        for (int64_t gi = 0; gi < tensors[i].n_groups; gi++) {
            const gn_group *g = &tensors[i].groups[gi];
            const int64_t kg = k < g->h * g->w ? k : g->h * g->w;
            for (int64_t c = 0; c < g->a * g->b; c++, sel += kg)
                units[u++] = (gn_unit){(int32_t)i, (int32_t)gi, c, sel};
        }
    }
    int failed = 0;
#ifdef _OPENMP
    if (n_threads < 1) n_threads = 1;
#pragma omp parallel num_threads((int)n_threads) if (n_threads > 1 && n_units > 1)
#endif
    {
        gn_scratch s;
        const int ok = scratch_alloc(&s, max_numel);
        if (!ok) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = GN_NOMEM;
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 16)
#endif
        for (int64_t ui = 0; ui < n_units; ui++) {
            if (!ok) continue;
            const gn_unit *un = &units[ui];
            gn_tensor *t = &tensors[un->tensor];
            const gn_group *g = &t->groups[un->group];
            const int h = (int)g->h, w = (int)g->w, numel = h * w, kg = (int)(k < numel ? k : numel);
            const int L = kg < numel ? bound_columns(numel, kg) : 0, fused = L && L % w == 0;
            const int64_t base = chunk_base(g, un->chunk);
            const int same = ui + 1 < n_units && units[ui + 1].tensor == un->tensor && units[ui + 1].group == un->group;
            const int64_t next = same ? chunk_base(g, un->chunk + 1) : -1;
            gather_chunk(t->x, base, g->stride, h, w, L, fused, s.mag, s.colmax, next);
            if (select_chunk(t->x, base, g->stride, h, w, kg, L, fused, s.mag, s.colmax, &s, t->pos + un->first_sel,
                             t->flat_index + un->first_sel, t->values + un->first_sel) != GN_OK) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
                t->status = GN_NONFINITE;
            }
        }
        scratch_free(&s);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t i = 0; i < n; i++) {
            if (failed || tensors[i].status != GN_OK) continue;
            tensors[i].status = finish_tensor(&tensors[i], (int)k, (int)bits, (int)index_mode, (int)index_width);
        }
    }
    free(units);
    if (failed) return failed;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        gn_tensor *t = &tensors[i];
        if (t->status != GN_OK) return (int)t->status;
        const int64_t len = t->section_len[0] + t->section_len[1] + t->section_len[2];
        memmove(body + at, t->out, (size_t)len); /* t->out >= body + at: regions only move down */
        at += len;
    }
    *body_len = at;
    return GN_OK;
}
