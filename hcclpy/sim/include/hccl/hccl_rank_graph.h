/*
 * hcclpy CPU simulator: HCCL rank graph queries.
 *
 * The part of CANN 9.x's hccl/hccl_rank_graph.h the simulator provides: the heterogeneous mode
 * of a communicator.  Not included by hccl.h (as in CANN): include it where it is used.
 */
#ifndef HCCLPY_SIM_HCCL_RANK_GRAPH_H
#define HCCLPY_SIM_HCCL_RANK_GRAPH_H

#include "hccl_types.h"
#include "hccl_res.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the chips of a communicator's ranks mix. */
typedef enum {
    HCCL_HETEROG_MODE_INVALID = -1,    /* invalid / not initialised */
    HCCL_HETEROG_MODE_HOMOGENEOUS = 0, /* one chip type on every rank */
    HCCL_HETEROG_MODE_MIX_A2_A3 = 1    /* A2 and A3 chips mixed */
} HcclHeterogMode;

/* The heterogeneous mode of comm (the simulator's communicators are homogeneous). */
HCCL_API HcclResult HcclGetHeterogMode(HcclComm comm, HcclHeterogMode *mode);

#ifdef __cplusplus
}
#endif

#endif /* HCCLPY_SIM_HCCL_RANK_GRAPH_H */
