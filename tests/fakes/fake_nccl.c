/*
 * A stand-in for libnccl.so.2 exporting only ncclGetVersion, built at test
 * time with -DFAKE_NCCL_VERSION_CODE=<code> (NCCL's encoding: 2.27.5 is 22705).
 * fdl loads it with ctypes exactly as it would load NVIDIA's library.
 */
#ifndef FAKE_NCCL_VERSION_CODE
#define FAKE_NCCL_VERSION_CODE 22705
#endif

typedef enum { ncclSuccess = 0, ncclInvalidArgument = 4 } ncclResult_t;

ncclResult_t ncclGetVersion(int *version) {
    if (!version)
        return ncclInvalidArgument;
    *version = FAKE_NCCL_VERSION_CODE;
    return ncclSuccess;
}
