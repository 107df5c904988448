/*
 * hcclpy CPU simulator: AscendCL base header.
 *
 * Compatibility entry point; everything the simulator provides at this level
 * lives in acl_base_rt.h (which also pulls in the runtime error codes).
 */
#ifndef HCCLPY_SIM_ACL_BASE_H
#define HCCLPY_SIM_ACL_BASE_H

#include "acl_base_rt.h"

#endif /* HCCLPY_SIM_ACL_BASE_H */
