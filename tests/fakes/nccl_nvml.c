/*
 * A scripted stand-in for NVIDIA's libnvidia-ml.so.1, built at test time:
 *
 *     gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o DIR/libnvidia-ml.so.1 nccl_nvml.c
 *
 * and found through LD_LIBRARY_PATH, so the real pynvml bindings run against it.
 * The devices come from the environment, read at nvmlInit:
 *
 *     FAKE_NVML_GPUS="NVIDIA GeForce GTX 1080:6.1;NVIDIA RTX PRO 6000:12.0"
 *
 * (unset or empty: no GPUs). FAKE_NVML_INIT_FAIL=1 makes nvmlInit fail the way
 * a machine with the library but no loaded driver does (NVML_ERROR_DRIVER_NOT_LOADED).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
};

#define MAX_GPUS 16
#define NAME_LEN 96

struct fake_gpu {
    char name[NAME_LEN];
    int major, minor;
};
typedef struct fake_gpu *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

static struct fake_gpu gpus[MAX_GPUS];
static unsigned int gpu_count;
static int initialised;

static void load_gpus(void) {
    const char *spec = getenv("FAKE_NVML_GPUS");
    gpu_count = 0;
    if (spec == NULL) return;
    char buf[4096];
    strncpy(buf, spec, sizeof buf - 1);
    buf[sizeof buf - 1] = '\0';
    char *save = NULL;
    for (char *item = strtok_r(buf, ";", &save); item && gpu_count < MAX_GPUS; item = strtok_r(NULL, ";", &save)) {
        char *colon = strrchr(item, ':');
        if (colon == NULL) continue;
        *colon = '\0';
        struct fake_gpu *g = &gpus[gpu_count];
        if (sscanf(colon + 1, "%d.%d", &g->major, &g->minor) != 2) continue;
        strncpy(g->name, item, NAME_LEN - 1);
        g->name[NAME_LEN - 1] = '\0';
        gpu_count++;
    }
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    const char *fail = getenv("FAKE_NVML_INIT_FAIL");
    if (fail && *fail && strcmp(fail, "0") != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    load_gpus();
    initialised++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (length < 11) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, "570.86.15");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *version = 12080;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (index >= gpu_count || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || name == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(device->name) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(name, device->name);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || major == NULL || minor == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *major = device->major;
    *minor = device->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = 8ULL << 30;
    memory->used = 1ULL << 30;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}
