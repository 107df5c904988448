/* Data types and reduction kernels.
 *
 * Reductions run block by block: each block of every input is combined into
 * an accumulator that fits in L1, in rank order (so every rank computes
 * bit-identical results), and then stored to every output.  fp16 and bf16
 * accumulate in fp32 and are rounded to nearest-even once, at the store.
 * Integer arithmetic wraps (it is done on the unsigned type).  The loops are
 * plain element loops the compiler vectorises; the fp16 conversions are
 * branch-free bit arithmetic for the same reason.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hccl/internal.h"


/* The library is built at -O2, where GCC does not vectorise these loops. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

size_t hccl_dtype_size(HcclDataType dtype)
{
    switch (dtype) {
    case HCCL_DATA_TYPE_INT8:
    case HCCL_DATA_TYPE_UINT8: return 1;
    case HCCL_DATA_TYPE_INT16:
    case HCCL_DATA_TYPE_UINT16:
    case HCCL_DATA_TYPE_FP16:
    case HCCL_DATA_TYPE_BFP16: return 2;
    case HCCL_DATA_TYPE_INT32:
    case HCCL_DATA_TYPE_UINT32:
    case HCCL_DATA_TYPE_FP32: return 4;
    case HCCL_DATA_TYPE_INT64:
    case HCCL_DATA_TYPE_UINT64:
    case HCCL_DATA_TYPE_FP64: return 8;
    default: return 0;
    }
}

const char *hccl_dtype_name(uint32_t dtype)
{
    static const char *const names[] = {"int8", "int16", "int32", "fp16", "fp32", "int64", "uint64",
                                        "uint8", "uint16", "uint32", "fp64", "bf16", "int128"};
    if (dtype < sizeof names / sizeof names[0])
        return names[dtype];
    switch (dtype) {
    case HCCL_DATA_TYPE_HIF8: return "hif8";
    case HCCL_DATA_TYPE_FP8E4M3: return "fp8e4m3";
    case HCCL_DATA_TYPE_FP8E5M2: return "fp8e5m2";
    case HCCL_DATA_TYPE_FP8E8M0: return "fp8e8m0";
    default: return "unknown dtype";
    }
}

const char *hccl_op_name(uint32_t op)
{
    static const char *const names[] = {"sum", "prod", "max", "min"};
    return op < 4 ? names[op] : "unknown op";
}

const char *hccl_cmd_name(uint32_t type)
{
    switch (type) {
    case HCCL_CMD_BROADCAST: return "broadcast";
    case HCCL_CMD_ALLREDUCE: return "all_reduce";
    case HCCL_CMD_REDUCE: return "reduce";
    case HCCL_CMD_SEND: return "send";
    case HCCL_CMD_RECEIVE: return "recv";
    case HCCL_CMD_ALLGATHER: return "all_gather";
    case HCCL_CMD_REDUCE_SCATTER: return "reduce_scatter";
    case HCCL_CMD_ALLTOALLV: return "all_to_all_v";
    case HCCL_CMD_ALLTOALLVC: return "all_to_all_vc";
    case HCCL_CMD_ALLTOALL: return "all_to_all";
    case HCCL_CMD_SCATTER: return "scatter";
    case HCCL_CMD_BATCH_SEND_RECV: return "batch_send_recv";
    case HCCL_CMD_ALLGATHER_V: return "all_gather_v";
    case HCCL_CMD_REDUCE_SCATTER_V: return "reduce_scatter_v";
    case HCCL_CMD_BARRIER: return "barrier";
    default: return "unknown operation";
    }
}

/* ------------------------------------------------------ half conversions */

static inline float bits_to_float(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint32_t float_to_bits(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

/* IEEE half -> float.  Normal numbers are rebased by shifting the exponent
 * and scaling; subnormals are rebuilt exactly with a magic-number
 * subtraction; infinities and NaNs come out of the scaling unchanged.  The
 * choice is made with masks, not branches, so loops over it vectorise. */
static inline float half_to_float(uint16_t h)
{
    uint32_t w = (uint32_t)h << 16;
    uint32_t sign = w & 0x80000000u;
    uint32_t two_w = w + w;
    uint32_t normal = float_to_bits(bits_to_float((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f);
    uint32_t subnormal = float_to_bits(bits_to_float((two_w >> 17) | (126u << 23)) - 0.5f);
    uint32_t is_subnormal = 0u - (uint32_t)(two_w < (1u << 27));
    return bits_to_float(sign | (subnormal & is_subnormal) | (normal & ~is_subnormal));
}

/* float -> IEEE half, round to nearest even.  Scaling by 2^112 and 2^-110
 * lets the FPU do the rounding at the half's precision; overflow becomes
 * infinity.  Every NaN becomes the one quiet NaN 0x7E00: the sign and payload
 * of a NaN that arithmetic produced depend on the order in which the compiler
 * put the operands, which differs between builds of a kernel.  Branch-free,
 * as above. */
static inline uint16_t float_to_half(float f)
{
    float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t w = float_to_bits(f);
    uint32_t shl1_w = w + w;
    uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    uint32_t small = 0u - (uint32_t)(bias < 0x71000000u);
    bias = (bias & ~small) | (0x71000000u & small);
    base = bits_to_float((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = float_to_bits(base);
    uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    uint32_t is_nan = 0u - (uint32_t)(shl1_w > 0xFF000000u);
    return (uint16_t)((((sign >> 16) | nonsign) & ~is_nan) | (0x7E00u & is_nan));
}

static inline float bf16_to_float(uint16_t h)
{
    return bits_to_float((uint32_t)h << 16);
}

/* float -> bf16, round to nearest even; every NaN becomes the quiet NaN
 * 0x7FC0, for the reason given above.  Branch-free, as above. */
static inline uint16_t float_to_bf16(float f)
{
    uint32_t bits = float_to_bits(f);
    uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    uint32_t is_nan = 0u - (uint32_t)((bits & 0x7FFFFFFFu) > 0x7F800000u);
    return (uint16_t)((0x7FC0u & is_nan) | (rounded & ~is_nan));
}

/* ------------------------------------------------------ block conversions */

/* The 16-bit floats are widened to fp32 a block at a time and narrowed back
 * once.  The portable loops vectorise with SSE2 for bf16 but not for fp16
 * (1.3 ns per element reduced).  On x86 processors with AVX2 and F16C the
 * kernels of both types are compiled a second time for those instructions
 * and chosen at run time; F16C converts eight fp16 elements per instruction,
 * and a NaN is then made the same quiet NaN the portable code gives: both
 * kernels store the same bits. */
#define INLINE static inline __attribute__((always_inline))

INLINE void widen_half(float *dst, const uint16_t *src, size_t m)
{
    for (size_t i = 0; i < m; i++)
        dst[i] = half_to_float(src[i]);
}

INLINE void narrow_half(uint16_t *dst, const float *src, size_t m)
{
    for (size_t i = 0; i < m; i++)
        dst[i] = float_to_half(src[i]);
}

INLINE void widen_bf16(float *dst, const uint16_t *src, size_t m)
{
    for (size_t i = 0; i < m; i++)
        dst[i] = bf16_to_float(src[i]);
}

INLINE void narrow_bf16(uint16_t *dst, const float *src, size_t m)
{
    for (size_t i = 0; i < m; i++)
        dst[i] = float_to_bf16(src[i]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_AVX2_KERNELS 1
#define AVX2 __attribute__((target("avx2,f16c")))
#include <cpuid.h>
#include <immintrin.h>

AVX2 INLINE void widen_half_f16c(float *dst, const uint16_t *src, size_t m)
{
    size_t i = 0;
    for (; i + 8 <= m; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    widen_half(dst + i, src + i, m - i);
}

AVX2 INLINE void narrow_half_f16c(uint16_t *dst, const float *src, size_t m)
{
    const __m128i quiet_nan = _mm_set1_epi16(0x7E00);
    size_t i = 0;
    for (; i + 8 <= m; i += 8) {
        __m256 x = _mm256_loadu_ps(src + i);
        __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        __m128i nan = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
        _mm_storeu_si128((__m128i *)(dst + i), _mm_or_si128(_mm_andnot_si128(nan, h), _mm_and_si128(nan, quiet_nan)));
    }
    narrow_half(dst + i, src + i, m - i);
}

/* AVX2 and F16C, and the AVX state saved by the operating system. */
static bool has_avx2_f16c(void)
{
    unsigned a, b, c, d;
    const unsigned osxsave = 1u << 27, avx = 1u << 28, f16c = 1u << 29;
    if (!__get_cpuid(1, &a, &b, &c, &d) || (c & (osxsave | avx | f16c)) != (osxsave | avx | f16c))
        return false;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6u) != 6u) /* XMM and YMM registers */
        return false;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 5)) != 0;
}
#endif

/* ------------------------------------------------------------- operators */

#define OP_ISUM(U, a, b) ((U)(a) + (U)(b))
#define OP_IPROD(U, a, b) ((U)(a) * (U)(b))
#define OP_FSUM(U, a, b) ((a) + (b))
#define OP_FPROD(U, a, b) ((a) * (b))
#define OP_MAX(U, a, b) ((a) > (b) || (a) != (a) ? (a) : (b))
#define OP_MIN(U, a, b) ((a) < (b) || (a) != (a) ? (a) : (b))

enum { BLOCK = 1024, STREAMING_BLOCK_BYTES = 256 };

/* Stores one block to an output.  A streaming block of whole cache lines at
 * an aligned address is stored inline: sim_copy is a call into the runtime
 * library, per block and output (64 MiB all_reduces ~5 % slower). */
static inline void store_block(void *dst, const void *src, size_t bytes, bool streaming)
{
#if defined(__x86_64__)
    if (streaming && ((uintptr_t)dst & 15) == 0 && bytes % 64 == 0) {
        sim_stream_lines(dst, src, bytes / 64);
        return;
    }
#endif
    sim_copy(dst, src, bytes, streaming);
}

/* One kernel per (element type, operator): T is the element, U the type
 * arithmetic is done in.  Two inputs are combined straight into the first
 * output, block by block, and the block is copied to the others: each output
 * element is written after both inputs at its index were read, so in-place
 * operation is safe, and the data passes through L1 once instead of three
 * times.  More inputs and streaming stores go through the accumulator. */
#define DEFINE_KERNEL(name, T, U, OP)                                                                        \
    static void name(void *const *outs, int nout, const void *const *ins, int nin, uint64_t count,          \
                     bool streaming)                                                                          \
    {                                                                                                         \
        T acc[BLOCK];                                                                                         \
        bool direct = nin == 2 && !streaming;                                                                 \
        uint64_t block = streaming ? STREAMING_BLOCK_BYTES / sizeof(T) : BLOCK;                               \
        for (uint64_t start = 0; start < count; start += block) {                                            \
            size_t m = (size_t)(count - start < block ? count - start : block);                               \
            const T *a = (const T *)ins[0] + start;                                                           \
            if (direct) {                                                                                     \
                const T *b = (const T *)ins[1] + start;                                                       \
                T *first = (T *)outs[0] + start;                                                              \
                for (size_t i = 0; i < m; i++)                                                                \
                    first[i] = (T)OP(U, a[i], b[i]);                                                          \
                for (int k = 1; k < nout; k++)                                                                \
                    memcpy((T *)outs[k] + start, first, m * sizeof(T));                                       \
                continue;                                                                                     \
            }                                                                                                 \
            if (nin >= 2) {                                                                                   \
                const T *b = (const T *)ins[1] + start;                                                       \
                for (size_t i = 0; i < m; i++)                                                                \
                    acc[i] = (T)OP(U, a[i], b[i]);                                                            \
            } else {                                                                                          \
                for (size_t i = 0; i < m; i++)                                                                \
                    acc[i] = a[i];                                                                            \
            }                                                                                                 \
            for (int k = 2; k < nin; k++) {                                                                   \
                const T *c = (const T *)ins[k] + start;                                                       \
                for (size_t i = 0; i < m; i++)                                                                \
                    acc[i] = (T)OP(U, acc[i], c[i]);                                                          \
            }                                                                                                 \
            for (int k = 0; k < nout; k++)                                                                    \
                store_block((T *)outs[k] + start, acc, m * sizeof(T), streaming);                            \
        }                                                                                                     \
    }

/* The 16-bit floats: inputs are widened to fp32 and combined in rank order,
 * element by element as they are loaded (LOAD), or with BLOCKWISE a block of
 * each input at a time (WIDEN: F16C converts blocks); the block is narrowed
 * once. */
#define DEFINE_WIDENING_KERNEL(name, ATTRIBUTES, OP, LOAD, WIDEN, NARROW, BLOCKWISE)                        \
    ATTRIBUTES static void name(void *const *outs, int nout, const void *const *ins, int nin, uint64_t count, \
                                bool streaming)                                                               \
    {                                                                                                         \
        float acc[BLOCK], widened[BLOCK];                                                                     \
        uint16_t result[BLOCK];                                                                               \
        uint64_t block = streaming ? STREAMING_BLOCK_BYTES / sizeof(uint16_t) : BLOCK;                        \
        for (uint64_t start = 0; start < count; start += block) {                                            \
            size_t m = (size_t)(count - start < block ? count - start : block);                               \
            const uint16_t *a = (const uint16_t *)ins[0] + start;                                             \
            int k = 1;                                                                                        \
            if (BLOCKWISE) {                                                                                  \
                WIDEN(acc, a, m);                                                                             \
            } else if (nin >= 2) {                                                                            \
                const uint16_t *b = (const uint16_t *)ins[1] + start;                                         \
                for (size_t i = 0; i < m; i++)                                                                \
                    acc[i] = OP(float, LOAD(a[i]), LOAD(b[i]));                                               \
                k = 2;                                                                                        \
            } else {                                                                                          \
                for (size_t i = 0; i < m; i++)                                                                \
                    acc[i] = LOAD(a[i]);                                                                      \
            }                                                                                                 \
            for (; k < nin; k++) {                                                                            \
                const uint16_t *c = (const uint16_t *)ins[k] + start;                                         \
                if (BLOCKWISE) {                                                                              \
                    WIDEN(widened, c, m);                                                                     \
                    for (size_t i = 0; i < m; i++)                                                            \
                        acc[i] = OP(float, acc[i], widened[i]);                                               \
                } else {                                                                                      \
                    for (size_t i = 0; i < m; i++)                                                            \
                        acc[i] = OP(float, acc[i], LOAD(c[i]));                                               \
                }                                                                                             \
            }                                                                                                 \
            NARROW(result, acc, m);                                                                           \
            for (int j = 0; j < nout; j++)                                                                    \
                store_block((uint16_t *)outs[j] + start, result, m * sizeof(uint16_t), streaming);           \
        }                                                                                                     \
    }

#define DEFINE_INT_KERNELS(tag, T, U)                                 \
    DEFINE_KERNEL(reduce_sum_##tag, T, U, OP_ISUM)                   \
    DEFINE_KERNEL(reduce_prod_##tag, T, U, OP_IPROD)                 \
    DEFINE_KERNEL(reduce_max_##tag, T, U, OP_MAX)                    \
    DEFINE_KERNEL(reduce_min_##tag, T, U, OP_MIN)

#define DEFINE_FLOAT_KERNELS(tag, T)                                  \
    DEFINE_KERNEL(reduce_sum_##tag, T, T, OP_FSUM)                   \
    DEFINE_KERNEL(reduce_prod_##tag, T, T, OP_FPROD)                 \
    DEFINE_KERNEL(reduce_max_##tag, T, T, OP_MAX)                    \
    DEFINE_KERNEL(reduce_min_##tag, T, T, OP_MIN)

#define DEFINE_WIDENING_KERNELS(tag, ATTRIBUTES, LOAD, WIDEN, NARROW, BLOCKWISE)                                \
    DEFINE_WIDENING_KERNEL(reduce_sum_##tag, ATTRIBUTES, OP_FSUM, LOAD, WIDEN, NARROW, BLOCKWISE)              \
    DEFINE_WIDENING_KERNEL(reduce_prod_##tag, ATTRIBUTES, OP_FPROD, LOAD, WIDEN, NARROW, BLOCKWISE)            \
    DEFINE_WIDENING_KERNEL(reduce_max_##tag, ATTRIBUTES, OP_MAX, LOAD, WIDEN, NARROW, BLOCKWISE)               \
    DEFINE_WIDENING_KERNEL(reduce_min_##tag, ATTRIBUTES, OP_MIN, LOAD, WIDEN, NARROW, BLOCKWISE)

DEFINE_INT_KERNELS(i8, int8_t, uint8_t)
DEFINE_INT_KERNELS(i16, int16_t, uint16_t)
DEFINE_INT_KERNELS(i32, int32_t, uint32_t)
DEFINE_INT_KERNELS(i64, int64_t, uint64_t)
DEFINE_INT_KERNELS(u8, uint8_t, uint8_t)
DEFINE_INT_KERNELS(u16, uint16_t, uint16_t)
DEFINE_INT_KERNELS(u32, uint32_t, uint32_t)
DEFINE_INT_KERNELS(u64, uint64_t, uint64_t)
DEFINE_FLOAT_KERNELS(f32, float)
DEFINE_FLOAT_KERNELS(f64, double)
DEFINE_WIDENING_KERNELS(f16, , half_to_float, widen_half, narrow_half, false)
DEFINE_WIDENING_KERNELS(bf16, , bf16_to_float, widen_bf16, narrow_bf16, false)
#ifdef HAVE_AVX2_KERNELS
DEFINE_WIDENING_KERNELS(f16_avx2, AVX2, half_to_float, widen_half_f16c, narrow_half_f16c, true)
DEFINE_WIDENING_KERNELS(bf16_avx2, AVX2, bf16_to_float, widen_bf16, narrow_bf16, false)
#endif

typedef void (*kernel_t)(void *const *, int, const void *const *, int, uint64_t, bool);

#define KERNEL_ROW(tag) {reduce_sum_##tag, reduce_prod_##tag, reduce_max_##tag, reduce_min_##tag}

/* Indexed by HcclDataType, then HcclReduceOp. */
static kernel_t g_kernels[12][4] = {
    KERNEL_ROW(i8),  KERNEL_ROW(i16), KERNEL_ROW(i32), KERNEL_ROW(f16),
    KERNEL_ROW(f32), KERNEL_ROW(i64), KERNEL_ROW(u64), KERNEL_ROW(u8),
    KERNEL_ROW(u16), KERNEL_ROW(u32), KERNEL_ROW(f64), KERNEL_ROW(bf16),
};

static pthread_once_t g_pick_once = PTHREAD_ONCE_INIT;

#ifdef HAVE_AVX2_KERNELS
/* HCCLPY_SIM_PORTABLE_KERNELS=1 keeps the portable kernels (to compare them). */
static bool portable_kernels_requested(void)
{
    const char *portable = getenv("HCCLPY_SIM_PORTABLE_KERNELS");
    return portable != NULL && strcmp(portable, "1") == 0;
}
#endif

static void pick_kernels(void)
{
#ifdef HAVE_AVX2_KERNELS
    if (has_avx2_f16c() && !portable_kernels_requested()) {
        const kernel_t f16[4] = KERNEL_ROW(f16_avx2), bf16[4] = KERNEL_ROW(bf16_avx2);
        memcpy(g_kernels[HCCL_DATA_TYPE_FP16], f16, sizeof f16);
        memcpy(g_kernels[HCCL_DATA_TYPE_BFP16], bf16, sizeof bf16);
    }
#endif
}

void hccl_reduce(void *const *outs, int nout, const void *const *ins, int nin, uint64_t count, HcclDataType dtype,
                 HcclReduceOp op, bool streaming)
{
    if (count == 0 || nout == 0)
        return;
    if (dtype == HCCL_DATA_TYPE_FP16 || dtype == HCCL_DATA_TYPE_BFP16)
        pthread_once(&g_pick_once, pick_kernels);
    g_kernels[dtype][op](outs, nout, ins, nin, count, streaming);
}
