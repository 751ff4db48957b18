/* NumPy .npz archives (numpy.savez: a zip of one .npy file per array), read from a mapping of the
 * file into the form safetensors files are read into (named tensors pointing into the mapping).
 * Only what numpy.savez writes: stored (uncompressed) entries, zip64 records included, each
 * checked against its CRC-32; .npy format 1.0 to 3.0, C order, the dtypes a step file uses
 * ('<f4', '<i8', '<i4', '|b1', '|u1'). numpy.savez_compressed archives are refused, naming it. */
#ifndef TORCH_ADRENO_STEP_NPZ_H
#define TORCH_ADRENO_STEP_NPZ_H

#include "safetensors.h"

/* Reads `size` bytes at `data`, which must outlive `file` (the fuzz target's entry). */
tas_status npz_read_memory(const uint8_t *data, size_t size, const char *origin, safetensors_file *file,
                           error_record *error);

/* Whether `size` bytes at `data` begin as a zip archive does. */
int npz_looks_like(const uint8_t *data, size_t size);

#endif
