/*
 * Stand-in nvidia-smi (docs/standin-driver.md): the subset of the real tool's command lines
 * that the driver runs or a test wants, answered through the stand-in NVML compiled into this
 * program (fakenvml.c), so it reads and writes the same data file ($FAKE_NVML_DATA) as the
 * library the agent loads.
 *
 *   nvidia-smi                                  a short table of the GPUs
 *   nvidia-smi -L | --list-gpus                 each GPU and its MIG devices, as the real tool
 *   nvidia-smi [-i ID] --query-gpu=F,... --format=csv[,noheader][,nounits]
 *              F: index uuid name pci.bus_id driver_version memory.total compute_mode
 *              mig.mode.current, and `timeslice` (a stand-in extension: 0..3)
 *   nvidia-smi [-i ID] -c MODE | --compute-mode=MODE
 *              MODE: 0|DEFAULT, 2|PROHIBITED, 3|EXCLUSIVE_PROCESS
 *   nvidia-smi compute-policy [-i ID] --set-timeslice=N     N: 0 DEFAULT .. 3 LONG
 *   nvidia-smi compute-policy [-i ID] -l | --list
 *   nvidia-smi -h | --help,  nvidia-smi --version
 *
 * ID (-i / --id): comma-separated GPU indexes, UUIDs or PCI bus ids. Exit status as the real
 * tool's: 0, or the NVML error code (2 invalid arguments, 6 no such device, 9 no driver, 15 GPU
 * lost, 255 other). A time-slice the stand-in NVML reports as not supported (a MIG device, or
 * FAKE_NVML_FAIL=fakenvmlDeviceSetTimeslice=3) is said on stdout with exit status 0, which is
 * what the agent's timeslice_failed() looks for.
 */
#include "fakenvml.c"

#include <strings.h>

#include "common.h"

#define EXIT_INVALID_ARGS 2
#define EXIT_NOT_FOUND 6
#define MAX_SELECTED (MAX_GPUS * (MAX_CIS + 1))
#define MAX_FIELDS 16

static const char *const TIMESLICE_NAMES[] = {"DEFAULT", "SHORT", "MEDIUM", "LONG"};

static int exit_code(nvmlReturn_t rc) { return rc > 0 && rc < 255 ? rc : 255; }

static int invalid_args(void) {
    printf("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n");
    return EXIT_INVALID_ARGS;
}

static int usage(void) {
    printf("NVIDIA System Management Interface -- v%s (stand-in for tests)\n\n"
           "nvidia-smi [-i ID] [OPTION]\n"
           "    -h, --help                 this help\n"
           "    --version                  versions of this tool, the driver and CUDA\n"
           "    -L, --list-gpus            list the GPUs and their MIG devices\n"
           "    -i, --id=ID                GPUs by index, UUID or PCI bus id, comma-separated\n"
           "    --query-gpu=FIELD,...      index, uuid, name, pci.bus_id, driver_version,\n"
           "                               memory.total, compute_mode, mig.mode.current,\n"
           "                               timeslice (stand-in extension)\n"
           "    --format=csv[,noheader][,nounits]\n"
           "    -c, --compute-mode=MODE    0/DEFAULT, 2/PROHIBITED, 3/EXCLUSIVE_PROCESS\n"
           "nvidia-smi compute-policy [-i ID] [-l | --set-timeslice=N]\n",
           STANDIN_DRIVER_VERSION);
    return 0;
}

/* Whether argv[*i] is the option `short_name` or `long_name` (also "--long=V"), with its
 * value in *value (the next argument unless given after "="): 1 yes, 0 no, -1 no value. */
static int option(int argc, char **argv, int *i, const char *short_name, const char *long_name,
                  const char **value) {
    const char *arg = argv[*i];
    size_t n = strlen(long_name);
    if (strncmp(arg, long_name, n) == 0 && arg[n] == '=') {
        *value = arg + n + 1;
        return 1;
    }
    if (strcmp(arg, long_name) != 0 && !(short_name && strcmp(arg, short_name) == 0))
        return 0;
    if (*i + 1 >= argc)
        return -1;
    *value = argv[++*i];
    return 1;
}

static int init_nvml(void) {
    nvmlReturn_t rc = nvmlInit_v2();
    if (rc == NVML_SUCCESS)
        return 0;
    if (rc == NVML_ERROR_DRIVER_NOT_LOADED)
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n\n");
    else
        printf("Failed to initialize NVML: %s\n", nvmlErrorString(rc));
    return exit_code(rc);
}

/* ---- which devices -i names ------------------------------------------------------------ */

static int parse_bus_id(const char *text, unsigned int out[4]) {
    if (sscanf(text, "%x:%x:%x.%x", &out[0], &out[1], &out[2], &out[3]) == 4)
        return 0;
    out[0] = 0;
    return sscanf(text, "%x:%x.%x", &out[1], &out[2], &out[3]) == 3 ? 0 : -1;
}

/* One -i item: a GPU (or, when `allow_mig`, a MIG device); 0, or an exit code after saying
 * why. */
static int find_device(const char *id, int allow_mig, nvmlDevice_t *out) {
    unsigned int count = 0;
    nvmlDeviceGetCount_v2(&count);
    if (*id && strspn(id, "0123456789") == strlen(id)) {
        if (nvmlDeviceGetHandleByIndex_v2((unsigned int)strtoul(id, NULL, 10), out) ==
            NVML_SUCCESS)
            return 0;
    } else if (strncmp(id, "GPU-", 4) == 0 || strncmp(id, "MIG-", 4) == 0) {
        nvmlReturn_t rc = nvmlDeviceGetHandleByUUID(id, out);
        if (rc == NVML_ERROR_GPU_IS_LOST) {
            printf("Unable to determine the device handle for GPU %s: GPU is lost. Reboot the "
                   "system to recover this GPU\n",
                   id);
            return exit_code(rc);
        }
        unsigned int is_mig = 0;
        if (rc == NVML_SUCCESS && nvmlDeviceIsMigDeviceHandle(*out, &is_mig) == NVML_SUCCESS &&
            (allow_mig || !is_mig))
            return 0;
    } else {
        unsigned int want[4], have[4];
        nvmlPciInfo_t pci;
        for (unsigned int i = 0; parse_bus_id(id, want) == 0 && i < count; i++) {
            if (nvmlDeviceGetHandleByIndex_v2(i, out) != NVML_SUCCESS ||
                nvmlDeviceGetPciInfo_v3(*out, &pci) != NVML_SUCCESS ||
                parse_bus_id(pci.busId, have) != 0)
                continue;
            if (memcmp(want, have, sizeof want) == 0)
                return 0;
        }
    }
    printf("No devices were found\n");
    return EXIT_NOT_FOUND;
}

/* The devices of -i `ids` (every GPU without -i) into `out`; 0 or an exit code. */
static int select_devices(const char *ids, int allow_mig, nvmlDevice_t *out, unsigned int *n) {
    *n = 0;
    if (!ids) {
        unsigned int count = 0;
        nvmlDeviceGetCount_v2(&count);
        for (unsigned int i = 0; i < count && *n < MAX_SELECTED; i++)
            if (nvmlDeviceGetHandleByIndex_v2(i, &out[*n]) == NVML_SUCCESS)
                (*n)++;
        return 0;
    }
    char list[1024];
    snprintf(list, sizeof list, "%s", ids);
    char *save = NULL;
    for (char *id = strtok_r(list, ",", &save); id; id = strtok_r(NULL, ",", &save)) {
        if (*n >= MAX_SELECTED)
            return invalid_args();
        int rc = find_device(id, allow_mig, &out[*n]);
        if (rc != 0)
            return rc;
        (*n)++;
    }
    return *n ? 0 : invalid_args();
}

/* How messages name a device: a GPU by its PCI bus id, a MIG device by its UUID. */
static void device_label(nvmlDevice_t device, char *out, size_t cap) {
    nvmlPciInfo_t pci;
    unsigned int is_mig = 0;
    nvmlDeviceIsMigDeviceHandle(device, &is_mig);
    if (!is_mig && nvmlDeviceGetPciInfo_v3(device, &pci) == NVML_SUCCESS)
        snprintf(out, cap, "%s", pci.busId);
    else if (nvmlDeviceGetUUID(device, out, (unsigned int)cap) != NVML_SUCCESS)
        snprintf(out, cap, "?");
}

/* ---- -L -------------------------------------------------------------------------------- */

/* The MIG profile name of a MIG device ("1g.10gb"), found as a program would through NVML. */
static void mig_profile_name(nvmlDevice_t gpu, nvmlDevice_t mig, char *out, size_t cap) {
    unsigned int gi_id;
    nvmlGpuInstance_t gi;
    nvmlGpuInstanceInfo_t info;
    snprintf(out, cap, "?");
    if (nvmlDeviceGetGpuInstanceId(mig, &gi_id) != NVML_SUCCESS ||
        nvmlDeviceGetGpuInstanceById(gpu, gi_id, &gi) != NVML_SUCCESS ||
        nvmlGpuInstanceGetInfo(gi, &info) != NVML_SUCCESS)
        return;
    for (unsigned int index = 0; index < MAX_PROFILES; index++) {
        nvmlGpuInstanceProfileInfo_v2_t profile;
        memset(&profile, 0, sizeof profile);
        profile.version = nvmlGpuInstanceProfileInfo_v2;
        if (nvmlDeviceGetGpuInstanceProfileInfoV(gpu, index, &profile) != NVML_SUCCESS ||
            profile.id != info.profileId)
            continue;
        snprintf(out, cap, "%s",
                 strncmp(profile.name, "MIG ", 4) == 0 ? profile.name + 4 : profile.name);
        return;
    }
}

static int list_gpus(const char *ids) {
    nvmlDevice_t devices[MAX_SELECTED];
    unsigned int n;
    int rc = select_devices(ids, 0, devices, &n);
    for (unsigned int i = 0; rc == 0 && i < n; i++) {
        unsigned int index = 0, current = 0, pending = 0, max = 0, shown = 0;
        char name[TEXT] = "?", uuid[TEXT] = "?";
        nvmlDeviceGetIndex(devices[i], &index);
        nvmlDeviceGetName(devices[i], name, sizeof name);
        nvmlDeviceGetUUID(devices[i], uuid, sizeof uuid);
        printf("GPU %u: %s (UUID: %s)\n", index, name, uuid);
        if (nvmlDeviceGetMigMode(devices[i], &current, &pending) != NVML_SUCCESS || !current)
            continue;
        nvmlDeviceGetMaxMigDeviceCount(devices[i], &max);
        for (unsigned int k = 0; k < max; k++) {
            nvmlDevice_t mig;
            char mig_uuid[TEXT], profile[TEXT];
            if (nvmlDeviceGetMigDeviceHandleByIndex(devices[i], k, &mig) != NVML_SUCCESS ||
                nvmlDeviceGetUUID(mig, mig_uuid, sizeof mig_uuid) != NVML_SUCCESS)
                continue;
            mig_profile_name(devices[i], mig, profile, sizeof profile);
            printf("  MIG %-11s Device %2u: (UUID: %s)\n", profile, shown++, mig_uuid);
        }
    }
    return rc;
}

/* ---- the table of plain `nvidia-smi` --------------------------------------------------- */

static const int COLUMNS[] = {41, 24, 22};

static void rule(char end, char fill, int split) {
    putchar(end);
    for (int c = 0; c < 3; c++) {
        for (int k = 0; k < COLUMNS[c]; k++)
            putchar(fill);
        if (c < 2)
            putchar(split ? '+' : fill);
    }
    printf("%c\n", end);
}

static void row(const char *a, const char *b, const char *c) {
    printf("|%-41.41s|%-24.24s|%-22.22s|\n", a, b, c);
}

static const char *compute_mode_label(unsigned int mode, int short_form) {
    switch (mode) {
    case NVML_COMPUTEMODE_DEFAULT:
        return "Default";
    case NVML_COMPUTEMODE_PROHIBITED:
        return "Prohibited";
    case NVML_COMPUTEMODE_EXCLUSIVE_PROCESS:
        return short_form ? "E. Process" : "Exclusive_Process";
    default:
        return "Unknown";
    }
}

static int table(const char *ids) {
    nvmlDevice_t devices[MAX_SELECTED];
    unsigned int n;
    int rc = select_devices(ids, 0, devices, &n);
    if (rc != 0)
        return rc;
    char driver[TEXT] = "N/A", line[256], a[64], b[64], c[64];
    int cuda = 0;
    nvmlSystemGetDriverVersion(driver, sizeof driver);
    nvmlSystemGetCudaDriverVersion(&cuda);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(line, sizeof line, "%a %b %e %H:%M:%S %Y", &tm);
    printf("%s\n", line);
    rule('+', '-', 0);
    snprintf(line, sizeof line, " NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %d.%d",
             STANDIN_DRIVER_VERSION, driver, cuda / 1000, cuda % 1000 / 10);
    printf("|%-89.89s|\n", line);
    rule('+', '-', 1);
    snprintf(a, sizeof a, " GPU  %-24s %9s ", "Name", "Timeslice");
    row(a, " Bus-Id", "           Compute M.");
    row("", "           Memory-Usage", "               MIG M.");
    rule('|', '=', 1);
    for (unsigned int i = 0; i < n; i++) {
        unsigned int index = 0, timeslice = 0, mode = 0, current = 0, pending = 0;
        char name[TEXT] = "?";
        nvmlPciInfo_t pci;
        nvmlMemory_t memory = {0, 0, 0};
        nvmlDeviceGetIndex(devices[i], &index);
        nvmlDeviceGetName(devices[i], name, sizeof name);
        fakenvmlDeviceGetTimeslice(devices[i], &timeslice);
        nvmlDeviceGetComputeMode(devices[i], &mode);
        nvmlDeviceGetMemoryInfo(devices[i], &memory);
        if (nvmlDeviceGetPciInfo_v3(devices[i], &pci) != NVML_SUCCESS)
            snprintf(pci.busId, sizeof pci.busId, "?");
        const char *mig = nvmlDeviceGetMigMode(devices[i], &current, &pending) != NVML_SUCCESS
                              ? "N/A"
                          : current ? "Enabled"
                                    : "Disabled";
        snprintf(a, sizeof a, " %3u  %-24.24s %9s ", index, name,
                 TIMESLICE_NAMES[timeslice <= MAX_TIMESLICE ? timeslice : 0]);
        snprintf(b, sizeof b, " %22s", pci.busId);
        snprintf(c, sizeof c, " %20s", compute_mode_label(mode, 1));
        row(a, b, c);
        snprintf(b, sizeof b, " %6lluMiB / %7lluMiB", memory.used >> 20, memory.total >> 20);
        snprintf(c, sizeof c, " %20s", mig);
        row("", b, c);
        rule('+', '-', 1);
    }
    printf("\n");
    rule('+', '-', 0);
    printf("|%-89s|\n|%-89s|\n", " Processes:", "  No running processes found");
    rule('+', '-', 0);
    return 0;
}

/* ---- --query-gpu ----------------------------------------------------------------------- */

static const char *const FIELDS[] = {
    "index",        "uuid",         "name",
    "pci.bus_id",   "driver_version", "memory.total",
    "compute_mode", "mig.mode.current", "timeslice",
};

static void field_value(nvmlDevice_t device, const char *field, int units, char *out,
                        size_t cap) {
    nvmlReturn_t rc = NVML_SUCCESS;
    unsigned int value = 0, pending = 0;
    if (strcmp(field, "index") == 0) {
        if ((rc = nvmlDeviceGetIndex(device, &value)) == NVML_SUCCESS)
            snprintf(out, cap, "%u", value);
    } else if (strcmp(field, "uuid") == 0) {
        rc = nvmlDeviceGetUUID(device, out, (unsigned int)cap);
    } else if (strcmp(field, "name") == 0) {
        rc = nvmlDeviceGetName(device, out, (unsigned int)cap);
    } else if (strcmp(field, "pci.bus_id") == 0) {
        nvmlPciInfo_t pci;
        if ((rc = nvmlDeviceGetPciInfo_v3(device, &pci)) == NVML_SUCCESS)
            snprintf(out, cap, "%s", pci.busId);
    } else if (strcmp(field, "driver_version") == 0) {
        rc = nvmlSystemGetDriverVersion(out, (unsigned int)cap);
    } else if (strcmp(field, "memory.total") == 0) {
        nvmlMemory_t memory;
        if ((rc = nvmlDeviceGetMemoryInfo(device, &memory)) == NVML_SUCCESS)
            snprintf(out, cap, units ? "%llu MiB" : "%llu", memory.total >> 20);
    } else if (strcmp(field, "compute_mode") == 0) {
        if ((rc = nvmlDeviceGetComputeMode(device, &value)) == NVML_SUCCESS)
            snprintf(out, cap, "%s", compute_mode_label(value, 0));
    } else if (strcmp(field, "mig.mode.current") == 0) {
        rc = nvmlDeviceGetMigMode(device, &value, &pending);
        if (rc == NVML_SUCCESS)
            snprintf(out, cap, "%s", value ? "Enabled" : "Disabled");
    } else if (strcmp(field, "timeslice") == 0) {
        if ((rc = fakenvmlDeviceGetTimeslice(device, &value)) == NVML_SUCCESS)
            snprintf(out, cap, "%u", value);
    }
    if (rc == NVML_ERROR_NOT_SUPPORTED)
        snprintf(out, cap, "[N/A]");
    else if (rc != NVML_SUCCESS)
        snprintf(out, cap, "[%s]", nvmlErrorString(rc));
}

static int query(const char *fields, const char *format, const char *ids) {
    int csv = 0, header = 1, units = 1;
    char text[512], *save = NULL;
    snprintf(text, sizeof text, "%s", format ? format : "");
    for (char *f = strtok_r(text, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        if (strcmp(f, "csv") == 0)
            csv = 1;
        else if (strcmp(f, "noheader") == 0)
            header = 0;
        else if (strcmp(f, "nounits") == 0)
            units = 0;
        else
            return invalid_args();
    }
    if (!csv) {
        printf("--query-gpu needs --format=csv[,noheader][,nounits]\n");
        return EXIT_INVALID_ARGS;
    }
    const char *wanted[MAX_FIELDS];
    int nwanted = 0;
    char list[512];
    snprintf(list, sizeof list, "%s", fields);
    save = NULL;
    for (char *f = strtok_r(list, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        int known = 0;
        for (size_t k = 0; k < sizeof FIELDS / sizeof FIELDS[0]; k++)
            known |= strcmp(f, FIELDS[k]) == 0;
        if (!known) {
            printf("Field \"%s\" is not a valid field to query.\n\n", f);
            return EXIT_INVALID_ARGS;
        }
        if (nwanted == MAX_FIELDS)
            return invalid_args();
        wanted[nwanted++] = f;
    }
    if (nwanted == 0)
        return invalid_args();
    int rc = init_nvml();
    nvmlDevice_t devices[MAX_SELECTED];
    unsigned int n = 0;
    if (rc == 0)
        rc = select_devices(ids, 0, devices, &n);
    if (rc != 0)
        return rc;
    if (header)
        for (int k = 0; k < nwanted; k++)
            printf("%s%s%s", k ? ", " : "", wanted[k],
                   strcmp(wanted[k], "memory.total") == 0 ? " [MiB]" : "");
    if (header)
        printf("\n");
    for (unsigned int i = 0; i < n; i++) {
        for (int k = 0; k < nwanted; k++) {
            char value[TEXT];
            field_value(devices[i], wanted[k], units, value, sizeof value);
            printf("%s%s", k ? ", " : "", value);
        }
        printf("\n");
    }
    nvmlShutdown();
    return 0;
}

/* ---- -c / --compute-mode --------------------------------------------------------------- */

static int parse_compute_mode(const char *text) {
    if (strcmp(text, "0") == 0 || strcasecmp(text, "DEFAULT") == 0)
        return NVML_COMPUTEMODE_DEFAULT;
    if (strcmp(text, "2") == 0 || strcasecmp(text, "PROHIBITED") == 0)
        return NVML_COMPUTEMODE_PROHIBITED;
    if (strcmp(text, "3") == 0 || strcasecmp(text, "EXCLUSIVE_PROCESS") == 0)
        return NVML_COMPUTEMODE_EXCLUSIVE_PROCESS;
    return -1;
}

static int set_compute_mode(const char *text, const char *ids) {
    static const char *const NAMES[] = {"DEFAULT", "EXCLUSIVE_THREAD", "PROHIBITED",
                                        "EXCLUSIVE_PROCESS"};
    int mode = parse_compute_mode(text);
    if (mode < 0) {
        printf("Invalid compute mode \"%s\": use 0/DEFAULT, 2/PROHIBITED or "
               "3/EXCLUSIVE_PROCESS.\n",
               text);
        return EXIT_INVALID_ARGS;
    }
    /* Load and save under the data file's lock: no other writer's change is lost. */
    fakenvmlLockData();
    int rc = init_nvml();
    nvmlDevice_t devices[MAX_SELECTED];
    unsigned int n = 0;
    if (rc == 0)
        rc = select_devices(ids, 0, devices, &n);
    for (unsigned int i = 0; rc == 0 && i < n; i++) {
        char label[TEXT];
        device_label(devices[i], label, sizeof label);
        nvmlReturn_t set = nvmlDeviceSetComputeMode(devices[i], (unsigned int)mode);
        if (set == NVML_SUCCESS) {
            printf("Set compute mode to %s for GPU %s.\n", NAMES[mode], label);
        } else {
            printf("Unable to set the compute mode for GPU %s: %s\n", label,
                   nvmlErrorString(set));
            printf("Terminating early due to previous errors.\n");
            rc = exit_code(set);
        }
    }
    if (rc == 0)
        printf("All done.\n");
    nvmlShutdown();
    fakenvmlUnlockData();
    return rc;
}

/* ---- compute-policy -------------------------------------------------------------------- */

static int compute_policy_help(void) {
    printf("\n    Compute Policy -- Control and list compute policies (stand-in for tests).\n\n"
           "    Usage: nvidia-smi compute-policy [options]\n\n"
           "    Options include:\n"
           "    [-i | --id]: GPU indexes, UUIDs or PCI bus ids, comma-separated\n"
           "    [-l | --list]: List the compute policies of each GPU\n"
           "    [--set-timeslice]: Set the timeslice of a GPU:\n"
           "                       0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG\n"
           "    [-h | --help]: Display help information\n\n");
    return 0;
}

static int set_timeslice(unsigned int value, const char *ids) {
    nvmlDevice_t devices[MAX_SELECTED];
    unsigned int n = 0;
    int rc = select_devices(ids, 1, devices, &n);
    for (unsigned int i = 0; rc == 0 && i < n; i++) {
        char label[TEXT];
        device_label(devices[i], label, sizeof label);
        nvmlReturn_t set = fakenvmlDeviceSetTimeslice(devices[i], value);
        if (set == NVML_SUCCESS)
            printf("Set timeslice to %s (%u) for GPU %s.\n", TIMESLICE_NAMES[value], value,
                   label);
        else if (set == NVML_ERROR_NOT_SUPPORTED)
            printf("Setting timeslice is not supported for GPU %s.\n", label);
        else {
            printf("Failed to set timeslice for GPU %s: %s\n", label, nvmlErrorString(set));
            rc = exit_code(set);
        }
    }
    return rc;
}

static int list_policies(const char *ids) {
    nvmlDevice_t devices[MAX_SELECTED];
    unsigned int n = 0;
    int rc = select_devices(ids, 0, devices, &n);
    for (unsigned int i = 0; rc == 0 && i < n; i++) {
        unsigned int index = 0, value = 0;
        char uuid[TEXT] = "?";
        nvmlDeviceGetIndex(devices[i], &index);
        nvmlDeviceGetUUID(devices[i], uuid, sizeof uuid);
        nvmlReturn_t got = fakenvmlDeviceGetTimeslice(devices[i], &value);
        if (got == NVML_SUCCESS)
            printf("GPU %u (UUID: %s): Timeslice: %s (%u)\n", index, uuid,
                   TIMESLICE_NAMES[value], value);
        else
            printf("GPU %u (UUID: %s): Timeslice: [%s]\n", index, uuid, nvmlErrorString(got));
    }
    return rc;
}

static int compute_policy(int argc, char **argv) {
    const char *ids = NULL, *timeslice = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        int found;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return compute_policy_help();
        if (strcmp(argv[i], "-l") == 0 || strcmp(argv[i], "--list") == 0) {
            list = 1;
            continue;
        }
        if ((found = option(argc, argv, &i, "-i", "--id", &ids)) != 0 ||
            (found = option(argc, argv, &i, NULL, "--set-timeslice", &timeslice)) != 0) {
            if (found < 0)
                return invalid_args();
            continue;
        }
        return invalid_args();
    }
    if (!list && !timeslice)
        return compute_policy_help();
    if (timeslice && (strlen(timeslice) != 1 || timeslice[0] < '0' ||
                      timeslice[0] > (char)('0' + MAX_TIMESLICE))) {
        printf("Invalid timeslice value \"%s\": use 0 (DEFAULT), 1 (SHORT), 2 (MEDIUM) or "
               "3 (LONG).\n",
               timeslice);
        return EXIT_INVALID_ARGS;
    }
    if (timeslice)
        fakenvmlLockData(); /* from loading to saving: no other writer's change is lost */
    int rc = init_nvml();
    if (rc == 0 && timeslice)
        rc = set_timeslice((unsigned int)(timeslice[0] - '0'), ids);
    if (rc == 0 && list)
        rc = list_policies(ids);
    nvmlShutdown();
    if (timeslice)
        fakenvmlUnlockData();
    return rc;
}

/* ---- main ------------------------------------------------------------------------------ */

static int version(void) {
    char driver[TEXT] = "N/A", cuda_text[32] = "N/A";
    int cuda = 0;
    if (nvmlInit_v2() == NVML_SUCCESS) {
        nvmlSystemGetDriverVersion(driver, sizeof driver);
        if (nvmlSystemGetCudaDriverVersion(&cuda) == NVML_SUCCESS)
            snprintf(cuda_text, sizeof cuda_text, "%d.%d", cuda / 1000, cuda % 1000 / 10);
        nvmlShutdown();
    }
    /* NVML's version is the driver's first two parts: 580.95.05 -> 580.95. */
    size_t major = strcspn(driver, ".");
    size_t nvml = driver[major] ? major + 1 + strcspn(driver + major + 1, ".") : major;
    printf("NVIDIA-SMI version  : %s\n"
           "NVML version        : %.*s\n"
           "DRIVER version      : %s\n"
           "CUDA Version        : %s\n",
           STANDIN_DRIVER_VERSION, (int)nvml, driver, driver, cuda_text);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "compute-policy") == 0)
        return compute_policy(argc - 1, argv + 1);
    const char *ids = NULL, *mode = NULL, *fields = NULL, *format = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        int found;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return usage();
        if (strcmp(argv[i], "--version") == 0)
            return version();
        if (strcmp(argv[i], "-L") == 0 || strcmp(argv[i], "--list-gpus") == 0) {
            list = 1;
            continue;
        }
        if ((found = option(argc, argv, &i, "-i", "--id", &ids)) != 0 ||
            (found = option(argc, argv, &i, "-c", "--compute-mode", &mode)) != 0 ||
            (found = option(argc, argv, &i, NULL, "--query-gpu", &fields)) != 0 ||
            (found = option(argc, argv, &i, NULL, "--format", &format)) != 0) {
            if (found < 0)
                return invalid_args();
            continue;
        }
        return invalid_args();
    }
    if (list + !!mode + !!fields > 1 || (format && !fields))
        return invalid_args();
    if (mode)
        return set_compute_mode(mode, ids);
    if (fields)
        return query(fields, format, ids);
    int rc = init_nvml();
    if (rc != 0)
        return rc;
    rc = list ? list_gpus(ids) : table(ids);
    nvmlShutdown();
    return rc;
}
