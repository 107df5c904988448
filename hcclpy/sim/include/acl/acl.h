/*
 * hcclpy CPU simulator: AscendCL umbrella header.
 *
 * The simulator implements the runtime part of ACL and the model run instances of stream capture
 * (no model loading or single-operator APIs), so this pulls in those declarations.
 */
#ifndef HCCLPY_SIM_ACL_H
#define HCCLPY_SIM_ACL_H

#include "acl_rt.h"
#include "acl_mdl.h"

#endif /* HCCLPY_SIM_ACL_H */
