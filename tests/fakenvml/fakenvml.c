/*
 * A stand-in libnvidia-ml.so.1 for tests: the subset of NVML that the driver's discovery
 * path calls through nvidia-ml-py (module `pynvml`), answered from a data file instead of
 * hardware.
 *
 * Build:  gcc -shared -fPIC -O1 -Wall -Wextra -o libnvidia-ml.so.1 fakenvml.c
 * Use:    LD_LIBRARY_PATH=<dir of the .so> FAKE_NVML_DATA=<file> python ...
 *
 * The stand-in driver root (tests/driverroot.py --nvml, docs/standin-driver.md) builds it with
 * -DFAKE_NVML_VERSION='"<driver version>"' (what simulated_driver_version() returns, as the
 * driver root's other libraries do) and also compiles this file into its nvidia-smi
 * (tools/nvidia-smi.c), which so reads and writes the same data file.
 *
 * Environment:
 *   FAKE_NVML_DATA  path of the data file (format below); required, read by nvmlInitWithFlags.
 *   FAKE_NVML_FAIL  comma-separated NVML function names, each optionally "=<code>": that
 *                   function returns the code (default NVML_ERROR_UNKNOWN, 999) instead of
 *                   doing its work, e.g. "nvmlDeviceGetMemoryInfo" or "nvmlInitWithFlags=9".
 *   FAKE_NVML_FAIL_FILE  path of a file in FAKE_NVML_FAIL's format (names also one a line),
 *                   read at every call: a test makes a running program's calls fail.
 *   FAKE_NVML_EVENTS  path of the events file (format at the end of this comment) that
 *                   nvmlEventSetWait_v2 reads; unset: no events ever happen.
 *   FAKE_NVML_HEALTH  path of the health file, read on every call that asks about health, so
 *                   a test can change a GPU's state while a program runs. One line a state:
 *                   "<gpu-uuid> <state>", state one of: lost (nvmlDeviceGetHandleByUUID
 *                   returns NVML_ERROR_GPU_IS_LOST), pages-pending (retired pages wait for
 *                   a reset), remap-pending, remap-failed (nvmlDeviceGetRemappedRows),
 *                   no-retire, no-remap (those two calls are NOT_SUPPORTED). Unset or no
 *                   line: healthy, both calls supported.
 *
 * Symbol names and struct layouts follow nvml.h exactly as nvidia-ml-py resolves them
 * (e.g. nvmlDeviceGetCount_v2, nvmlDeviceGetPciInfo_v3, nvmlDeviceGetAttributes_v2): a
 * symbol missing here makes pynvml raise NVMLError_FunctionNotFound, as with an old driver.
 *
 * Data file: one record per line, fields separated by single spaces, '#' starts a comment
 * line. Records after a `gpu` line belong to that GPU. The last field of `name` and
 * `profile` may contain spaces.
 *
 *   driver <version>                    nvmlSystemGetDriverVersion, e.g. 580.95.05
 *   cuda <int>                          nvmlSystemGetCudaDriverVersion, 1000*major + 10*minor
 *   gpu <uuid>                          starts a GPU (its index is its position)
 *   minor <n>
 *   name <product name>
 *   brand <nvmlBrandType_t value>
 *   arch <nvmlDeviceArchitecture_t value>
 *   cc <major> <minor>
 *   pci <busId as NVML prints it, "00000000:07:00.0">
 *   memory <total bytes>
 *   cores <CUDA cores>
 *   fabric <state> [<clusterUuid> <cliqueId>]
 *                                       nvmlDeviceGetGpuFabricInfo(V): state is
 *                                       nvmlGpuFabricState_t (0 NOT_SUPPORTED, 1 NOT_STARTED,
 *                                       2 IN_PROGRESS, 3 COMPLETED), the cluster UUID is
 *                                       written 8-4-4-4-12 (absent: all zero), the clique ID
 *                                       decimal; status is always NVML_SUCCESS. Absent: the
 *                                       GPU has no fabric (both calls NVML_ERROR_NOT_SUPPORTED)
 *   mig <current> <pending>             absent: MIG not supported (NVML_ERROR_NOT_SUPPORTED)
 *   maxmig <n>                          nvmlDeviceGetMaxMigDeviceCount
 *   profile <nvmlIndex> <id> <slices> <instances> <sm> <ce> <dec> <enc> <jpeg> <ofa>
 *           <memoryMiB> <starts:size, e.g. 0,2,4:2> <name, e.g. MIG 1g.10gb>
 *   gi <id> <profileId> <start> <size>  an existing GPU instance
 *   ci <giId> <ciId> <uuid>             a compute instance of that GI: one MIG device, which
 *                                       reports the engines and memory of the GI's profile
 *   events <mask>                       nvmlDeviceGetSupportedEventTypes (nvmlEventType*
 *                                       bits, decimal or 0x-hex); absent: DEFAULT_EVENT_TYPES
 *   timeslice <0..3>                    the compute policy's time-slice (0 DEFAULT, 1 SHORT,
 *                                       2 MEDIUM, 3 LONG) that nvidia-smi compute-policy
 *                                       sets; absent: 0
 *   computemode <n>                     nvmlComputeMode_t (0 DEFAULT, 2 PROHIBITED,
 *                                       3 EXCLUSIVE_PROCESS); absent: 0
 *
 * The library keeps the whole file in memory. Calls that change MIG state
 * (nvmlDeviceSetMigMode, nvmlDeviceCreateGpuInstanceWithPlacement, nvmlGpuInstanceDestroy,
 * nvmlGpuInstanceCreateComputeInstance, nvmlComputeInstanceDestroy) or a GPU's compute mode
 * (nvmlDeviceSetComputeMode) or time-slice (fakenvmlDeviceSetTimeslice, a stand-in extension
 * with no NVML counterpart) write it back in the same format (save_data), so the change is
 * what the next process sees. A GPU instance has at most one compute instance, spanning it
 * (the layout MIG devices made on demand use); a new compute instance gets a random MIG UUID,
 * as on real hardware.
 *
 * Several processes share the file (the agent holds it in memory for long; nvidia-smi runs
 * now and then). Writers take an exclusive flock on "<data file>.lock" (fakenvmlLockData,
 * which nvidia-smi also holds from loading to saving) and write a temporary file of their
 * own before renaming it over the data file. The `timeslice` and `computemode` records are
 * always taken from the file, on reading them and before each write, except those this
 * process has just changed: a long-running program that saves a MIG change never undoes
 * what nvidia-smi set meanwhile.
 *
 * Events file: one event a line, appended while the program runs. As in NVML, a set reports
 * only what happens after its creation: it starts reading after the last complete line the
 * file has then, one line per event it delivers, and keeps its offset, so an event is seen
 * once per set; a line without its newline yet is left for a later wait. A wait polls
 * the file in short sleeps until an event arrives or its timeout passes
 * (NVML_ERROR_TIMEOUT). Events of devices the set has not registered for that event type
 * are skipped, as NVML never reports them.
 *
 *   <gpu-uuid> xid <n>                  nvmlEventTypeXidCriticalError, eventData n
 *   <gpu-uuid> dbe                      nvmlEventTypeDoubleBitEccError
 *   lost                                a GPU fell off the bus: this wait and every later one
 *                                       on the set return NVML_ERROR_GPU_IS_LOST
 *
 * A MIG device's UUID in place of <gpu-uuid>: the event comes on its GPU's handle with the
 * MIG device's gpuInstanceId and computeInstanceId (NVML's way); a GPU's event has both
 * 0xFFFFFFFF.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

/* nvmlGpuFabricState_t (nvml.h). */
#define NVML_GPU_FABRIC_STATE_COMPLETED 3U
#define NVML_GPU_FABRIC_UUID_LEN 16

/* nvmlComputeMode_t (nvml.h). */
enum {
    NVML_COMPUTEMODE_DEFAULT = 0,
    NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1, /* support removed from NVML */
    NVML_COMPUTEMODE_PROHIBITED = 2,
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3,
    NVML_COMPUTEMODE_COUNT = 4,
};
/* The largest time-slice nvidia-smi compute-policy --set-timeslice takes (LONG). */
#define MAX_TIMESLICE 3U

/* What simulated_driver_version() returns; the driver root's build sets it. */
#ifndef FAKE_NVML_VERSION
#define FAKE_NVML_VERSION "unknown"
#endif

#define MAX_GPUS 64
#define MAX_PROFILES 32
#define MAX_PLACEMENTS 16
#define MAX_GIS 16
#define MAX_CIS 16
#define MAX_EVENT_SETS 8
#define TEXT 96

/* nvmlEventType_t bits (nvml.h). */
#define nvmlEventTypeSingleBitEccError 0x0000000000000001ULL
#define nvmlEventTypeDoubleBitEccError 0x0000000000000002ULL
#define nvmlEventTypePState 0x0000000000000004ULL
#define nvmlEventTypeXidCriticalError 0x0000000000000008ULL
#define nvmlEventTypeClock 0x0000000000000010ULL
/* What a data-centre GPU supports when the data file does not say. */
#define DEFAULT_EVENT_TYPES                                                   \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError |        \
     nvmlEventTypePState | nvmlEventTypeXidCriticalError | nvmlEventTypeClock)
/* gpuInstanceId / computeInstanceId of an event not tied to a MIG device. */
#define NO_INSTANCE 0xFFFFFFFFU
/* How often a waiting nvmlEventSetWait_v2 looks at the events file. */
#define EVENT_POLL_MS 10

/* ---- public NVML types, laid out as in nvml.h ------------------------------------------ */

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlGpuInstance_st *nvmlGpuInstance_t;
typedef struct nvmlComputeInstance_st *nvmlComputeInstance_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t;

typedef struct {
    unsigned int version;
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;

#define nvmlGpuInstanceProfileInfo_v2 \
    (unsigned int)(sizeof(nvmlGpuInstanceProfileInfo_v2_t) | (2 << 24U))

typedef struct {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
    unsigned int version;
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;

#define nvmlComputeInstanceProfileInfo_v2 \
    (unsigned int)(sizeof(nvmlComputeInstanceProfileInfo_v2_t) | (2 << 24U))

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlComputeInstancePlacement_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id;
    unsigned int profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

/* nvmlGpuFabricInfo_t, what the deprecated nvmlDeviceGetGpuFabricInfo fills. */
typedef struct {
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
} nvmlGpuFabricInfo_t;

/* nvmlGpuFabricInfo_v2_t and _v3_t (v2 plus healthSummary), for nvmlDeviceGetGpuFabricInfoV. */
typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
    unsigned int healthMask;
    unsigned char healthSummary;
} nvmlGpuFabricInfo_v3_t;

#define nvmlGpuFabricInfo_v2 (unsigned int)(sizeof(nvmlGpuFabricInfo_v2_t) | (2 << 24U))
#define nvmlGpuFabricInfo_v3 (unsigned int)(sizeof(nvmlGpuFabricInfo_v3_t) | (3 << 24U))

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

/* The sizes pynvml's ctypes structures have on x86-64 / aarch64 Linux. */
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(sizeof(nvmlGpuInstanceProfileInfo_v2_t) == 0x98, "nvmlGpuInstanceProfileInfo_v2_t");
_Static_assert(sizeof(nvmlGpuInstanceInfo_t) == 24, "nvmlGpuInstanceInfo_t");
_Static_assert(sizeof(nvmlDeviceAttributes_t) == 40, "nvmlDeviceAttributes_t");
_Static_assert(sizeof(nvmlComputeInstanceProfileInfo_v2_t) == 0x88,
               "nvmlComputeInstanceProfileInfo_v2_t");
_Static_assert(sizeof(nvmlComputeInstanceInfo_t) == 32, "nvmlComputeInstanceInfo_t");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t");
_Static_assert(sizeof(nvmlGpuFabricInfo_t) == 28, "nvmlGpuFabricInfo_t");
_Static_assert(nvmlGpuFabricInfo_v2 == 0x02000024, "nvmlGpuFabricInfo_v2");
_Static_assert(nvmlGpuFabricInfo_v3 == 0x03000028, "nvmlGpuFabricInfo_v3");

/* ---- the fake's state ------------------------------------------------------------------ */

/* A device handle is a pointer to one of these: a whole GPU (mig < 0) or a MIG device. */
struct nvmlDevice_st {
    int gpu;
    int mig; /* index into fake_gpu.cis, or -1 */
};

struct nvmlGpuInstance_st {
    int gpu;
    int gi; /* index into fake_gpu.gis */
};

typedef struct {
    unsigned int nvml_index, id, slices, instances, sm, ce, dec, enc, jpeg, ofa;
    unsigned long long memory_mib;
    unsigned int nplacements;
    nvmlGpuInstancePlacement_t placements[MAX_PLACEMENTS];
    char name[TEXT];
} fake_profile;

typedef struct {
    int used;
    unsigned int id, profile_id, start, size;
    struct nvmlGpuInstance_st handle;
} fake_gi;

struct nvmlComputeInstance_st {
    int gpu;
    int ci; /* index into fake_gpu.cis */
};

typedef struct {
    int used;
    unsigned int gi_id, ci_id;
    char uuid[TEXT];
    struct nvmlDevice_st handle;           /* the MIG device */
    struct nvmlComputeInstance_st ci_handle; /* the compute instance */
} fake_ci;

typedef struct {
    char uuid[TEXT];
    char name[TEXT];
    char bus_id[32];
    unsigned int minor, brand, arch;
    int cc_major, cc_minor;
    unsigned long long memory;
    unsigned int cores;
    int mig_supported;
    unsigned int mig_current, mig_pending, max_mig;
    int nprofiles;
    fake_profile profiles[MAX_PROFILES];
    fake_gi gis[MAX_GIS];
    fake_ci cis[MAX_CIS];
    int has_fabric; /* a `fabric` record was read (and is written back) */
    unsigned int fabric_state, clique_id;
    unsigned char cluster_uuid[NVML_GPU_FABRIC_UUID_LEN];
    int has_event_types; /* an `events` record was read (and is written back) */
    unsigned long long event_types;
    /* `timeslice` and `computemode`: whether a record was read or set (and is written
     * back), and whether this process changed it since its last save. */
    int has_timeslice, timeslice_changed;
    unsigned int timeslice;
    int has_compute_mode, compute_mode_changed;
    unsigned int compute_mode;
    struct nvmlDevice_st handle;
} fake_gpu;

/* An event set: what each GPU registered, and how far into the events file it has read. */
struct nvmlEventSet_st {
    int used;
    int lost;
    long offset;
    unsigned long long registered[MAX_GPUS];
};

static int g_refcount;
static char g_data_path[4096];
static char g_driver[TEXT];
static int g_cuda;
static int g_ngpus;
static fake_gpu g_gpus[MAX_GPUS];
static struct nvmlEventSet_st g_event_sets[MAX_EVENT_SETS];

static void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fakenvml: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* The code `fn` must return as `spec` (FAKE_NVML_FAIL's format) says, or NVML_SUCCESS. */
static nvmlReturn_t injected_by(const char *spec, const char *fn) {
    size_t len = strlen(fn);
    while (spec && *spec) {
        const char *end = strpbrk(spec, ",\n");
        size_t item = end ? (size_t)(end - spec) : strlen(spec);
        if (item >= len && strncmp(spec, fn, len) == 0 &&
            (item == len || spec[len] == '=')) {
            return item == len ? NVML_ERROR_UNKNOWN : atoi(spec + len + 1);
        }
        spec = end ? end + 1 : NULL;
    }
    return NVML_SUCCESS;
}

/* FAKE_NVML_FAIL, then the FAKE_NVML_FAIL_FILE read now (so a test can make a running
 * program's calls fail): the code `fn` must return instead of working, or NVML_SUCCESS. */
static nvmlReturn_t injected(const char *fn) {
    nvmlReturn_t ret = injected_by(getenv("FAKE_NVML_FAIL"), fn);
    const char *path = getenv("FAKE_NVML_FAIL_FILE");
    char buf[1024];
    FILE *f;
    size_t n;
    if (ret != NVML_SUCCESS || path == NULL || (f = fopen(path, "r")) == NULL)
        return ret;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return injected_by(buf, fn);
}

#define FAIL_POINT(fn)                           \
    do {                                         \
        nvmlReturn_t injected_rc = injected(fn); \
        if (injected_rc != NVML_SUCCESS)         \
            return injected_rc;                  \
    } while (0)

#define NEED_INIT()                          \
    do {                                     \
        if (g_refcount <= 0)                 \
            return NVML_ERROR_UNINITIALIZED; \
    } while (0)

static fake_gpu *gpu_of(nvmlDevice_t device) {
    if (!device || device->gpu < 0 || device->gpu >= g_ngpus)
        return NULL;
    return &g_gpus[device->gpu];
}

static fake_gpu *whole_gpu(nvmlDevice_t device) {
    fake_gpu *gpu = gpu_of(device);
    return gpu && device->mig < 0 ? gpu : NULL;
}

static fake_ci *mig_of(nvmlDevice_t device) {
    fake_gpu *gpu = gpu_of(device);
    if (!gpu || device->mig < 0 || device->mig >= MAX_CIS || !gpu->cis[device->mig].used)
        return NULL;
    return &gpu->cis[device->mig];
}

static fake_profile *profile_by_index(fake_gpu *gpu, unsigned int nvml_index) {
    for (int i = 0; i < gpu->nprofiles; i++)
        if (gpu->profiles[i].nvml_index == nvml_index)
            return &gpu->profiles[i];
    return NULL;
}

static fake_profile *profile_by_id(fake_gpu *gpu, unsigned int id) {
    for (int i = 0; i < gpu->nprofiles; i++)
        if (gpu->profiles[i].id == id)
            return &gpu->profiles[i];
    return NULL;
}

static fake_gi *gi_by_id(fake_gpu *gpu, unsigned int id) {
    for (int i = 0; i < MAX_GIS; i++)
        if (gpu->gis[i].used && gpu->gis[i].id == id)
            return &gpu->gis[i];
    return NULL;
}

static void copy_text(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src);
}

/* ---- data file ------------------------------------------------------------------------- */

static int parse_placements(fake_profile *p, const char *text) {
    /* "0,2,4:2" */
    const char *colon = strchr(text, ':');
    if (!colon)
        return -1;
    unsigned int size = (unsigned int)strtoul(colon + 1, NULL, 10);
    const char *s = text;
    p->nplacements = 0;
    while (s < colon) {
        if (p->nplacements >= MAX_PLACEMENTS)
            return -1;
        char *end;
        unsigned long start = strtoul(s, &end, 10);
        if (end == s)
            return -1;
        p->placements[p->nplacements].start = (unsigned int)start;
        p->placements[p->nplacements].size = size;
        p->nplacements++;
        s = (*end == ',') ? end + 1 : end;
        if (end != colon && *end != ',')
            return -1;
    }
    return 0;
}

/* "6b1e2c4a-9d3f-4e8a-b7c5-2f0d1a3e5c71" -> 16 bytes; dashes anywhere are skipped. */
static int parse_uuid(unsigned char out[NVML_GPU_FABRIC_UUID_LEN], const char *text) {
    int n = 0;
    for (const char *c = text; *c; c++) {
        if (*c == '-')
            continue;
        char pair[3] = {c[0], c[1], '\0'};
        char *end;
        if (n >= NVML_GPU_FABRIC_UUID_LEN || !c[1])
            return -1;
        out[n++] = (unsigned char)strtoul(pair, &end, 16);
        if (end != pair + 2)
            return -1;
        c++;
    }
    return n == NVML_GPU_FABRIC_UUID_LEN ? 0 : -1;
}

static int all_zero(const unsigned char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (bytes[i])
            return 0;
    return 1;
}

static void format_uuid(char *out, size_t cap, const unsigned char u[NVML_GPU_FABRIC_UUID_LEN]) {
    snprintf(out, cap,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
             u[15]);
}

/* `fabric <state> [<clusterUuid> <cliqueId>]` */
static int parse_fabric(fake_gpu *gpu, const char *rest) {
    char uuid[TEXT];
    int fields = sscanf(rest, "%u %95s %u", &gpu->fabric_state, uuid, &gpu->clique_id);
    memset(gpu->cluster_uuid, 0, sizeof gpu->cluster_uuid);
    if (fields == 1)
        gpu->clique_id = 0;
    else if (fields != 3 || parse_uuid(gpu->cluster_uuid, uuid) != 0)
        return -1;
    gpu->has_fabric = 1;
    return gpu->fabric_state <= NVML_GPU_FABRIC_STATE_COMPLETED ? 0 : -1;
}

static int parse_line(char *line, fake_gpu **cur) {
    char word[32], rest[1024];
    int n = 0;
    if (sscanf(line, "%31s %n", word, &n) != 1)
        return 0; /* blank */
    if (word[0] == '#')
        return 0;
    copy_text(rest, sizeof rest, line + n);
    rest[strcspn(rest, "\r\n")] = '\0';

    if (strcmp(word, "driver") == 0) {
        copy_text(g_driver, sizeof g_driver, rest);
        return 0;
    }
    if (strcmp(word, "cuda") == 0)
        return sscanf(rest, "%d", &g_cuda) == 1 ? 0 : -1;
    if (strcmp(word, "gpu") == 0) {
        if (g_ngpus >= MAX_GPUS)
            return -1;
        fake_gpu *gpu = &g_gpus[g_ngpus];
        memset(gpu, 0, sizeof *gpu);
        gpu->handle.gpu = g_ngpus;
        gpu->handle.mig = -1;
        gpu->event_types = DEFAULT_EVENT_TYPES;
        copy_text(gpu->uuid, sizeof gpu->uuid, rest);
        *cur = gpu;
        g_ngpus++;
        return 0;
    }
    fake_gpu *gpu = *cur;
    if (!gpu)
        return -1;
    if (strcmp(word, "minor") == 0)
        return sscanf(rest, "%u", &gpu->minor) == 1 ? 0 : -1;
    if (strcmp(word, "name") == 0) {
        copy_text(gpu->name, sizeof gpu->name, rest);
        return 0;
    }
    if (strcmp(word, "brand") == 0)
        return sscanf(rest, "%u", &gpu->brand) == 1 ? 0 : -1;
    if (strcmp(word, "arch") == 0)
        return sscanf(rest, "%u", &gpu->arch) == 1 ? 0 : -1;
    if (strcmp(word, "cc") == 0)
        return sscanf(rest, "%d %d", &gpu->cc_major, &gpu->cc_minor) == 2 ? 0 : -1;
    if (strcmp(word, "pci") == 0) {
        copy_text(gpu->bus_id, sizeof gpu->bus_id, rest);
        return 0;
    }
    if (strcmp(word, "memory") == 0)
        return sscanf(rest, "%llu", &gpu->memory) == 1 ? 0 : -1;
    if (strcmp(word, "cores") == 0)
        return sscanf(rest, "%u", &gpu->cores) == 1 ? 0 : -1;
    if (strcmp(word, "fabric") == 0)
        return parse_fabric(gpu, rest);
    if (strcmp(word, "mig") == 0) {
        gpu->mig_supported = 1;
        return sscanf(rest, "%u %u", &gpu->mig_current, &gpu->mig_pending) == 2 ? 0 : -1;
    }
    if (strcmp(word, "maxmig") == 0)
        return sscanf(rest, "%u", &gpu->max_mig) == 1 ? 0 : -1;
    if (strcmp(word, "events") == 0) {
        gpu->has_event_types = 1;
        return sscanf(rest, "%lli", (long long *)&gpu->event_types) == 1 ? 0 : -1;
    }
    if (strcmp(word, "timeslice") == 0) {
        gpu->has_timeslice = 1;
        return sscanf(rest, "%u", &gpu->timeslice) == 1 && gpu->timeslice <= MAX_TIMESLICE ? 0
                                                                                          : -1;
    }
    if (strcmp(word, "computemode") == 0) {
        gpu->has_compute_mode = 1;
        return sscanf(rest, "%u", &gpu->compute_mode) == 1 &&
                       gpu->compute_mode < NVML_COMPUTEMODE_COUNT
                   ? 0
                   : -1;
    }
    if (strcmp(word, "profile") == 0) {
        if (gpu->nprofiles >= MAX_PROFILES)
            return -1;
        fake_profile *p = &gpu->profiles[gpu->nprofiles];
        char placements[256];
        int name_at = 0;
        if (sscanf(rest, "%u %u %u %u %u %u %u %u %u %u %llu %255s %n", &p->nvml_index, &p->id,
                   &p->slices, &p->instances, &p->sm, &p->ce, &p->dec, &p->enc, &p->jpeg,
                   &p->ofa, &p->memory_mib, placements, &name_at) != 12 ||
            name_at == 0)
            return -1;
        copy_text(p->name, sizeof p->name, rest + name_at);
        if (parse_placements(p, placements) != 0)
            return -1;
        gpu->nprofiles++;
        return 0;
    }
    if (strcmp(word, "gi") == 0) {
        for (int i = 0; i < MAX_GIS; i++) {
            fake_gi *gi = &gpu->gis[i];
            if (gi->used)
                continue;
            if (sscanf(rest, "%u %u %u %u", &gi->id, &gi->profile_id, &gi->start, &gi->size) != 4)
                return -1;
            gi->used = 1;
            gi->handle.gpu = (int)(gpu - g_gpus);
            gi->handle.gi = i;
            return 0;
        }
        return -1;
    }
    if (strcmp(word, "ci") == 0) {
        for (int i = 0; i < MAX_CIS; i++) {
            fake_ci *ci = &gpu->cis[i];
            if (ci->used)
                continue;
            char uuid[TEXT];
            if (sscanf(rest, "%u %u %95s", &ci->gi_id, &ci->ci_id, uuid) != 3)
                return -1;
            copy_text(ci->uuid, sizeof ci->uuid, uuid);
            ci->used = 1;
            ci->handle.gpu = (int)(gpu - g_gpus);
            ci->handle.mig = i;
            ci->ci_handle.gpu = ci->handle.gpu;
            ci->ci_handle.ci = i;
            return 0;
        }
        return -1;
    }
    return -1;
}

static nvmlReturn_t load_data(void) {
    const char *path = getenv("FAKE_NVML_DATA");
    if (!path || !*path) {
        warn("FAKE_NVML_DATA is not set");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        warn("cannot open %s", path);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    copy_text(g_data_path, sizeof g_data_path, path);
    g_ngpus = 0;
    g_cuda = 0;
    g_driver[0] = '\0';
    fake_gpu *cur = NULL;
    char line[2048];
    int lineno = 0;
    nvmlReturn_t rc = NVML_SUCCESS;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (parse_line(line, &cur) != 0) {
            warn("%s:%d: cannot parse: %s", path, lineno, line);
            rc = NVML_ERROR_UNKNOWN;
            break;
        }
    }
    fclose(f);
    return rc;
}

/* ---- sharing the data file with other processes ------------------------------------- */

static int g_lock_fd = -1;
static int g_lock_depth;

/* Take the exclusive lock on "<data file>.lock" that every writer of the data file holds
 * (nested calls count; fakenvmlUnlockData releases). nvidia-smi holds it from loading the
 * file to saving it. Without a lock file (an unwritable directory) it goes on unlocked:
 * saving fails there anyway. */
int fakenvmlLockData(void) {
    if (g_lock_depth++ > 0)
        return 0;
    const char *path = g_data_path[0] ? g_data_path : getenv("FAKE_NVML_DATA");
    if (!path || !*path)
        return -1;
    char lock[4200];
    snprintf(lock, sizeof lock, "%s.lock", path);
    g_lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (g_lock_fd < 0)
        return -1;
    while (flock(g_lock_fd, LOCK_EX) != 0)
        if (errno != EINTR)
            return -1;
    return 0;
}

void fakenvmlUnlockData(void) {
    if (g_lock_depth <= 0 || --g_lock_depth > 0)
        return;
    if (g_lock_fd >= 0)
        close(g_lock_fd);
    g_lock_fd = -1;
}

static fake_gpu *gpu_by_uuid(const char *uuid) {
    for (int g = 0; g < g_ngpus; g++)
        if (strcmp(g_gpus[g].uuid, uuid) == 0)
            return &g_gpus[g];
    return NULL;
}

/* Take each GPU's `timeslice` and `computemode` from the data file as it is now (another
 * process may have set them), except those this process changed and has not saved yet. */
static void read_tool_state(void) {
    FILE *f = g_data_path[0] ? fopen(g_data_path, "r") : NULL;
    if (!f)
        return;
    for (int g = 0; g < g_ngpus; g++) {
        fake_gpu *gpu = &g_gpus[g];
        if (!gpu->timeslice_changed)
            gpu->has_timeslice = 0, gpu->timeslice = 0;
        if (!gpu->compute_mode_changed)
            gpu->has_compute_mode = 0, gpu->compute_mode = NVML_COMPUTEMODE_DEFAULT;
    }
    char line[2048], word[32], arg[TEXT];
    fake_gpu *cur = NULL;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%31s %95s", word, arg) != 2)
            continue;
        unsigned int value = 0;
        if (strcmp(word, "gpu") == 0)
            cur = gpu_by_uuid(arg);
        else if (!cur || sscanf(arg, "%u", &value) != 1)
            continue;
        else if (strcmp(word, "timeslice") == 0 && !cur->timeslice_changed &&
                 value <= MAX_TIMESLICE)
            cur->has_timeslice = 1, cur->timeslice = value;
        else if (strcmp(word, "computemode") == 0 && !cur->compute_mode_changed &&
                 value < NVML_COMPUTEMODE_COUNT)
            cur->has_compute_mode = 1, cur->compute_mode = value;
    }
    fclose(f);
}

/* Write the in-memory state back in the format load_data reads (a temporary file of this
 * process, then rename), under the data file's lock; the tool-set records as read_tool_state
 * finds them. */
static nvmlReturn_t save_data(void) {
    fakenvmlLockData();
    read_tool_state();
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", g_data_path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fakenvmlUnlockData();
        return NVML_ERROR_UNKNOWN;
    }
    fprintf(f, "driver %s\ncuda %d\n", g_driver, g_cuda);
    for (int g = 0; g < g_ngpus; g++) {
        fake_gpu *gpu = &g_gpus[g];
        fprintf(f, "gpu %s\nminor %u\nname %s\nbrand %u\narch %u\ncc %d %d\npci %s\n", gpu->uuid,
                gpu->minor, gpu->name, gpu->brand, gpu->arch, gpu->cc_major, gpu->cc_minor,
                gpu->bus_id);
        fprintf(f, "memory %llu\ncores %u\n", gpu->memory, gpu->cores);
        if (gpu->has_fabric && all_zero(gpu->cluster_uuid, sizeof gpu->cluster_uuid)) {
            fprintf(f, "fabric %u\n", gpu->fabric_state);
        } else if (gpu->has_fabric) {
            char uuid[40];
            format_uuid(uuid, sizeof uuid, gpu->cluster_uuid);
            fprintf(f, "fabric %u %s %u\n", gpu->fabric_state, uuid, gpu->clique_id);
        }
        if (gpu->mig_supported)
            fprintf(f, "mig %u %u\nmaxmig %u\n", gpu->mig_current, gpu->mig_pending,
                    gpu->max_mig);
        if (gpu->has_event_types)
            fprintf(f, "events 0x%llx\n", gpu->event_types);
        if (gpu->has_timeslice)
            fprintf(f, "timeslice %u\n", gpu->timeslice);
        if (gpu->has_compute_mode)
            fprintf(f, "computemode %u\n", gpu->compute_mode);
        for (int i = 0; i < gpu->nprofiles; i++) {
            fake_profile *p = &gpu->profiles[i];
            fprintf(f, "profile %u %u %u %u %u %u %u %u %u %u %llu ", p->nvml_index, p->id,
                    p->slices, p->instances, p->sm, p->ce, p->dec, p->enc, p->jpeg, p->ofa,
                    p->memory_mib);
            for (unsigned int k = 0; k < p->nplacements; k++)
                fprintf(f, "%s%u", k ? "," : "", p->placements[k].start);
            fprintf(f, ":%u %s\n", p->nplacements ? p->placements[0].size : 1, p->name);
        }
        for (int i = 0; i < MAX_GIS; i++)
            if (gpu->gis[i].used)
                fprintf(f, "gi %u %u %u %u\n", gpu->gis[i].id, gpu->gis[i].profile_id,
                        gpu->gis[i].start, gpu->gis[i].size);
        for (int i = 0; i < MAX_CIS; i++)
            if (gpu->cis[i].used)
                fprintf(f, "ci %u %u %s\n", gpu->cis[i].gi_id, gpu->cis[i].ci_id,
                        gpu->cis[i].uuid);
    }
    nvmlReturn_t rc = NVML_SUCCESS;
    if (fclose(f) != 0 || rename(tmp, g_data_path) != 0) {
        unlink(tmp);
        rc = NVML_ERROR_UNKNOWN;
    } else {
        /* Saved: from now on the file is the truth for these too. */
        for (int g = 0; g < g_ngpus; g++)
            g_gpus[g].timeslice_changed = g_gpus[g].compute_mode_changed = 0;
    }
    fakenvmlUnlockData();
    return rc;
}

/* ---- initialisation -------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    FAIL_POINT("nvmlInitWithFlags");
    if (g_refcount == 0) {
        nvmlReturn_t rc = load_data();
        if (rc != NVML_SUCCESS)
            return rc;
    }
    g_refcount++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    FAIL_POINT("nvmlShutdown");
    NEED_INIT();
    if (--g_refcount == 0) {
        /* NVML frees them here too; a client that forgets nvmlEventSetFree is told so. */
        int leaked = 0;
        for (int i = 0; i < MAX_EVENT_SETS; i++) {
            leaked += g_event_sets[i].used;
            g_event_sets[i].used = 0;
        }
        if (leaked)
            warn("nvmlShutdown: %d event set(s) not freed with nvmlEventSetFree", leaked);
    }
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case NVML_ERROR_NOT_FOUND:
        return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
        return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT:
        return "Timeout";
    case NVML_ERROR_GPU_IS_LOST:
        return "GPU is lost";
    case NVML_ERROR_IN_USE:
        return "In use by another client";
    case NVML_ERROR_INSUFFICIENT_RESOURCES:
        return "Insufficient Resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
        return "Argument Version Mismatch";
    default:
        return "Unknown Error";
    }
}

/* ---- system ---------------------------------------------------------------------------- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    FAIL_POINT("nvmlSystemGetDriverVersion");
    NEED_INIT();
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(g_driver) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    copy_text(version, length, g_driver);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    FAIL_POINT("nvmlSystemGetCudaDriverVersion");
    NEED_INIT();
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = g_cuda;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- devices --------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    FAIL_POINT("nvmlDeviceGetCount_v2");
    NEED_INIT();
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = (unsigned int)g_ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    FAIL_POINT("nvmlDeviceGetHandleByIndex_v2");
    NEED_INIT();
    if (!device || index >= (unsigned int)g_ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_gpus[index].handle;
    return NVML_SUCCESS;
}

static nvmlReturn_t put_text(char *dst, unsigned int length, const char *src) {
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    copy_text(dst, length, src);
    return NVML_SUCCESS;
}

/* The handle of the GPU or MIG device with this UUID, or NULL. */
static nvmlDevice_t device_by_uuid(const char *uuid) {
    for (int g = 0; g < g_ngpus; g++) {
        fake_gpu *gpu = &g_gpus[g];
        if (strcmp(gpu->uuid, uuid) == 0)
            return &gpu->handle;
        for (int i = 0; i < MAX_CIS; i++)
            if (gpu->cis[i].used && strcmp(gpu->cis[i].uuid, uuid) == 0)
                return &gpu->cis[i].handle;
    }
    return NULL;
}

/* Whether the health file has the line "<uuid> <state>". */
static int health_is(const char *uuid, const char *state) {
    const char *path = getenv("FAKE_NVML_HEALTH");
    if (!path || !*path)
        return 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[256], who[TEXT], what[32];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "%95s %31s", who, what) == 2 && strcmp(who, uuid) == 0 &&
                strcmp(what, state) == 0;
    fclose(f);
    return found;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    FAIL_POINT("nvmlDeviceGetHandleByUUID");
    NEED_INIT();
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlDevice_t found = device_by_uuid(uuid);
    if (!found)
        return NVML_ERROR_NOT_FOUND;
    fake_gpu *parent = gpu_of(found);
    if (health_is(parent->uuid, "lost"))
        return NVML_ERROR_GPU_IS_LOST;
    *device = found;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    FAIL_POINT("nvmlDeviceGetUUID");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (gpu)
        return put_text(uuid, length, gpu->uuid);
    fake_ci *mig = mig_of(device);
    if (mig)
        return put_text(uuid, length, mig->uuid);
    return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    FAIL_POINT("nvmlDeviceGetName");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    return gpu ? put_text(name, length, gpu->name) : NVML_ERROR_INVALID_ARGUMENT;
}

#define GPU_UINT_GETTER(fn, field)                              \
    nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out) {   \
        FAIL_POINT(#fn);                                        \
        NEED_INIT();                                            \
        fake_gpu *gpu = whole_gpu(device);                      \
        if (!gpu || !out)                                       \
            return NVML_ERROR_INVALID_ARGUMENT;                 \
        *out = gpu->field;                                      \
        return NVML_SUCCESS;                                    \
    }

GPU_UINT_GETTER(nvmlDeviceGetMinorNumber, minor)
GPU_UINT_GETTER(nvmlDeviceGetBrand, brand)
GPU_UINT_GETTER(nvmlDeviceGetArchitecture, arch)
GPU_UINT_GETTER(nvmlDeviceGetNumGpuCores, cores)

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    FAIL_POINT("nvmlDeviceGetIndex");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)device->gpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    FAIL_POINT("nvmlDeviceGetCudaComputeCapability");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = gpu->cc_major;
    *minor = gpu->cc_minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    FAIL_POINT("nvmlDeviceGetPciInfo_v3");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    unsigned int function = 0;
    if (sscanf(gpu->bus_id, "%x:%x:%x.%x", &pci->domain, &pci->bus, &pci->device, &function) != 4)
        return NVML_ERROR_UNKNOWN;
    copy_text(pci->busId, sizeof pci->busId, gpu->bus_id);
    /* The legacy field is the short form with a 4-digit domain, as NVML fills it. */
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.%x", pci->domain & 0xffff,
             pci->bus, pci->device, function);
    pci->pciDeviceId = 0x10de; /* vendor in the low half; the device id is not modelled */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    FAIL_POINT("nvmlDeviceGetMemoryInfo");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = gpu->memory;
    memory->used = 0;
    memory->free = gpu->memory;
    return NVML_SUCCESS;
}

/* ---- NVLink fabric --------------------------------------------------------------------- */

/* The GPU's fabric fields, or NVML_ERROR_NOT_SUPPORTED for a GPU without a `fabric` record. */
static nvmlReturn_t fabric_of(nvmlDevice_t device, fake_gpu **out) {
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu->has_fabric)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = gpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info) {
    FAIL_POINT("nvmlDeviceGetGpuFabricInfo");
    NEED_INIT();
    fake_gpu *gpu = NULL;
    nvmlReturn_t rc = info ? fabric_of(device, &gpu) : NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return rc;
    memset(info, 0, sizeof *info);
    memcpy(info->clusterUuid, gpu->cluster_uuid, sizeof info->clusterUuid);
    info->status = NVML_SUCCESS;
    info->cliqueId = gpu->clique_id;
    info->state = gpu->fabric_state;
    return NVML_SUCCESS;
}

/* Versions 2 and 3 share their prefix; v3 adds the health summary (0: NOT_SUPPORTED). */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfo_v3_t *info) {
    FAIL_POINT("nvmlDeviceGetGpuFabricInfoV");
    NEED_INIT();
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int version = info->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    fake_gpu *gpu = NULL;
    nvmlReturn_t rc = fabric_of(device, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    memset(info, 0, version == nvmlGpuFabricInfo_v3 ? sizeof(nvmlGpuFabricInfo_v3_t)
                                                    : sizeof(nvmlGpuFabricInfo_v2_t));
    info->version = version;
    memcpy(info->clusterUuid, gpu->cluster_uuid, sizeof info->clusterUuid);
    info->status = NVML_SUCCESS;
    info->cliqueId = gpu->clique_id;
    info->state = gpu->fabric_state;
    return NVML_SUCCESS;
}

/* ---- compute mode and time-slice (persisted to the data file) ------------------------- */

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, unsigned int *mode) {
    FAIL_POINT("nvmlDeviceGetComputeMode");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    read_tool_state();
    *mode = gpu->compute_mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, unsigned int mode) {
    FAIL_POINT("nvmlDeviceSetComputeMode");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || mode >= NVML_COMPUTEMODE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mode == NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
        return NVML_ERROR_NOT_SUPPORTED;
    int had = gpu->has_compute_mode;
    unsigned int old = gpu->compute_mode;
    gpu->has_compute_mode = gpu->compute_mode_changed = 1;
    gpu->compute_mode = mode;
    nvmlReturn_t rc = save_data();
    if (rc != NVML_SUCCESS) {
        gpu->has_compute_mode = had;
        gpu->compute_mode = old;
        gpu->compute_mode_changed = 0;
    }
    return rc;
}

/* The time-slice of `nvidia-smi compute-policy`: NVML has no call for it, so these two are
 * the stand-in's own (named so nobody mistakes them for NVML's). A MIG device has none. */
nvmlReturn_t fakenvmlDeviceGetTimeslice(nvmlDevice_t device, unsigned int *timeslice) {
    FAIL_POINT("fakenvmlDeviceGetTimeslice");
    NEED_INIT();
    if (mig_of(device))
        return NVML_ERROR_NOT_SUPPORTED;
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !timeslice)
        return NVML_ERROR_INVALID_ARGUMENT;
    read_tool_state();
    *timeslice = gpu->timeslice;
    return NVML_SUCCESS;
}

nvmlReturn_t fakenvmlDeviceSetTimeslice(nvmlDevice_t device, unsigned int timeslice) {
    FAIL_POINT("fakenvmlDeviceSetTimeslice");
    NEED_INIT();
    if (mig_of(device))
        return NVML_ERROR_NOT_SUPPORTED;
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || timeslice > MAX_TIMESLICE)
        return NVML_ERROR_INVALID_ARGUMENT;
    int had = gpu->has_timeslice;
    unsigned int old = gpu->timeslice;
    gpu->has_timeslice = gpu->timeslice_changed = 1;
    gpu->timeslice = timeslice;
    nvmlReturn_t rc = save_data();
    if (rc != NVML_SUCCESS) {
        gpu->has_timeslice = had;
        gpu->timeslice = old;
        gpu->timeslice_changed = 0;
    }
    return rc;
}

/* Which driver version this library stands in for, as the driver root's other simulated
 * libraries answer (tests/node/loadcheck.c asks every library it loads). */
const char *simulated_driver_version(void) { return FAKE_NVML_VERSION; }

/* ---- MIG ------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode) {
    FAIL_POINT("nvmlDeviceGetMigMode");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu->mig_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = gpu->mig_current;
    *pendingMode = gpu->mig_pending;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    FAIL_POINT("nvmlDeviceGetGpuInstanceProfileInfoV");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !info)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* Catches a caller whose struct layout differs from this one. */
    if (info->version != nvmlGpuInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!gpu->mig_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    fake_profile *p = profile_by_index(gpu, profile);
    if (!p)
        return NVML_ERROR_NOT_SUPPORTED;
    info->id = p->id;
    info->isP2pSupported = 0;
    info->sliceCount = p->slices;
    info->instanceCount = p->instances;
    info->multiprocessorCount = p->sm;
    info->copyEngineCount = p->ce;
    info->decoderCount = p->dec;
    info->encoderCount = p->enc;
    info->jpegCount = p->jpeg;
    info->ofaCount = p->ofa;
    info->memorySizeMB = p->memory_mib;
    copy_text(info->name, sizeof info->name, p->name);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device,
                                                           unsigned int profileId,
                                                           nvmlGpuInstancePlacement_t *placements,
                                                           unsigned int *count) {
    FAIL_POINT("nvmlDeviceGetGpuInstancePossiblePlacements_v2");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu->mig_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    fake_profile *p = profile_by_id(gpu, profileId);
    if (!p)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* NULL placements asks for the count only, as in NVML. */
    if (placements) {
        if (*count < p->nplacements)
            return NVML_ERROR_INSUFFICIENT_SIZE;
        memcpy(placements, p->placements, p->nplacements * sizeof *placements);
    }
    *count = p->nplacements;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    FAIL_POINT("nvmlDeviceGetMaxMigDeviceCount");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = gpu->mig_supported ? gpu->max_mig : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice) {
    FAIL_POINT("nvmlDeviceGetMigDeviceHandleByIndex");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !migDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu->mig_supported || !gpu->mig_current)
        return NVML_ERROR_NOT_SUPPORTED;
    if (index >= gpu->max_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int seen = 0;
    for (int i = 0; i < MAX_CIS; i++) {
        if (!gpu->cis[i].used)
            continue;
        if (seen++ == index) {
            *migDevice = &gpu->cis[i].handle;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    FAIL_POINT("nvmlDeviceIsMigDeviceHandle");
    NEED_INIT();
    if (!gpu_of(device) || !isMigDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = device->mig >= 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                          nvmlDevice_t *device) {
    FAIL_POINT("nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    NEED_INIT();
    if (!mig_of(migDevice) || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_gpus[migDevice->gpu].handle;
    return NVML_SUCCESS;
}

/* ---- health ----------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *isPending) {
    FAIL_POINT("nvmlDeviceGetRetiredPagesPendingStatus");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !isPending)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (health_is(gpu->uuid, "no-retire"))
        return NVML_ERROR_NOT_SUPPORTED;
    *isPending = health_is(gpu->uuid, "pages-pending");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                       unsigned int *uncRows, unsigned int *isPending,
                                       unsigned int *failureOccurred) {
    FAIL_POINT("nvmlDeviceGetRemappedRows");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !corrRows || !uncRows || !isPending || !failureOccurred)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (health_is(gpu->uuid, "no-remap"))
        return NVML_ERROR_NOT_SUPPORTED;
    *isPending = (unsigned int)health_is(gpu->uuid, "remap-pending");
    *failureOccurred = (unsigned int)health_is(gpu->uuid, "remap-failed");
    *corrRows = 0;
    *uncRows = *isPending || *failureOccurred;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    FAIL_POINT("nvmlDeviceGetGpuInstanceId");
    NEED_INIT();
    fake_ci *mig = mig_of(device);
    if (!mig || !id)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = mig->gi_id;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    FAIL_POINT("nvmlDeviceGetComputeInstanceId");
    NEED_INIT();
    fake_ci *mig = mig_of(device);
    if (!mig || !id)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = mig->ci_id;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    FAIL_POINT("nvmlDeviceGetAttributes_v2");
    NEED_INIT();
    fake_ci *mig = mig_of(device);
    if (!mig || !attributes)
        return NVML_ERROR_NOT_SUPPORTED;
    fake_gpu *gpu = &g_gpus[device->gpu];
    fake_gi *gi = gi_by_id(gpu, mig->gi_id);
    fake_profile *p = gi ? profile_by_id(gpu, gi->profile_id) : NULL;
    if (!p)
        return NVML_ERROR_UNKNOWN;
    /* A compute instance spanning its whole GPU instance: it gets all of the profile. */
    attributes->multiprocessorCount = p->sm;
    attributes->sharedCopyEngineCount = p->ce;
    attributes->sharedDecoderCount = p->dec;
    attributes->sharedEncoderCount = p->enc;
    attributes->sharedJpegCount = p->jpeg;
    attributes->sharedOfaCount = p->ofa;
    attributes->gpuInstanceSliceCount = p->slices;
    attributes->computeInstanceSliceCount = p->slices;
    attributes->memorySizeMB = p->memory_mib;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                          nvmlGpuInstance_t *gpuInstance) {
    FAIL_POINT("nvmlDeviceGetGpuInstanceById");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !gpuInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu->mig_supported || !gpu->mig_current)
        return NVML_ERROR_NOT_SUPPORTED;
    fake_gi *gi = gi_by_id(gpu, id);
    if (!gi)
        return NVML_ERROR_NOT_FOUND;
    *gpuInstance = &gi->handle;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    FAIL_POINT("nvmlGpuInstanceGetInfo");
    NEED_INIT();
    if (!gpuInstance || !info || gpuInstance->gpu < 0 || gpuInstance->gpu >= g_ngpus ||
        gpuInstance->gi < 0 || gpuInstance->gi >= MAX_GIS)
        return NVML_ERROR_INVALID_ARGUMENT;
    fake_gpu *gpu = &g_gpus[gpuInstance->gpu];
    fake_gi *gi = &gpu->gis[gpuInstance->gi];
    if (!gi->used)
        return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &gpu->handle;
    info->id = gi->id;
    info->profileId = gi->profile_id;
    info->placement.start = gi->start;
    info->placement.size = gi->size;
    return NVML_SUCCESS;
}

/* ---- changing MIG state (persisted to the data file) ----------------------------------- */

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                      const nvmlGpuInstancePlacement_t *placement,
                                                      nvmlGpuInstance_t *gpuInstance) {
    FAIL_POINT("nvmlDeviceCreateGpuInstanceWithPlacement");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !placement || !gpuInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu->mig_supported || !gpu->mig_current)
        return NVML_ERROR_NOT_SUPPORTED;
    fake_profile *p = profile_by_id(gpu, profileId);
    if (!p)
        return NVML_ERROR_INVALID_ARGUMENT;
    int valid = 0;
    for (unsigned int k = 0; k < p->nplacements; k++)
        if (p->placements[k].start == placement->start && p->placements[k].size == placement->size)
            valid = 1;
    if (!valid)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int same_profile = 0;
    int free_slot = -1;
    for (int i = 0; i < MAX_GIS; i++) {
        fake_gi *gi = &gpu->gis[i];
        if (!gi->used) {
            if (free_slot < 0)
                free_slot = i;
            continue;
        }
        if (gi->profile_id == profileId)
            same_profile++;
        /* Memory slices [start, start+size) must not overlap an existing instance. */
        if (gi->start < placement->start + placement->size && placement->start < gi->start + gi->size)
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    if (free_slot < 0 || same_profile >= p->instances)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    unsigned int id = 1; /* the smallest id not in use */
    while (gi_by_id(gpu, id))
        id++;
    fake_gi *gi = &gpu->gis[free_slot];
    gi->used = 1;
    gi->id = id;
    gi->profile_id = profileId;
    gi->start = placement->start;
    gi->size = placement->size;
    gi->handle.gpu = device->gpu;
    gi->handle.gi = free_slot;
    nvmlReturn_t rc = save_data();
    if (rc != NVML_SUCCESS) {
        gi->used = 0;
        return rc;
    }
    *gpuInstance = &gi->handle;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance) {
    FAIL_POINT("nvmlGpuInstanceDestroy");
    NEED_INIT();
    if (!gpuInstance || gpuInstance->gpu < 0 || gpuInstance->gpu >= g_ngpus ||
        gpuInstance->gi < 0 || gpuInstance->gi >= MAX_GIS)
        return NVML_ERROR_INVALID_ARGUMENT;
    fake_gpu *gpu = &g_gpus[gpuInstance->gpu];
    fake_gi *gi = &gpu->gis[gpuInstance->gi];
    if (!gi->used)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* As in NVML, compute instances have to go first. */
    for (int i = 0; i < MAX_CIS; i++)
        if (gpu->cis[i].used && gpu->cis[i].gi_id == gi->id)
            return NVML_ERROR_IN_USE;
    gi->used = 0;
    nvmlReturn_t rc = save_data();
    if (rc != NVML_SUCCESS)
        gi->used = 1;
    return rc;
}

/* ---- MIG mode and compute instances (persisted to the data file) ----------------------- */

nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                  nvmlReturn_t *activationStatus) {
    FAIL_POINT("nvmlDeviceSetMigMode");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !activationStatus || mode > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu->mig_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!mode)
        for (int i = 0; i < MAX_GIS; i++)
            if (gpu->gis[i].used)
                return NVML_ERROR_IN_USE;
    unsigned int old_current = gpu->mig_current, old_pending = gpu->mig_pending;
    /* The stand-in switches at once, as a GPU without processes does after its reset. */
    gpu->mig_current = gpu->mig_pending = mode;
    nvmlReturn_t rc = save_data();
    if (rc != NVML_SUCCESS) {
        gpu->mig_current = old_current;
        gpu->mig_pending = old_pending;
    }
    *activationStatus = rc;
    return rc;
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                       nvmlGpuInstance_t *gpuInstances, unsigned int *count) {
    FAIL_POINT("nvmlDeviceGetGpuInstances");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !gpuInstances || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu->mig_supported || !gpu->mig_current)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!profile_by_id(gpu, profileId))
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    for (int i = 0; i < MAX_GIS; i++)
        if (gpu->gis[i].used && gpu->gis[i].profile_id == profileId)
            gpuInstances[n++] = &gpu->gis[i].handle;
    *count = n;
    return NVML_SUCCESS;
}

static fake_gi *gi_of(nvmlGpuInstance_t gpuInstance, fake_gpu **gpu_out) {
    if (!gpuInstance || gpuInstance->gpu < 0 || gpuInstance->gpu >= g_ngpus ||
        gpuInstance->gi < 0 || gpuInstance->gi >= MAX_GIS)
        return NULL;
    fake_gpu *gpu = &g_gpus[gpuInstance->gpu];
    fake_gi *gi = &gpu->gis[gpuInstance->gi];
    if (!gi->used)
        return NULL;
    *gpu_out = gpu;
    return gi;
}

/* NVML_COMPUTE_INSTANCE_PROFILE_* index of the compute instance spanning `slices` slices. */
static int full_ci_profile(unsigned int slices) {
    static const int by_slices[9] = {-1, 0, 1, 2, 3, -1, 6, 4, 5};
    return slices < 9 ? by_slices[slices] : -1;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_v2_t *info) {
    FAIL_POINT("nvmlGpuInstanceGetComputeInstanceProfileInfoV");
    NEED_INIT();
    fake_gpu *gpu = NULL;
    fake_gi *gi = gi_of(gpuInstance, &gpu);
    if (!gi || !info || engProfile != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlComputeInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    fake_profile *p = profile_by_id(gpu, gi->profile_id);
    /* Only the compute instance that spans the whole GPU instance is modelled. */
    if (!p || full_ci_profile(p->slices) != (int)profile)
        return NVML_ERROR_NOT_SUPPORTED;
    info->id = profile;
    info->sliceCount = p->slices;
    info->instanceCount = 1;
    info->multiprocessorCount = p->sm;
    info->sharedCopyEngineCount = p->ce;
    info->sharedDecoderCount = p->dec;
    info->sharedEncoderCount = p->enc;
    info->sharedJpegCount = p->jpeg;
    info->sharedOfaCount = p->ofa;
    snprintf(info->name, sizeof info->name, "MIG %ug", p->slices);
    return NVML_SUCCESS;
}

static void random_mig_uuid(char *out, size_t cap) {
    unsigned char b[16] = {0};
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(b, 1, sizeof b, f) != sizeof b) {
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = (unsigned char)rand();
    }
    if (f)
        fclose(f);
    snprintf(out, cap,
             "MIG-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance,
                                                  unsigned int profileId,
                                                  nvmlComputeInstance_t *computeInstance) {
    FAIL_POINT("nvmlGpuInstanceCreateComputeInstance");
    NEED_INIT();
    fake_gpu *gpu = NULL;
    fake_gi *gi = gi_of(gpuInstance, &gpu);
    if (!gi || !computeInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    fake_profile *p = profile_by_id(gpu, gi->profile_id);
    if (!p || full_ci_profile(p->slices) != (int)profileId)
        return NVML_ERROR_NOT_SUPPORTED;
    int free_slot = -1;
    for (int i = 0; i < MAX_CIS; i++) {
        if (gpu->cis[i].used && gpu->cis[i].gi_id == gi->id)
            return NVML_ERROR_INSUFFICIENT_RESOURCES; /* the GI is fully used */
        if (!gpu->cis[i].used && free_slot < 0)
            free_slot = i;
    }
    if (free_slot < 0)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    fake_ci *ci = &gpu->cis[free_slot];
    memset(ci, 0, sizeof *ci);
    ci->used = 1;
    ci->gi_id = gi->id;
    ci->ci_id = 0;
    random_mig_uuid(ci->uuid, sizeof ci->uuid);
    ci->handle.gpu = ci->ci_handle.gpu = (int)(gpu - g_gpus);
    ci->handle.mig = ci->ci_handle.ci = free_slot;
    nvmlReturn_t rc = save_data();
    if (rc != NVML_SUCCESS) {
        ci->used = 0;
        return rc;
    }
    *computeInstance = &ci->ci_handle;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance,
                                                unsigned int profileId,
                                                nvmlComputeInstance_t *computeInstances,
                                                unsigned int *count) {
    FAIL_POINT("nvmlGpuInstanceGetComputeInstances");
    NEED_INIT();
    fake_gpu *gpu = NULL;
    fake_gi *gi = gi_of(gpuInstance, &gpu);
    if (!gi || !computeInstances || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    fake_profile *p = profile_by_id(gpu, gi->profile_id);
    unsigned int n = 0;
    if (p && full_ci_profile(p->slices) == (int)profileId)
        for (int i = 0; i < MAX_CIS; i++)
            if (gpu->cis[i].used && gpu->cis[i].gi_id == gi->id)
                computeInstances[n++] = &gpu->cis[i].ci_handle;
    *count = n;
    return NVML_SUCCESS;
}

static fake_ci *ci_of(nvmlComputeInstance_t computeInstance, fake_gpu **gpu_out) {
    if (!computeInstance || computeInstance->gpu < 0 || computeInstance->gpu >= g_ngpus ||
        computeInstance->ci < 0 || computeInstance->ci >= MAX_CIS)
        return NULL;
    fake_gpu *gpu = &g_gpus[computeInstance->gpu];
    fake_ci *ci = &gpu->cis[computeInstance->ci];
    if (!ci->used)
        return NULL;
    *gpu_out = gpu;
    return ci;
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                           nvmlComputeInstanceInfo_t *info) {
    FAIL_POINT("nvmlComputeInstanceGetInfo_v2");
    NEED_INIT();
    fake_gpu *gpu = NULL;
    fake_ci *ci = ci_of(computeInstance, &gpu);
    if (!ci || !info)
        return NVML_ERROR_INVALID_ARGUMENT;
    fake_gi *gi = gi_by_id(gpu, ci->gi_id);
    fake_profile *p = gi ? profile_by_id(gpu, gi->profile_id) : NULL;
    if (!p)
        return NVML_ERROR_UNKNOWN;
    info->device = &gpu->handle;
    info->gpuInstance = &gi->handle;
    info->id = ci->ci_id;
    info->profileId = (unsigned int)full_ci_profile(p->slices);
    info->placement.start = 0;
    info->placement.size = p->slices;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance) {
    FAIL_POINT("nvmlComputeInstanceDestroy");
    NEED_INIT();
    fake_gpu *gpu = NULL;
    fake_ci *ci = ci_of(computeInstance, &gpu);
    if (!ci)
        return NVML_ERROR_INVALID_ARGUMENT;
    ci->used = 0;
    nvmlReturn_t rc = save_data();
    if (rc != NVML_SUCCESS)
        ci->used = 1;
    return rc;
}

/* ---- events (from the FAKE_NVML_EVENTS file) ------------------------------------------- */

static struct nvmlEventSet_st *event_set_of(nvmlEventSet_t set) {
    if (!set || set < g_event_sets || set >= g_event_sets + MAX_EVENT_SETS || !set->used)
        return NULL;
    return set;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    FAIL_POINT("nvmlEventSetCreate");
    NEED_INIT();
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < MAX_EVENT_SETS; i++) {
        if (g_event_sets[i].used)
            continue;
        memset(&g_event_sets[i], 0, sizeof g_event_sets[i]);
        g_event_sets[i].used = 1;
        /* Events already in the file happened before this set: start after them. */
        const char *path = getenv("FAKE_NVML_EVENTS");
        FILE *f = path && *path ? fopen(path, "r") : NULL;
        if (f) {
            char line[512];
            while (fgets(line, sizeof line, f) && strchr(line, '\n'))
                g_event_sets[i].offset += (long)strlen(line);
            fclose(f);
        }
        *set = &g_event_sets[i];
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INSUFFICIENT_RESOURCES;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    FAIL_POINT("nvmlEventSetFree");
    NEED_INIT();
    struct nvmlEventSet_st *es = event_set_of(set);
    if (!es)
        return NVML_ERROR_INVALID_ARGUMENT;
    es->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                              unsigned long long *eventTypes) {
    FAIL_POINT("nvmlDeviceGetSupportedEventTypes");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    if (!gpu || !eventTypes)
        return NVML_ERROR_INVALID_ARGUMENT;
    *eventTypes = gpu->event_types;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set) {
    FAIL_POINT("nvmlDeviceRegisterEvents");
    NEED_INIT();
    fake_gpu *gpu = whole_gpu(device);
    struct nvmlEventSet_st *es = event_set_of(set);
    if (!gpu || !es)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* As in NVML, one unsupported type fails the whole registration. */
    if (eventTypes & ~gpu->event_types)
        return NVML_ERROR_NOT_SUPPORTED;
    es->registered[device->gpu] |= eventTypes;
    return NVML_SUCCESS;
}

static unsigned long long monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000ULL + (unsigned long long)ts.tv_nsec / 1000000ULL;
}

/* Read events file lines after the set's offset until one is an event for this set:
 * NVML_SUCCESS with `data` filled, NVML_ERROR_GPU_IS_LOST, or NVML_ERROR_TIMEOUT when no
 * (complete) line is left. */
static nvmlReturn_t next_event(struct nvmlEventSet_st *es, const char *path,
                               nvmlEventData_t *data) {
    FILE *f = fopen(path, "r");
    if (!f)
        return NVML_ERROR_TIMEOUT; /* not written yet */
    nvmlReturn_t rc = NVML_ERROR_TIMEOUT;
    char line[512];
    while (rc == NVML_ERROR_TIMEOUT && fseek(f, es->offset, SEEK_SET) == 0 &&
           fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n')
            break; /* still being written */
        es->offset += (long)len;
        char uuid[TEXT], kind[16];
        unsigned long long xid = 0;
        int fields = sscanf(line, "%95s %15s %llu", uuid, kind, &xid);
        if (fields < 1 || uuid[0] == '#')
            continue;
        if (fields == 1 && strcmp(uuid, "lost") == 0) {
            es->lost = 1;
            rc = NVML_ERROR_GPU_IS_LOST;
            continue;
        }
        unsigned long long type;
        if (fields == 3 && strcmp(kind, "xid") == 0) {
            type = nvmlEventTypeXidCriticalError;
        } else if (fields == 2 && strcmp(kind, "dbe") == 0) {
            type = nvmlEventTypeDoubleBitEccError;
            xid = 0;
        } else {
            warn("%s: cannot parse event: %s", path, line);
            continue;
        }
        /* An event of a MIG device comes, as from NVML, on its GPU's handle with the
         * MIG device's GPU and compute instance ids. */
        nvmlDevice_t named = device_by_uuid(uuid);
        fake_gpu *gpu = gpu_of(named);
        fake_ci *mig = mig_of(named);
        if (!gpu) {
            warn("%s: event for an unknown GPU: %s", path, line);
            continue;
        }
        if (!(es->registered[gpu->handle.gpu] & type))
            continue;
        data->device = &gpu->handle;
        data->eventType = type;
        data->eventData = xid;
        data->gpuInstanceId = mig ? mig->gi_id : NO_INSTANCE;
        data->computeInstanceId = mig ? mig->ci_id : NO_INSTANCE;
        rc = NVML_SUCCESS;
    }
    fclose(f);
    return rc;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeoutms) {
    FAIL_POINT("nvmlEventSetWait_v2");
    NEED_INIT();
    struct nvmlEventSet_st *es = event_set_of(set);
    if (!es || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (es->lost)
        return NVML_ERROR_GPU_IS_LOST;
    const char *path = getenv("FAKE_NVML_EVENTS");
    unsigned long long deadline = monotonic_ms() + timeoutms;
    for (;;) {
        nvmlReturn_t rc = path && *path ? next_event(es, path, data) : NVML_ERROR_TIMEOUT;
        if (rc != NVML_ERROR_TIMEOUT)
            return rc;
        unsigned long long now = monotonic_ms();
        if (now >= deadline)
            return NVML_ERROR_TIMEOUT;
        unsigned long long nap = deadline - now < EVENT_POLL_MS ? deadline - now : EVENT_POLL_MS;
        struct timespec ts = {0, (long)(nap * 1000000ULL)};
        nanosleep(&ts, NULL);
    }
}
