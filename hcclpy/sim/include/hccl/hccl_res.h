/*
 * hcclpy CPU simulator: HCCL communicator resources.
 *
 * The part of CANN 9.x's hccl/hccl_res.h the simulator provides: the communicator's HCCL buffer.
 * hccl_comm.h (and so hccl.h) includes it, as CANN's does.
 */
#ifndef HCCLPY_SIM_HCCL_RES_H
#define HCCLPY_SIM_HCCL_RES_H

#include <stdint.h>

#include "acl/acl_rt.h"
#include "hccl_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The HCCL buffer of comm on the calling rank: device memory of the communicator's device, made
 * by the first call and kept (the same address and size on every later call) until the
 * communicator is destroyed.  *size is twice the communicator's buffer size (hcclBufferSize of
 * its config, else HCCL_BUFFSIZE, in MB; 400 MB by default).  The library owns the memory: never
 * free it.
 */
HCCL_API HcclResult HcclGetHcclBuffer(HcclComm comm, void **buffer, uint64_t *size);

#ifdef __cplusplus
}
#endif

#endif /* HCCLPY_SIM_HCCL_RES_H */
