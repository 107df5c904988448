/* Product profiles: HCCLPY_SIM_PROFILE makes the simulator accept only the
 * data types and reduce operations a real Ascend product accepts, so that a
 * program that runs here does not meet HCCL_E_NOT_SUPPORT on the cluster.
 *
 * The table restates the product documentation (reference: hccl_api.md §6.4).
 * hcclpy/profiles.py holds the same table for the binding's own checks;
 * tests/simulator/test_sim_profiles.py keeps the two in agreement, messages included. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hccl/internal.h"

#define DT(name) (1u << HCCL_DATA_TYPE_##name)
#define OP(name) (1u << HCCL_REDUCE_##name)

/* Every type the simulator moves: what AllGather, Broadcast, AlltoAll(V),
 * Scatter and Send/Recv accept on A2, A3 and 950 (950 also moves the fp8
 * types, which the simulator does not implement at all). */
#define MOVE_ALL                                                                                                      \
    (DT(INT8) | DT(UINT8) | DT(INT16) | DT(UINT16) | DT(INT32) | DT(UINT32) | DT(INT64) | DT(UINT64) | DT(FP16) |   \
     DT(FP32) | DT(FP64) | DT(BFP16))
/* The reductions' common ground: A3 in its default AI_CPU expansion mode. */
#define REDUCE_AICPU (DT(INT8) | DT(INT16) | DT(INT32) | DT(FP16) | DT(FP32) | DT(BFP16))
#define OPS_ALL (OP(SUM) | OP(PROD) | OP(MAX) | OP(MIN))
#define OPS_NO_PROD (OP(SUM) | OP(MAX) | OP(MIN))

/* What a product accepts for one group of operations. */
typedef struct {
    uint32_t dtypes;  /* bits of HcclDataType; 0: the product lacks the operation */
    uint32_t ops;     /* bits of HcclReduceOp; 0 for operations that do not reduce */
    uint32_t no_prod; /* data types with which prod is refused */
} rule_t;

/* Operations with the same rule on every product. */
enum { GROUP_REDUCE, GROUP_REDUCE_SCATTER_V, GROUP_MOVE, GROUP_ALL_GATHER_V, GROUP_ALL_TO_ALL_VC, GROUP_COUNT };

struct hccl_profile {
    const char *name;    /* the value of HCCLPY_SIM_PROFILE */
    const char *product; /* as messages name it */
    rule_t rules[GROUP_COUNT];
};

static const hccl_profile_t g_profiles[] = {
    {"910", "Atlas training", {
        /* no int16 and no bf16 anywhere on this generation */
        [GROUP_REDUCE] = {DT(INT8) | DT(INT32) | DT(INT64) | DT(FP16) | DT(FP32), OPS_ALL, 0},
        /* the documentation lists ReduceScatterV, AllGatherV and AlltoAllVC only for newer products */
        [GROUP_REDUCE_SCATTER_V] = {0, 0, 0},
        [GROUP_MOVE] = {MOVE_ALL & ~DT(BFP16), 0, 0},
        [GROUP_ALL_GATHER_V] = {0, 0, 0},
        [GROUP_ALL_TO_ALL_VC] = {0, 0, 0},
    }},
    {"A2", "Atlas A2", {
        /* default HOST expansion mode */
        [GROUP_REDUCE] = {REDUCE_AICPU | DT(INT64), OPS_ALL, DT(INT16) | DT(BFP16)},
        [GROUP_REDUCE_SCATTER_V] = {REDUCE_AICPU, OPS_NO_PROD, 0},
        [GROUP_MOVE] = {MOVE_ALL, 0, 0},
        [GROUP_ALL_GATHER_V] = {MOVE_ALL, 0, 0},
        [GROUP_ALL_TO_ALL_VC] = {MOVE_ALL, 0, 0},
    }},
    {"A3", "Atlas A3", {
        /* default AI_CPU expansion mode (AIV mode has the same limits): no int64, no prod */
        [GROUP_REDUCE] = {REDUCE_AICPU, OPS_NO_PROD, 0},
        [GROUP_REDUCE_SCATTER_V] = {REDUCE_AICPU, OPS_NO_PROD, 0},
        [GROUP_MOVE] = {MOVE_ALL, 0, 0},
        [GROUP_ALL_GATHER_V] = {MOVE_ALL, 0, 0},
        [GROUP_ALL_TO_ALL_VC] = {MOVE_ALL, 0, 0},
    }},
    {"950", "Ascend 950", {
        /* default AICPU_TS expansion mode */
        [GROUP_REDUCE] = {REDUCE_AICPU | DT(INT64) | DT(UINT64) | DT(FP64), OPS_ALL, DT(INT16) | DT(BFP16)},
        [GROUP_REDUCE_SCATTER_V] = {REDUCE_AICPU | DT(INT64), OPS_ALL, DT(INT16) | DT(BFP16)},
        [GROUP_MOVE] = {MOVE_ALL, 0, 0},
        [GROUP_ALL_GATHER_V] = {MOVE_ALL, 0, 0},
        [GROUP_ALL_TO_ALL_VC] = {MOVE_ALL, 0, 0},
    }},
};
#define PROFILE_COUNT (sizeof g_profiles / sizeof g_profiles[0])

static int group_of(uint32_t type)
{
    switch (type) {
    case HCCL_CMD_ALLREDUCE:
    case HCCL_CMD_REDUCE:
    case HCCL_CMD_REDUCE_SCATTER: return GROUP_REDUCE;
    case HCCL_CMD_REDUCE_SCATTER_V: return GROUP_REDUCE_SCATTER_V;
    case HCCL_CMD_ALLGATHER_V: return GROUP_ALL_GATHER_V;
    case HCCL_CMD_ALLTOALLVC: return GROUP_ALL_TO_ALL_VC;
    case HCCL_CMD_BARRIER: return -1; /* moves no data: nothing to limit */
    default: return GROUP_MOVE;
    }
}

bool hccl_cmd_reduces(uint32_t type)
{
    int group = group_of(type);
    return group == GROUP_REDUCE || group == GROUP_REDUCE_SCATTER_V;
}

/* ------------------------------------------------------------ the variable */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const hccl_profile_t *g_active;
static bool g_unknown;
static char g_value[64]; /* the unknown value, for the message */

static void load(void)
{
    const char *value = getenv(HCCL_SIM_PROFILE_VARIABLE);
    if (value == NULL || *value == '\0')
        return;
    for (size_t i = 0; i < PROFILE_COUNT; i++) {
        if (strcasecmp(value, g_profiles[i].name) == 0) {
            g_active = &g_profiles[i];
            return;
        }
    }
    g_unknown = true;
    snprintf(g_value, sizeof g_value, "%s", value);
}

/* Appends to a message, keeping it terminated when it is cut short. */
static void append(char *text, size_t size, const char *fmt, ...) SIM_PRINTF(3, 4);
static void append(char *text, size_t size, const char *fmt, ...)
{
    size_t used = strlen(text);
    if (used + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text + used, size - used, fmt, ap);
    va_end(ap);
}

int hccl_profile_get(const char *api, const hccl_profile_t **out)
{
    pthread_once(&g_once, load);
    if (out != NULL)
        *out = g_active;
    if (!g_unknown)
        return HCCL_SUCCESS;
    char names[64] = "";
    for (size_t i = 0; i < PROFILE_COUNT; i++)
        append(names, sizeof names, "%s%s", i ? ", " : "", g_profiles[i].name);
    return hccl_error(HCCL_E_PARA, "%s: %s='%s' is not a product profile; valid names: %s (unset or empty: no limits)",
                      api, HCCL_SIM_PROFILE_VARIABLE, g_value, names);
}

/* ------------------------------------------------------------- the check */

typedef const char *(*namer_t)(uint32_t);

static void append_bits(char *text, size_t size, uint32_t bits, namer_t name)
{
    const char *separator = "";
    for (uint32_t bit = 0; bit < 32; bit++) {
        if (bits & (1u << bit)) {
            append(text, size, "%s%s", separator, name(bit));
            separator = ", ";
        }
    }
}

/* What `profile` accepts for operation `type`, e.g. "Atlas A3 all_reduce takes
 * int8, ... with sum, max, min". */
static void describe(char *text, size_t size, const hccl_profile_t *profile, uint32_t type, int group)
{
    const rule_t *rule = &profile->rules[group];
    const char *operation = hccl_cmd_name(type);
    if (rule->dtypes == 0) {
        append(text, size, "%s has no %s (the ", profile->product, operation);
        const char *separator = "";
        for (size_t i = 0; i < PROFILE_COUNT; i++) {
            if (g_profiles[i].rules[group].dtypes != 0) {
                append(text, size, "%s%s", separator, g_profiles[i].name);
                separator = ", ";
            }
        }
        append(text, size, " profiles have it)");
        return;
    }
    append(text, size, "%s %s takes ", profile->product, operation);
    append_bits(text, size, rule->dtypes, hccl_dtype_name);
    if (rule->ops != 0) {
        append(text, size, " with ");
        append_bits(text, size, rule->ops, hccl_op_name);
    }
    if (rule->no_prod != 0) {
        append(text, size, " (prod not with ");
        append_bits(text, size, rule->no_prod, hccl_dtype_name);
        append(text, size, ")");
    }
}

static bool allows(const rule_t *rule, bool reduces, HcclDataType dtype, HcclReduceOp op)
{
    uint32_t bit = (uint32_t)dtype < 32 ? 1u << dtype : 0;
    if (!(rule->dtypes & bit))
        return false;
    if (!reduces)
        return true;
    if ((uint32_t)op >= 32 || !(rule->ops & (1u << op)))
        return false;
    return op != HCCL_REDUCE_PROD || !(rule->no_prod & bit);
}

int hccl_profile_check(const hccl_profile_t *profile, const char *api, uint32_t type, HcclDataType dtype,
                       HcclReduceOp op)
{
    int group = group_of(type);
    if (profile == NULL || group < 0)
        return HCCL_SUCCESS;
    bool reduces = hccl_cmd_reduces(type);
    if (allows(&profile->rules[group], reduces, dtype, op))
        return HCCL_SUCCESS;
    char allowed[512] = "";
    describe(allowed, sizeof allowed, profile, type, group);
    char with[32] = "";
    if (reduces)
        snprintf(with, sizeof with, " with %s", hccl_op_name((uint32_t)op));
    return hccl_error(HCCL_E_NOT_SUPPORT, "%s: %s of %s%s is not supported on the %s profile (%s=%s): %s", api,
                      hccl_cmd_name(type), hccl_dtype_name((uint32_t)dtype), with, profile->name,
                      HCCL_SIM_PROFILE_VARIABLE, profile->name, allowed);
}
