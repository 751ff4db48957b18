// Data-dependent indices (gather, scatter, embedding, advanced indexing) checked on the device.
// A value outside its dimension is not used: the index becomes 0, so nothing is read or written
// out of bounds, and the first failing work-item of any kernel records what failed in the device's
// error record, which the host reads where it waits anyway (an output read, a synchronize, a
// training step's loss) and raises as eager's error. Record: [0] the failing kernel's token (0: no
// error yet), [1] the site (a position in the graph's index_checks), [2..3] the value (low, high).
// Only OpenCL 1.1 core atomics (atomic_cmpxchg on a 32-bit global int) are used.
#ifndef ADRENO_INDEX_CHECK_CL
#define ADRENO_INDEX_CHECK_CL
inline long adreno_checked_index(long value, long size, int site, int wraps,
                                 __global volatile int* index_error, int token) {
    const long index = (wraps && value < 0) ? value + size : value;
    // One unsigned comparison covers both ends (a negative index is a huge unsigned one).
    if ((ulong)index < (ulong)size) return index;
    if (atomic_cmpxchg(&index_error[0], 0, token) == 0) {
        index_error[1] = site;
        index_error[2] = (int)value;
        index_error[3] = (int)(value >> 32);
    }
    return 0;
}
#endif
