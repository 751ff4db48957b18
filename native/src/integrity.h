/* The integrity record of a step file (metadata torch_adreno.integrity): SHA-256 digests of every
 * initializer's values, of the kernel sources and of the operations and plan, written at export
 * and checked here before anything of the file is used. The bytes each digest covers are laid
 * out in torch_adreno/runner/integrity.py, which this follows byte for byte. */
#ifndef TORCH_ADRENO_STEP_INTEGRITY_H
#define TORCH_ADRENO_STEP_INTEGRITY_H

#include "common.h"
#include "onnx_reader.h"

#define STEP_INTEGRITY_KEY "torch_adreno.integrity"

/* TAS_OK, or TAS_ERROR_FORMAT with a message beginning "damaged file: " naming the damaged parts
 * (the kernel sources, the operations and plan, or the initializers by name). */
tas_status integrity_verify(const onnx_model *model, const char *origin, error_record *error);

#endif
