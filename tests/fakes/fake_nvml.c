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
 *                         keys: free, used (memory), uuid, and the health fields:
 *                           persist=0|1        persistence mode (default 1)
 *                           ecc=on|off         ECC mode now (default on); ecc_pending=on|off
 *                                              the mode after the next reset (default: ecc)
 *                           ecc_vol=N ecc_agg=N  uncorrected ECC errors, volatile / aggregate
 *                           retired_sbe=N retired_dbe=N  pages retired for single-bit /
 *                                              double-bit errors; retired_pending=1
 *                           remap=C/U/P/F      row remapper: corrected rows, uncorrected
 *                                              rows, pending (0/1), failure (0/1)
 *                           pcie=G.W/G.W       PCIe link now / at most: gen.width,
 *                                              e.g. pcie=4.8/4.16 (default 4.16/4.16)
 *                           pstate=N           performance state P0..P15 (default 0)
 *                           throttle=BITS      active clock event (throttle) reasons, NVML's
 *                                              bit mask, e.g. throttle=0x88
 *                           mig=on|off         MIG mode now (default off); mig_pending=on|off;
 *                                              migs=N MIG instances (default 2 when on)
 *                           minor=N            /dev/nvidiaN minor number (default: index)
 *                           lost               counted, but its handle fails with
 *                                              GPU_IS_LOST (a GPU fallen off the bus)
 *                           na=F+F...          these queries answer NOT_SUPPORTED
 *                           deny=F+F...        these queries answer NO_PERMISSION
 *                         where F is one of persist, ecc, retired, remap, pcie, pstate,
 *                         throttle, mig, minor.
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
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_LIB_RM_VERSION_MISMATCH 18

/* the health queries a device can refuse (na= / deny=) */
enum {
    F_PERSIST = 1 << 0, F_ECC = 1 << 1, F_RETIRED = 1 << 2, F_REMAP = 1 << 3, F_PCIE = 1 << 4,
    F_PSTATE = 1 << 5, F_THROTTLE = 1 << 6, F_MIG = 1 << 7, F_MINOR = 1 << 8,
};
#define MAX_MIGS 7

#define MAX_DEVICES 64

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

struct fake_device;

struct fake_mig {
    struct fake_device *parent;
    char uuid[96];
};

struct fake_device {
    unsigned int index;
    char name[96];
    char uuid[96];
    int major, minor;
    unsigned long long total, free, used;
    /* health */
    unsigned int persist, ecc, ecc_pending, mig, mig_pending, migs, minor_number;
    unsigned long long ecc_vol, ecc_agg;
    unsigned int retired_sbe, retired_dbe, retired_pending;
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure;
    unsigned int pcie_gen, pcie_width, pcie_max_gen, pcie_max_width, pstate;
    unsigned long long throttle;
    int lost;
    unsigned int na, deny;
    struct fake_mig mig_devices[MAX_MIGS];
};

/* A handle is either a device or a MIG instance; both start with nothing in common, so the fake
   tells them apart by address range. */
typedef void *nvmlDevice_t;

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

static unsigned int parse_fields(const char *text) {
    static const struct { const char *name; unsigned int bit; } names[] = {
        {"persist", F_PERSIST}, {"ecc", F_ECC}, {"retired", F_RETIRED}, {"remap", F_REMAP},
        {"pcie", F_PCIE}, {"pstate", F_PSTATE}, {"throttle", F_THROTTLE}, {"mig", F_MIG},
        {"minor", F_MINOR},
    };
    unsigned int bits = 0;
    char copy[256];
    snprintf(copy, sizeof copy, "%s", text);
    char *save = NULL;
    for (char *name = strtok_r(copy, "+", &save); name; name = strtok_r(NULL, "+", &save))
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (strcmp(name, names[i].name) == 0)
                bits |= names[i].bit;
    return bits;
}

static unsigned int on_off(const char *text) { return strcmp(text, "on") == 0 || strcmp(text, "1") == 0; }

static void parse_device(char *spec) {
    if (device_count >= MAX_DEVICES)
        return;
    struct fake_device *dev = &devices[device_count];
    memset(dev, 0, sizeof *dev);
    dev->index = device_count;
    snprintf(dev->uuid, sizeof dev->uuid, "GPU-fa4e0000-0000-4000-8000-%012u", device_count);
    dev->persist = 1;
    dev->ecc = 1;
    dev->minor_number = device_count;
    dev->pcie_gen = dev->pcie_max_gen = 4;
    dev->pcie_width = dev->pcie_max_width = 16;
    int ecc_pending = -1, mig_pending = -1, migs = -1;
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
        } else if (strncmp(part, "persist=", 8) == 0) {
            dev->persist = on_off(part + 8);
        } else if (strncmp(part, "ecc=", 4) == 0) {
            dev->ecc = on_off(part + 4);
        } else if (strncmp(part, "ecc_pending=", 12) == 0) {
            ecc_pending = on_off(part + 12);
        } else if (strncmp(part, "ecc_vol=", 8) == 0) {
            dev->ecc_vol = strtoull(part + 8, NULL, 10);
        } else if (strncmp(part, "ecc_agg=", 8) == 0) {
            dev->ecc_agg = strtoull(part + 8, NULL, 10);
        } else if (strncmp(part, "retired_sbe=", 12) == 0) {
            dev->retired_sbe = (unsigned int)atoi(part + 12);
        } else if (strncmp(part, "retired_dbe=", 12) == 0) {
            dev->retired_dbe = (unsigned int)atoi(part + 12);
        } else if (strncmp(part, "retired_pending=", 16) == 0) {
            dev->retired_pending = on_off(part + 16);
        } else if (strncmp(part, "remap=", 6) == 0) {
            sscanf(part + 6, "%u/%u/%u/%u", &dev->remap_corr, &dev->remap_unc, &dev->remap_pending,
                   &dev->remap_failure);
        } else if (strncmp(part, "pcie=", 5) == 0) {
            sscanf(part + 5, "%u.%u/%u.%u", &dev->pcie_gen, &dev->pcie_width, &dev->pcie_max_gen,
                   &dev->pcie_max_width);
        } else if (strncmp(part, "pstate=", 7) == 0) {
            dev->pstate = (unsigned int)atoi(part + 7);
        } else if (strncmp(part, "throttle=", 9) == 0) {
            dev->throttle = strtoull(part + 9, NULL, 0);
        } else if (strncmp(part, "mig=", 4) == 0) {
            dev->mig = on_off(part + 4);
        } else if (strncmp(part, "mig_pending=", 12) == 0) {
            mig_pending = on_off(part + 12);
        } else if (strncmp(part, "migs=", 5) == 0) {
            migs = atoi(part + 5);
        } else if (strncmp(part, "minor=", 6) == 0) {
            dev->minor_number = (unsigned int)atoi(part + 6);
        } else if (strcmp(part, "lost") == 0) {
            dev->lost = 1;
        } else if (strncmp(part, "na=", 3) == 0) {
            dev->na |= parse_fields(part + 3);
        } else if (strncmp(part, "deny=", 5) == 0) {
            dev->deny |= parse_fields(part + 5);
        }
    }
    dev->ecc_pending = ecc_pending < 0 ? dev->ecc : (unsigned int)ecc_pending;
    dev->mig_pending = mig_pending < 0 ? dev->mig : (unsigned int)mig_pending;
    dev->migs = migs < 0 ? (dev->mig ? 2 : 0) : (unsigned int)(migs > MAX_MIGS ? MAX_MIGS : migs);
    for (unsigned int i = 0; i < dev->migs; i++) {
        dev->mig_devices[i].parent = dev;
        snprintf(dev->mig_devices[i].uuid, sizeof dev->mig_devices[i].uuid,
                 "MIG-fa4e0000-0000-4000-8%03u-%012u", device_count, i);
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

static struct fake_device *as_device(nvmlDevice_t handle) {
    struct fake_device *dev = handle;
    if (!handle || dev < devices || dev >= devices + device_count)
        return NULL;
    return dev;
}

static struct fake_mig *as_mig(nvmlDevice_t handle) {
    for (unsigned int d = 0; d < device_count; d++)
        for (unsigned int i = 0; i < devices[d].migs; i++)
            if (handle == (void *)&devices[d].mig_devices[i])
                return &devices[d].mig_devices[i];
    return NULL;
}

static nvmlReturn_t check_device(nvmlDevice_t device) {
    if (!init_refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!as_device(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

/* check_device, then the device's scripted refusal of one query (na= / deny=) */
static nvmlReturn_t check_query(nvmlDevice_t device, unsigned int field, void *out) {
    nvmlReturn_t ret = check_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    struct fake_device *dev = device;
    if (dev->na & field)
        return NVML_ERROR_NOT_SUPPORTED;
    if (dev->deny & field)
        return NVML_ERROR_NO_PERMISSION;
    return out ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
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
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
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
    if (devices[index].lost)
        return NVML_ERROR_GPU_IS_LOST;
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
    *index = ((struct fake_device *)device)->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t ret = check_device(device);
    return ret != NVML_SUCCESS ? ret : copy_string(name, length, ((struct fake_device *)device)->name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    if (!init_refcount)
        return NVML_ERROR_UNINITIALIZED;
    struct fake_mig *mig = as_mig(device);
    if (mig)
        return copy_string(uuid, length, mig->uuid);
    nvmlReturn_t ret = check_device(device);
    return ret != NVML_SUCCESS ? ret : copy_string(uuid, length, ((struct fake_device *)device)->uuid);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    nvmlReturn_t ret = check_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = ((struct fake_device *)device)->major;
    *minor = ((struct fake_device *)device)->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t ret = check_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_device *dev = device;
    memory->total = dev->total;
    memory->free = dev->free;
    memory->used = dev->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    nvmlReturn_t ret = check_device(device);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_device *dev = device;
    memory->total = dev->total;
    memory->reserved = 0;
    memory->free = dev->free;
    memory->used = dev->used;
    return NVML_SUCCESS;
}

/* ---- health ---- */

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, unsigned int *mode) {
    nvmlReturn_t ret = check_query(device, F_PERSIST, mode);
    if (ret == NVML_SUCCESS)
        *mode = ((struct fake_device *)device)->persist;
    return ret;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    nvmlReturn_t ret = check_query(device, F_MINOR, minor);
    if (ret == NVML_SUCCESS)
        *minor = ((struct fake_device *)device)->minor_number;
    return ret;
}

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    nvmlReturn_t ret = check_query(device, F_ECC, current && pending ? current : NULL);
    if (ret == NVML_SUCCESS) {
        *current = ((struct fake_device *)device)->ecc;
        *pending = ((struct fake_device *)device)->ecc_pending;
    }
    return ret;
}

/* errorType 0 corrected, 1 uncorrected; counterType 0 volatile, 1 aggregate */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                         unsigned long long *count) {
    nvmlReturn_t ret = check_query(device, F_ECC, count);
    if (ret != NVML_SUCCESS)
        return ret;
    struct fake_device *dev = device;
    if (!dev->ecc)
        return NVML_ERROR_NOT_SUPPORTED;  /* NVML answers so when ECC is disabled */
    *count = errorType == 1 ? (counterType == 0 ? dev->ecc_vol : dev->ecc_agg) : 0;
    return NVML_SUCCESS;
}

/* cause 0: multiple single-bit errors, 1: a double-bit error */
static nvmlReturn_t retired_pages(nvmlDevice_t device, int cause, unsigned int *count,
                                  unsigned long long *addresses, unsigned long long *timestamps) {
    nvmlReturn_t ret = check_query(device, F_RETIRED, count);
    if (ret != NVML_SUCCESS)
        return ret;
    struct fake_device *dev = device;
    unsigned int have = cause == 0 ? dev->retired_sbe : dev->retired_dbe;
    if (!addresses) {
        *count = have;
        return have ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    if (*count < have) {
        *count = have;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < have; i++) {
        addresses[i] = 0x1000ULL * (i + 1) + (unsigned long long)cause;
        if (timestamps)
            timestamps[i] = 1700000000ULL + i;
    }
    *count = have;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, int cause, unsigned int *count,
                                       unsigned long long *addresses) {
    return retired_pages(device, cause, count, addresses, NULL);
}

nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, int cause, unsigned int *count,
                                          unsigned long long *addresses, unsigned long long *timestamps) {
    return retired_pages(device, cause, count, addresses, timestamps);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, unsigned int *pending) {
    nvmlReturn_t ret = check_query(device, F_RETIRED, pending);
    if (ret == NVML_SUCCESS)
        *pending = ((struct fake_device *)device)->retired_pending;
    return ret;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure) {
    nvmlReturn_t ret = check_query(device, F_REMAP, corr && unc && pending && failure ? corr : NULL);
    if (ret != NVML_SUCCESS)
        return ret;
    struct fake_device *dev = device;
    *corr = dev->remap_corr;
    *unc = dev->remap_unc;
    *pending = dev->remap_pending;
    *failure = dev->remap_failure;
    return NVML_SUCCESS;
}

#define PCIE_QUERY(fn, field)                                       \
    nvmlReturn_t fn(nvmlDevice_t device, unsigned int *value) {     \
        nvmlReturn_t ret = check_query(device, F_PCIE, value);      \
        if (ret == NVML_SUCCESS)                                    \
            *value = ((struct fake_device *)device)->field;         \
        return ret;                                                 \
    }
PCIE_QUERY(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen)
PCIE_QUERY(nvmlDeviceGetCurrPcieLinkWidth, pcie_width)
PCIE_QUERY(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen)
PCIE_QUERY(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_max_gen)
PCIE_QUERY(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width)

nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, unsigned int *pstate) {
    nvmlReturn_t ret = check_query(device, F_PSTATE, pstate);
    if (ret == NVML_SUCCESS)
        *pstate = ((struct fake_device *)device)->pstate;
    return ret;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    nvmlReturn_t ret = check_query(device, F_THROTTLE, reasons);
    if (ret == NVML_SUCCESS)
        *reasons = ((struct fake_device *)device)->throttle;
    return ret;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    nvmlReturn_t ret = check_query(device, F_MIG, current && pending ? current : NULL);
    if (ret == NVML_SUCCESS) {
        *current = ((struct fake_device *)device)->mig;
        *pending = ((struct fake_device *)device)->mig_pending;
    }
    return ret;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    nvmlReturn_t ret = check_query(device, F_MIG, count);
    if (ret == NVML_SUCCESS)
        *count = ((struct fake_device *)device)->mig ? MAX_MIGS : 0;
    return ret;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig) {
    nvmlReturn_t ret = check_query(device, F_MIG, mig);
    if (ret != NVML_SUCCESS)
        return ret;
    struct fake_device *dev = device;
    if (!dev->mig || index >= MAX_MIGS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= dev->migs)
        return NVML_ERROR_NOT_FOUND;
    *mig = &dev->mig_devices[index];
    return NVML_SUCCESS;
}
