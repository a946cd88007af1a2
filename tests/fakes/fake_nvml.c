/*
 * A scripted stand-in for libnvidia-ml.so.1, built at test time.
 *
 * The real pynvml bindings load it through LD_LIBRARY_PATH and call it exactly
 * as they would call NVIDIA's library, so fdl's GPU code runs its real path
 * against devices described in the environment:
 *
 *   FDL_FAKE_NVML         the devices, comma-separated, each NAME:MAJOR.MINOR:MEMORY
 *                         with optional KEY=VALUE fields after it, e.g.
 *                           "H100:9.0:80G,RTX3060:8.6:12G:free=10G:uuid=GPU-abc"
 *                         keys: free, used (memory), uuid.
 *                         "" or "none": NVML works and reports zero devices.
 *                         "init-fail" or "init-fail:CODE": every nvmlInit* call
 *                         returns CODE (default 18, driver/library mismatch).
 *   FDL_FAKE_NVML_DRIVER  driver version string (default 570.133.20)
 *   FDL_FAKE_NVML_CUDA    CUDA driver version as NVML encodes it (default 12080)
 *
 * Unset FDL_FAKE_NVML means zero devices. To grow the fake: add the function
 * here with NVML's signature (check pynvml.py for the symbol name it looks up,
 * _v2 included), and any new per-device field as another KEY=VALUE.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_LIB_RM_VERSION_MISMATCH 18

#define MAX_DEVICES 64

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

struct fake_device {
    unsigned int index;
    char name[96];
    char uuid[96];
    int major, minor;
    unsigned long long total, free, used;
};

typedef struct fake_device *nvmlDevice_t;

static struct fake_device devices[MAX_DEVICES];
static unsigned int device_count;
static int parsed;
static nvmlReturn_t init_result = NVML_SUCCESS;
static int init_refcount;

static unsigned long long parse_size(const char *text) {
    char *end = NULL;
    double value = strtod(text, &end);
    unsigned long long unit = 1;
    if (end && *end) {
        switch (*end) {
        case 'K': case 'k': unit = 1ULL << 10; break;
        case 'M': case 'm': unit = 1ULL << 20; break;
        case 'G': case 'g': unit = 1ULL << 30; break;
        case 'T': case 't': unit = 1ULL << 40; break;
        default: unit = 1; break;
        }
    }
    return (unsigned long long)(value * (double)unit);
}

static void parse_device(char *spec) {
    if (device_count >= MAX_DEVICES)
        return;
    struct fake_device *dev = &devices[device_count];
    memset(dev, 0, sizeof *dev);
    dev->index = device_count;
    snprintf(dev->uuid, sizeof dev->uuid, "GPU-fa4e0000-0000-4000-8000-%012u", device_count);
    int field = 0;
    char *save = NULL;
    for (char *part = strtok_r(spec, ":", &save); part; part = strtok_r(NULL, ":", &save), field++) {
        if (field == 0) {
            snprintf(dev->name, sizeof dev->name, "%s", part);
        } else if (field == 1) {
            sscanf(part, "%d.%d", &dev->major, &dev->minor);
        } else if (field == 2) {
            dev->total = parse_size(part);
        } else if (strncmp(part, "free=", 5) == 0) {
            dev->free = parse_size(part + 5);
        } else if (strncmp(part, "used=", 5) == 0) {
            dev->used = parse_size(part + 5);
        } else if (strncmp(part, "uuid=", 5) == 0) {
            snprintf(dev->uuid, sizeof dev->uuid, "%s", part + 5);
        }
    }
    if (!dev->free && !dev->used)
        dev->used = dev->total / 16;
    if (!dev->free)
        dev->free = dev->total > dev->used ? dev->total - dev->used : 0;
    if (!dev->used)
        dev->used = dev->total > dev->free ? dev->total - dev->free : 0;
    device_count++;
}

static void parse_env(void) {
    if (parsed)
        return;
    parsed = 1;
    const char *env = getenv("FDL_FAKE_NVML");
    if (!env || !*env || strcmp(env, "none") == 0)
        return;
    if (strncmp(env, "init-fail", 9) == 0) {
        init_result = NVML_ERROR_LIB_RM_VERSION_MISMATCH;
        if (env[9] == ':')
            init_result = atoi(env + 10);
        return;
    }
    char *copy = strdup(env);
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save))
        parse_device(item);
    free(copy);
}

static nvmlReturn_t copy_string(char *dest, unsigned int length, const char *src) {
    if (!dest)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dest, src);
    return NVML_SUCCESS;
}

static nvmlReturn_t check_device(nvmlDevice_t device) {
    if (!init_refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || device < devices || device >= devices + device_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

/* ---- init / shutdown ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    parse_env();
    if (init_result != NVML_SUCCESS)
        return init_result;
    init_refcount++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!init_refcount)
        return NVML_ERROR_UNINITIALIZED;
    init_refcount--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
    }
}

/* ---- system ---- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!init_refcount)
        return NVML_ERROR_UNINITIALIZED;
    const char *env = getenv("FDL_FAKE_NVML_DRIVER");
    return copy_string(version, length, env && *env ? env : "570.133.20");
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (!init_refcount)
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, "12.550.54.14");
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    if (!init_refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    const char *env = getenv("FDL_FAKE_NVML_CUDA");
    *version = env && *env ? atoi(env) : 12080;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) { return nvmlSystemGetCudaDriverVersion_v2(version); }

/* ---- devices ---- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!init_refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = device_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!init_refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= device_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    nvmlReturn_t ret = check_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t ret = check_device(device);
    return ret != NVML_SUCCESS ? ret : copy_string(name, length, device->name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t ret = check_device(device);
    return ret != NVML_SUCCESS ? ret : copy_string(uuid, length, device->uuid);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    nvmlReturn_t ret = check_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = device->major;
    *minor = device->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t ret = check_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = device->total;
    memory->free = device->free;
    memory->used = device->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    nvmlReturn_t ret = check_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = device->total;
    memory->reserved = 0;
    memory->free = device->free;
    memory->used = device->used;
    return NVML_SUCCESS;
}
