/*
 * hcclpy CPU simulator: AscendCL umbrella header.
 *
 * The simulator implements only the runtime part of ACL (no model or
 * single-operator APIs), so this pulls in the runtime declarations.
 */
#ifndef HCCLPY_SIM_ACL_H
#define HCCLPY_SIM_ACL_H

#include "acl_rt.h"

#endif /* HCCLPY_SIM_ACL_H */
