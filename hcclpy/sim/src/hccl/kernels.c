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
 * infinity and NaN stays NaN.  Branch-free, as above. */
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
    return (uint16_t)((sign >> 16) | (0x7E00u & is_nan) | (nonsign & ~is_nan));
}

static inline float bf16_to_float(uint16_t h)
{
    return bits_to_float((uint32_t)h << 16);
}

static inline uint16_t float_to_bf16(float f)
{
    uint32_t bits = float_to_bits(f);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((bits >> 16) | 0x0040u); /* keep NaN a (quiet) NaN */
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* ------------------------------------------------------------- operators */

#define OP_ISUM(U, a, b) ((U)(a) + (U)(b))
#define OP_IPROD(U, a, b) ((U)(a) * (U)(b))
#define OP_FSUM(U, a, b) ((a) + (b))
#define OP_FPROD(U, a, b) ((a) * (b))
#define OP_MAX(U, a, b) ((a) > (b) || (a) != (a) ? (a) : (b))
#define OP_MIN(U, a, b) ((a) < (b) || (a) != (a) ? (a) : (b))

#define LOAD_SAME(x) (x)
#define STORE_SAME(T, x) ((T)(x))
#define STORE_HALF(T, x) float_to_half(x)
#define STORE_BF16(T, x) float_to_bf16(x)

/* Elements per block; with streaming stores, bytes per block.  A streaming
 * block is small because each block alternates a burst of loads with a burst
 * of stores: in blocks of 1024 elements neither kind keeps memory busy while
 * the other runs.  When the two ranks of a 2-core machine share one physical
 * core (hyperthreads), 64 MiB all_reduces took 4.6 ms in 4 KiB blocks and
 * 3.3 ms in 256-byte ones, as fast as storing each vector straight from its
 * registers (a C microbenchmark, both ranks at once). */
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

/* One kernel per (element type, operator): T is the element, A the
 * accumulator, U the type arithmetic is done in.  When the accumulator is the
 * element type (SAME), two inputs are combined straight into the first
 * output, block by block, and the block is copied to the others: each output
 * element is written after both inputs at its index were read, so in-place
 * operation is safe, and the data passes through L1 once instead of three
 * times.  More inputs, conversions and streaming stores go through the
 * accumulator. */
#define DEFINE_KERNEL(name, T, A, U, LOAD, STORE, OP, SAME)                                                  \
    static void name(void *const *outs, int nout, const void *const *ins, int nin, uint64_t count,          \
                     bool streaming)                                                                          \
    {                                                                                                         \
        A acc[BLOCK];                                                                                         \
        T result[BLOCK];                                                                                      \
        bool direct = SAME && nin == 2 && !streaming;                                                         \
        uint64_t block = streaming ? STREAMING_BLOCK_BYTES / sizeof(T) : BLOCK;                               \
        for (uint64_t start = 0; start < count; start += block) {                                            \
            size_t m = (size_t)(count - start < block ? count - start : block);                               \
            const T *a = (const T *)ins[0] + start;                                                           \
            const T *stored = result;                                                                         \
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
                    acc[i] = (A)OP(U, LOAD(a[i]), LOAD(b[i]));                                                \
            } else {                                                                                          \
                for (size_t i = 0; i < m; i++)                                                                \
                    acc[i] = LOAD(a[i]);                                                                      \
            }                                                                                                 \
            for (int k = 2; k < nin; k++) {                                                                   \
                const T *c = (const T *)ins[k] + start;                                                       \
                for (size_t i = 0; i < m; i++)                                                                \
                    acc[i] = (A)OP(U, acc[i], LOAD(c[i]));                                                    \
            }                                                                                                 \
            if (SAME) { /* the accumulator already holds the elements */                                    \
                stored = (const T *)(const void *)acc;                                                        \
            } else { /* convert once, then store the block to every output */                               \
                for (size_t i = 0; i < m; i++)                                                                \
                    result[i] = STORE(T, acc[i]);                                                             \
            }                                                                                                 \
            for (int k = 0; k < nout; k++)                                                                    \
                store_block((T *)outs[k] + start, stored, m * sizeof(T), streaming);                         \
        }                                                                                                     \
    }

#define DEFINE_INT_KERNELS(tag, T, U)                                                       \
    DEFINE_KERNEL(reduce_sum_##tag, T, T, U, LOAD_SAME, STORE_SAME, OP_ISUM, true)         \
    DEFINE_KERNEL(reduce_prod_##tag, T, T, U, LOAD_SAME, STORE_SAME, OP_IPROD, true)       \
    DEFINE_KERNEL(reduce_max_##tag, T, T, U, LOAD_SAME, STORE_SAME, OP_MAX, true)          \
    DEFINE_KERNEL(reduce_min_##tag, T, T, U, LOAD_SAME, STORE_SAME, OP_MIN, true)

#define DEFINE_FLOAT_KERNELS(tag, T, A, LOAD, STORE, SAME)                                  \
    DEFINE_KERNEL(reduce_sum_##tag, T, A, A, LOAD, STORE, OP_FSUM, SAME)                   \
    DEFINE_KERNEL(reduce_prod_##tag, T, A, A, LOAD, STORE, OP_FPROD, SAME)                 \
    DEFINE_KERNEL(reduce_max_##tag, T, A, A, LOAD, STORE, OP_MAX, SAME)                    \
    DEFINE_KERNEL(reduce_min_##tag, T, A, A, LOAD, STORE, OP_MIN, SAME)

DEFINE_INT_KERNELS(i8, int8_t, uint8_t)
DEFINE_INT_KERNELS(i16, int16_t, uint16_t)
DEFINE_INT_KERNELS(i32, int32_t, uint32_t)
DEFINE_INT_KERNELS(i64, int64_t, uint64_t)
DEFINE_INT_KERNELS(u8, uint8_t, uint8_t)
DEFINE_INT_KERNELS(u16, uint16_t, uint16_t)
DEFINE_INT_KERNELS(u32, uint32_t, uint32_t)
DEFINE_INT_KERNELS(u64, uint64_t, uint64_t)
DEFINE_FLOAT_KERNELS(f32, float, float, LOAD_SAME, STORE_SAME, true)
DEFINE_FLOAT_KERNELS(f64, double, double, LOAD_SAME, STORE_SAME, true)
DEFINE_FLOAT_KERNELS(f16, uint16_t, float, half_to_float, STORE_HALF, false)
DEFINE_FLOAT_KERNELS(bf16, uint16_t, float, bf16_to_float, STORE_BF16, false)

typedef void (*kernel_t)(void *const *, int, const void *const *, int, uint64_t, bool);

#define KERNEL_ROW(tag) {reduce_sum_##tag, reduce_prod_##tag, reduce_max_##tag, reduce_min_##tag}

/* Indexed by HcclDataType, then HcclReduceOp. */
static const kernel_t g_kernels[12][4] = {
    KERNEL_ROW(i8),  KERNEL_ROW(i16), KERNEL_ROW(i32), KERNEL_ROW(f16),
    KERNEL_ROW(f32), KERNEL_ROW(i64), KERNEL_ROW(u64), KERNEL_ROW(u8),
    KERNEL_ROW(u16), KERNEL_ROW(u32), KERNEL_ROW(f64), KERNEL_ROW(bf16),
};

void hccl_reduce(void *const *outs, int nout, const void *const *ins, int nin, uint64_t count, HcclDataType dtype,
                 HcclReduceOp op, bool streaming)
{
    if (count == 0 || nout == 0)
        return;
    g_kernels[dtype][op](outs, nout, ins, nin, count, streaming);
}
