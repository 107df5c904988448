/* The simulator's fp16 and bf16 reductions give the same bits on every path.
 *
 * The reduction kernels (hcclpy/sim/src/hccl/kernels.c, included here so that its static
 * functions can be called) have portable code and, on x86 processors with AVX2 and F16C, a
 * second compilation that converts with F16C. Ranks on different processors must store the same
 * bits, so this program checks, on the processor it runs on:
 *
 *   - every one of the 2^32 floats narrows to the same fp16 on both paths, every NaN to 0x7E00
 *     (and bf16 narrowing is round-to-nearest-even, every NaN 0x7FC0, for every float);
 *   - every fp16 and bf16 value widens to the same float on both paths;
 *   - whole reductions (sum, prod, max, min; 1, 2, 3 and 5 inputs; NaN, infinities and subnormals
 *     among the inputs; streaming and cached stores) agree bit for bit.
 *
 * Without AVX2 and F16C only the bf16 rule and the portable kernels are checked. It prints one
 * FAIL line per disagreement (at most a few per check) and ends with RESULT: PASS or FAIL.
 */
#include "hccl/kernels.c"

#include <stdio.h>

static int g_failures;

static void fail(const char *what, uint32_t input, uint32_t got, uint32_t expected)
{
    if (++g_failures <= 20)
        printf("FAIL %s: input 0x%08x gives 0x%04x, expected 0x%04x\n", what, input, got, expected);
}

/* bf16 narrowing written the plain way: the one quiet NaN, otherwise round to nearest even. */
static uint16_t reference_bf16(uint32_t bits)
{
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
        return 0x7FC0u;
    uint32_t rest = bits & 0xFFFFu, kept = bits >> 16;
    if (rest > 0x8000u || (rest == 0x8000u && (kept & 1u)))
        kept++;
    return (uint16_t)kept;
}

enum { CHUNK = 1 << 16 };

#ifdef HAVE_AVX2_KERNELS
/* Called only where the processor has AVX2 and F16C (a caller of these is compiled for them). */
AVX2 static void narrow_half_fast(uint16_t *dst, const float *src, size_t m)
{
    narrow_half_f16c(dst, src, m);
}

AVX2 static void widen_half_fast(float *dst, const uint16_t *src, size_t m)
{
    widen_half_f16c(dst, src, m);
}
#endif

static void check_narrowing(bool avx2)
{
    static float floats[CHUNK];
    static uint16_t portable[CHUNK], fast[CHUNK], bf16[CHUNK];
    for (uint64_t base = 0; base < (1ull << 32); base += CHUNK) {
        for (uint32_t i = 0; i < CHUNK; i++)
            floats[i] = bits_to_float((uint32_t)base + i);
        narrow_half(portable, floats, CHUNK);
        narrow_bf16(bf16, floats, CHUNK);
#ifdef HAVE_AVX2_KERNELS
        if (avx2)
            narrow_half_fast(fast, floats, CHUNK);
#else
        (void)avx2;
#endif
        for (uint32_t i = 0; i < CHUNK; i++) {
            uint32_t bits = (uint32_t)base + i;
            if (bf16[i] != reference_bf16(bits))
                fail("bf16 narrowing", bits, bf16[i], reference_bf16(bits));
            if (avx2 && fast[i] != portable[i])
                fail("fp16 narrowing, F16C against portable", bits, fast[i], portable[i]);
            if (floats[i] != floats[i] && portable[i] != 0x7E00u)
                fail("fp16 narrowing of a NaN", bits, portable[i], 0x7E00u);
        }
    }
}

static void check_widening(bool avx2)
{
    static uint16_t halves[CHUNK];
    static float portable[CHUNK], bf16[CHUNK];
    for (uint32_t i = 0; i < CHUNK; i++)
        halves[i] = (uint16_t)i;
    widen_half(portable, halves, CHUNK);
    widen_bf16(bf16, halves, CHUNK);
    for (uint32_t i = 0; i < CHUNK; i++) {
        uint32_t got = float_to_bits(bf16[i]);
        if (got != i << 16)
            fail("bf16 widening", i, got, i << 16);
        /* NaNs may keep different payloads as floats; only their narrowing is stored. */
        if (portable[i] == portable[i] && float_to_half(portable[i]) != i)
            fail("fp16 round trip", i, float_to_half(portable[i]), i);
    }
#ifdef HAVE_AVX2_KERNELS
    if (avx2) {
        static float fast[CHUNK];
        widen_half_fast(fast, halves, CHUNK);
        for (uint32_t i = 0; i < CHUNK; i++) {
            bool both_nan = portable[i] != portable[i] && fast[i] != fast[i];
            if (!both_nan && float_to_bits(fast[i]) != float_to_bits(portable[i]))
                fail("fp16 widening, F16C against portable", i, float_to_bits(fast[i]), float_to_bits(portable[i]));
        }
    }
#else
    (void)avx2;
#endif
}

static uint64_t g_random = 0x9E3779B97F4A7C15ull;

static uint16_t random_half(void)
{
    g_random ^= g_random << 13, g_random ^= g_random >> 7, g_random ^= g_random << 17;
    return (uint16_t)(g_random >> 24);
}

/* Whole kernels: the portable table against the one pick_kernels() chose. */
static void check_kernels(const kernel_t portable[12][4])
{
    enum { COUNT = 3000, MAX_INPUTS = 5 };
    static uint16_t inputs[MAX_INPUTS][COUNT], expected[COUNT], got[COUNT];
    const int input_counts[] = {1, 2, 3, 5};
    const HcclDataType types[] = {HCCL_DATA_TYPE_FP16, HCCL_DATA_TYPE_BFP16};
    for (int k = 0; k < MAX_INPUTS; k++)
        for (int i = 0; i < COUNT; i++)
            inputs[k][i] = random_half(); /* every pattern: NaNs, infinities, subnormals too */
    const void *ins[MAX_INPUTS] = {inputs[0], inputs[1], inputs[2], inputs[3], inputs[4]};
    for (int t = 0; t < 2; t++)
        for (int op = 0; op < 4; op++)
            for (int n = 0; n < 4; n++)
                for (int streaming = 0; streaming < 2; streaming++) {
                    void *want[1] = {expected}, *have[1] = {got};
                    portable[types[t]][op](want, 1, ins, input_counts[n], COUNT, streaming);
                    g_kernels[types[t]][op](have, 1, ins, input_counts[n], COUNT, streaming);
                    for (int i = 0; i < COUNT; i++)
                        if (got[i] != expected[i]) {
                            char what[96];
                            snprintf(what, sizeof what, "%s %s of %d inputs%s, element %d", hccl_dtype_name(types[t]),
                                     hccl_op_name((uint32_t)op), input_counts[n], streaming ? ", streaming" : "", i);
                            fail(what, inputs[0][i], got[i], expected[i]);
                        }
                }
}

int main(void)
{
    kernel_t portable[12][4];
    memcpy(portable, g_kernels, sizeof portable);
    pthread_once(&g_pick_once, pick_kernels);
    bool avx2 = memcmp(portable, g_kernels, sizeof portable) != 0;
#ifdef HAVE_AVX2_KERNELS
    bool wanted = has_avx2_f16c() && !portable_kernels_requested();
    if (avx2 != wanted)
        fail("kernel choice", (uint32_t)has_avx2_f16c(), (uint32_t)avx2, (uint32_t)wanted);
#endif
    printf("kernels: %s\n", avx2 ? "AVX2 and F16C, checked against the portable ones" : "portable only");
    check_narrowing(avx2);
    check_widening(avx2);
    check_kernels((const kernel_t(*)[4])portable);
    printf("RESULT: %s\n", g_failures ? "FAIL" : "PASS");
    return g_failures ? 1 : 0;
}
