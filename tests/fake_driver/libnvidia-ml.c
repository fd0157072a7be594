/* A fake NVIDIA driver library: the part of NVML's C API the monitor uses,
 * with nvml.h's signatures, struct layouts and return codes, built by the
 * tests as libnvidia-ml.so.1 and loaded by the real nvidia-ml-py binding.
 *
 * What it reports and how it fails comes from a control file, named by the
 * FAKE_NVML_CONTROL environment variable and read again whenever it changes
 * (tests replace it atomically to change values mid-run); tests/fake_driver.py
 * writes it. One directive per line:
 *
 *   origin_us US                  time 0 of the counters (CLOCK_REALTIME, us)
 *   init_error CODE               nvmlInit* returns CODE
 *   devices N
 *   device I KEY VALUE            mem_clock sm_clock used total temp util
 *                                 power_mw power_limit_mw throttle uuid
 *                                 lost_after lost_code energy (0: no counter)
 *                                 energy_mj (at origin) sample_period_us
 *   device I mig UUID             a MIG device on GPU I (MIG mode on): its memory is
 *                                 1/7 of the GPU's, its clocks, power and the like
 *                                 NOT_SUPPORTED, as NVML answers for a MIG device
 *   device I mig_process SLOT compute|graphics PID BYTES|na
 *                                 a process on GPU I's MIG device SLOT
 *   device I process compute|graphics PID BYTES|na
 *   device I field ID NS_PER_S    a cumulative nanosecond field value
 *                                 (clocks event durations) rising at that rate
 *   device I spike TYPE VALUE START_US END_US
 *                                 nvmlDeviceGetSamples of TYPE read VALUE then
 *   device I xid CODE AT_US       a critical XID error, delivered to event sets then
 *   device I gpm METRIC VALUE     a GPM metric's value between any two samples (GPM
 *                                 supported once the device has one)
 *   fail FUNCTION I|all CODE      FUNCTION returns CODE on device I (nvmlInit*,
 *                                 nvmlDeviceGetCount*: all)
 *   segfault FUNCTION I|all       FUNCTION crashes with SIGSEGV
 *   hang FUNCTION I|all           FUNCTION never returns
 *   hang_marker PATH              created as a hanging call starts
 *
 * A function named by -DOMIT_<name> at build time is absent, as from an
 * older driver: the binding's dlsym fails and it raises FUNCTION_NOT_FOUND.
 * fake_nvml_calls() and fake_nvml_initialized() let an in-process test see
 * what was called.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};
#define NVML_VALUE_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL
#define NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION 83
#define MAX_DEVICES 64
#define MAX_MIG 7
#define MAX_PROCS 32
#define MAX_FIELDS 16
#define MAX_SPIKES 16
#define MAX_RULES 64
#define MAX_FUNCTIONS 96
#define SAMPLE_BUFFER 120
#define MAX_XIDS 16
#define MAX_EVENT_SETS 8
#define EVENT_XID_CRITICAL 0x8ULL
#define MAX_GPM 32
#define GPM_METRIC_MAX 477 /* NVML_GPM_METRIC_MAX: the metrics array's length */
#define MAX_GPM_SAMPLES 64

/* nvml.h's structs, as the binding lays them out. */
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;
typedef struct { unsigned long long timeStamp; nvmlValue_t sampleValue; } nvmlSample_t;
typedef struct { unsigned int version; int sensorType; int temperature; } nvmlTemperature_v1_t;
#define nvmlTemperature_v1 (sizeof(nvmlTemperature_v1_t) | (1u << 24))
#define nvmlMemory_v2 (sizeof(nvmlMemory_v2_t) | (2u << 24))
enum { VALUE_TYPE_UNSIGNED_INT = 1, VALUE_TYPE_UNSIGNED_LONG_LONG = 3 };
enum { CLOCK_GRAPHICS = 0, CLOCK_SM = 1, CLOCK_MEM = 2 };
enum { SAMPLES_POWER = 0, SAMPLES_GPU_UTIL = 1, SAMPLES_MEM_UTIL = 2, SAMPLES_SM_CLOCK = 5, SAMPLES_MEM_CLOCK = 6 };

struct process { unsigned int pid; unsigned long long used; int graphics, mig_slot; };
struct field { unsigned int id; double ns_per_s; };
struct spike { int type; unsigned int value; long long start_us, end_us; };
struct xid { unsigned int code; long long at_us; };
struct gpm { unsigned int metric; double value; };

struct device {
    int index, mig_slot; /* mig_slot -1: the GPU itself */
    char uuid[96];
    unsigned int mem_clock, sm_clock, temp, util, power_mw, power_limit_mw;
    unsigned long long used, total, throttle, energy_mj;
    int energy, lost_code;
    long long lost_after, sample_period_us;
    int n_processes, n_mig, n_fields, n_spikes, n_xids, n_gpm;
    struct process processes[MAX_PROCS];
    char mig[MAX_MIG][96];
    struct field fields[MAX_FIELDS];
    struct spike spikes[MAX_SPIKES];
    struct xid xids[MAX_XIDS];
    struct gpm gpm[MAX_GPM];
};
typedef struct device *nvmlDevice_t;

enum action { FAIL, SEGFAULT, HANG };
struct rule { char function[64]; int device; enum action action; int code; };

struct config {
    long long origin_us;
    int init_error, n_devices, n_rules;
    char hang_marker[512];
    struct device devices[MAX_DEVICES];
    struct rule rules[MAX_RULES];
};

/* MIG device handles: one per slot of each GPU, filled from the GPU's config. */
static struct config config;
static struct device migs[MAX_DEVICES][MAX_MIG];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static struct stat loaded; /* the control file as last read */
static struct { char name[64]; long counts[MAX_DEVICES]; } functions[MAX_FUNCTIONS];
static int n_functions;
static long device_calls[MAX_DEVICES];

static long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static void defaults(struct device *dev, int index) {
    memset(dev, 0, sizeof *dev);
    dev->index = index;
    dev->mig_slot = -1;
    snprintf(dev->uuid, sizeof dev->uuid, "GPU-%08x-fake-4e56-8d3a-000000000000", index);
    dev->mem_clock = 2619;
    dev->sm_clock = 1980;
    dev->used = 12ULL << 30;
    dev->total = 80ULL << 30;
    dev->temp = 45;
    dev->util = 87;
    dev->power_mw = 312500;
    dev->power_limit_mw = 700000;
    dev->energy = 1;
    dev->lost_after = -1;
    dev->lost_code = NVML_ERROR_GPU_IS_LOST;
    dev->sample_period_us = 20000;
}

static int target(const char *word) { return strcmp(word, "all") == 0 ? -1 : atoi(word); }

static void directive(struct config *cfg, char *line) {
    char *save = NULL, *words[8] = {0};
    int n = 0;
    for (char *w = strtok_r(line, " \t\r\n", &save); w && n < 8; w = strtok_r(NULL, " \t\r\n", &save))
        words[n++] = w;
    if (n < 2) return;
    if (!strcmp(words[0], "origin_us")) cfg->origin_us = atoll(words[1]);
    else if (!strcmp(words[0], "init_error")) cfg->init_error = atoi(words[1]);
    else if (!strcmp(words[0], "hang_marker")) snprintf(cfg->hang_marker, sizeof cfg->hang_marker, "%s", words[1]);
    else if (!strcmp(words[0], "devices")) {
        cfg->n_devices = atoi(words[1]);
        if (cfg->n_devices > MAX_DEVICES) cfg->n_devices = MAX_DEVICES;
        for (int i = 0; i < cfg->n_devices; i++) defaults(&cfg->devices[i], i);
    } else if (n >= 3 && (!strcmp(words[0], "fail") || !strcmp(words[0], "segfault") || !strcmp(words[0], "hang"))) {
        if (cfg->n_rules == MAX_RULES) return;
        struct rule *r = &cfg->rules[cfg->n_rules++];
        snprintf(r->function, sizeof r->function, "%s", words[1]);
        r->device = target(words[2]);
        r->action = words[0][0] == 'f' ? FAIL : words[0][0] == 's' ? SEGFAULT : HANG;
        r->code = n >= 4 ? atoi(words[3]) : NVML_ERROR_NOT_SUPPORTED;
    } else if (!strcmp(words[0], "device") && n >= 4) {
        int i = atoi(words[1]);
        if (i < 0 || i >= cfg->n_devices) return;
        struct device *d = &cfg->devices[i];
        const char *key = words[2], *value = words[3];
        unsigned long long number = strtoull(value, NULL, 0);
        if (!strcmp(key, "mem_clock")) d->mem_clock = number;
        else if (!strcmp(key, "sm_clock")) d->sm_clock = number;
        else if (!strcmp(key, "used")) d->used = number;
        else if (!strcmp(key, "total")) d->total = number;
        else if (!strcmp(key, "temp")) d->temp = number;
        else if (!strcmp(key, "util")) d->util = number;
        else if (!strcmp(key, "power_mw")) d->power_mw = number;
        else if (!strcmp(key, "power_limit_mw")) d->power_limit_mw = number;
        else if (!strcmp(key, "throttle")) d->throttle = number;
        else if (!strcmp(key, "energy")) d->energy = number != 0;
        else if (!strcmp(key, "energy_mj")) d->energy_mj = number;
        else if (!strcmp(key, "lost_after")) d->lost_after = number;
        else if (!strcmp(key, "lost_code")) d->lost_code = number;
        else if (!strcmp(key, "sample_period_us")) d->sample_period_us = number ? number : 1;
        else if (!strcmp(key, "uuid")) snprintf(d->uuid, sizeof d->uuid, "%s", value);
        else if (!strcmp(key, "mig") && d->n_mig < MAX_MIG) snprintf(d->mig[d->n_mig++], 96, "%s", value);
        else if (!strcmp(key, "process") && n >= 6 && d->n_processes < MAX_PROCS) {
            struct process *p = &d->processes[d->n_processes++];
            p->graphics = !strcmp(value, "graphics");
            p->pid = atoi(words[4]);
            p->used = !strcmp(words[5], "na") ? NVML_VALUE_NOT_AVAILABLE : strtoull(words[5], NULL, 0);
            p->mig_slot = -1;
        } else if (!strcmp(key, "mig_process") && n >= 7 && d->n_processes < MAX_PROCS) {
            struct process *p = &d->processes[d->n_processes++];
            p->mig_slot = atoi(value);
            p->graphics = !strcmp(words[4], "graphics");
            p->pid = atoi(words[5]);
            p->used = !strcmp(words[6], "na") ? NVML_VALUE_NOT_AVAILABLE : strtoull(words[6], NULL, 0);
        } else if (!strcmp(key, "field") && n >= 5 && d->n_fields < MAX_FIELDS) {
            d->fields[d->n_fields].id = number;
            d->fields[d->n_fields++].ns_per_s = atof(words[4]);
        } else if (!strcmp(key, "xid") && n >= 5 && d->n_xids < MAX_XIDS) {
            d->xids[d->n_xids].code = number;
            d->xids[d->n_xids++].at_us = atoll(words[4]);
        } else if (!strcmp(key, "gpm") && n >= 5 && d->n_gpm < MAX_GPM) {
            d->gpm[d->n_gpm].metric = number;
            d->gpm[d->n_gpm++].value = atof(words[4]);
        } else if (!strcmp(key, "spike") && n >= 7 && d->n_spikes < MAX_SPIKES) {
            struct spike *s = &d->spikes[d->n_spikes++];
            s->type = number;
            s->value = strtoul(words[4], NULL, 0);
            s->start_us = atoll(words[5]);
            s->end_us = atoll(words[6]);
        }
    }
}

static void reset_calls(void) {
    memset(device_calls, 0, sizeof device_calls);
    for (int f = 0; f < n_functions; f++) memset(functions[f].counts, 0, sizeof functions[f].counts);
}

/* Reads the control file again if it changed since it was last read (a new
 * file: the calls are counted afresh, as by a driver just loaded). Called with the lock held. */
static void reload(void) {
    const char *path = getenv("FAKE_NVML_CONTROL");
    struct stat now;
    if (!path || stat(path, &now) != 0) {
        if (loaded.st_ino) { memset(&config, 0, sizeof config); memset(&loaded, 0, sizeof loaded); }
        return;
    }
    if (now.st_ino == loaded.st_ino && now.st_dev == loaded.st_dev && now.st_size == loaded.st_size &&
        now.st_mtim.tv_sec == loaded.st_mtim.tv_sec && now.st_mtim.tv_nsec == loaded.st_mtim.tv_nsec)
        return;
    FILE *file = fopen(path, "r");
    if (!file) return;
    static struct config fresh;
    memset(&fresh, 0, sizeof fresh);
    char line[1024];
    while (fgets(line, sizeof line, file)) directive(&fresh, line);
    fclose(file);
    config = fresh;
    loaded = now;
    reset_calls();
    for (int i = 0; i < config.n_devices; i++)
        for (int slot = 0; slot < MAX_MIG; slot++) {
            migs[i][slot] = config.devices[i];
            migs[i][slot].mig_slot = slot;
            migs[i][slot].n_mig = 0;
            if (slot < config.devices[i].n_mig) snprintf(migs[i][slot].uuid, 96, "%s", config.devices[i].mig[slot]);
        }
}

static void count(const char *function, int index) {
    int f = 0;
    while (f < n_functions && strcmp(functions[f].name, function)) f++;
    if (f == n_functions) {
        if (n_functions == MAX_FUNCTIONS) return;
        snprintf(functions[n_functions++].name, 64, "%s", function);
    }
    if (index >= 0 && index < MAX_DEVICES) functions[f].counts[index]++;
}

static nvmlReturn_t misbehave(const char *function, int index) {
    for (int i = 0; i < config.n_rules; i++) {
        struct rule *r = &config.rules[i];
        if (strcmp(r->function, function) || (r->device != -1 && r->device != index)) continue;
        if (r->action == FAIL) return r->code;
        pthread_mutex_unlock(&lock);
        if (r->action == SEGFAULT) *(volatile int *)0 = 0; /* as a driver does on a GPU off the bus */
        if (config.hang_marker[0]) close(open(config.hang_marker, O_CREAT | O_WRONLY, 0644));
        for (;;) pause(); /* stuck in the driver */
    }
    return NVML_SUCCESS;
}

static int valid(nvmlDevice_t dev) {
    for (int i = 0; i < config.n_devices; i++) {
        if (dev == &config.devices[i]) return 1;
        if (dev >= &migs[i][0] && dev < &migs[i][config.devices[i].n_mig]) return 1;
    }
    return 0;
}

/* Every device call starts here, under the lock: the checks a driver makes
 * before it answers, and the test's failures. Unlocks on failure. */
static nvmlReturn_t enter(const char *function, nvmlDevice_t dev) {
    pthread_mutex_lock(&lock);
    if (!initialized) { pthread_mutex_unlock(&lock); return NVML_ERROR_UNINITIALIZED; }
    reload();
    if (!dev || !valid(dev)) { pthread_mutex_unlock(&lock); return NVML_ERROR_INVALID_ARGUMENT; }
    count(function, dev->index);
    struct device *gpu = &config.devices[dev->index];
    long calls = ++device_calls[dev->index];
    if (gpu->lost_after >= 0 && calls > gpu->lost_after) { pthread_mutex_unlock(&lock); return gpu->lost_code; }
    nvmlReturn_t code = misbehave(function, dev->index);
    if (code != NVML_SUCCESS) pthread_mutex_unlock(&lock);
    return code;
}
#define ENTER(dev) do { nvmlReturn_t entered = enter(__func__, (dev)); if (entered) return entered; } while (0)
#define ANSWER(code) do { pthread_mutex_unlock(&lock); return (code); } while (0)
/* What NVML answers for a MIG device to a question about the physical GPU. */
#define PHYSICAL(dev) do { if ((dev)->mig_slot >= 0) ANSWER(NVML_ERROR_NOT_SUPPORTED); } while (0)

static double elapsed_s(void) {
    double s = (now_us() - config.origin_us) / 1e6;
    return s > 0 ? s : 0;
}

/* --- initialisation ---------------------------------------------------------------------- */

static nvmlReturn_t init(const char *function) {
    pthread_mutex_lock(&lock);
    reload();
    count(function, -1);
    nvmlReturn_t code = misbehave(function, -1);
    if (!code) code = config.init_error;
    if (!code) initialized++;
    pthread_mutex_unlock(&lock);
    return code;
}

#ifndef OMIT_nvmlInitWithFlags
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return init(__func__); }
#endif
nvmlReturn_t nvmlInit_v2(void) { return init(__func__); }
nvmlReturn_t nvmlInit(void) { return init(__func__); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t code = initialized ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (initialized) initialized--;
    pthread_mutex_unlock(&lock);
    return code;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return copy_text("999.99.fake", version, length);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return copy_text("99.999.99", version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = 12090;
    return NVML_SUCCESS;
}

/* --- devices ----------------------------------------------------------------------------- */

static nvmlReturn_t device_count(const char *function, unsigned int *count_out) {
    pthread_mutex_lock(&lock);
    if (!initialized) ANSWER(NVML_ERROR_UNINITIALIZED);
    reload();
    count(function, -1);
    nvmlReturn_t failed = misbehave(function, -1); /* a rule for "all" devices */
    if (failed) ANSWER(failed);
    if (!count_out) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *count_out = config.n_devices;
    ANSWER(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { return device_count(__func__, n); }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return device_count(__func__, n); }

static nvmlReturn_t handle_by_index(const char *function, unsigned int index, nvmlDevice_t *device) {
    pthread_mutex_lock(&lock);
    if (!initialized) ANSWER(NVML_ERROR_UNINITIALIZED);
    reload();
    int in_range = index < (unsigned int)config.n_devices;
    pthread_mutex_unlock(&lock);
    if (!in_range || !device) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t code = enter(function, &config.devices[index]);
    if (code) return code;
    *device = &config.devices[index];
    ANSWER(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { return handle_by_index(__func__, i, d); }
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return handle_by_index(__func__, i, d); }

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    pthread_mutex_lock(&lock);
    if (!initialized) ANSWER(NVML_ERROR_UNINITIALIZED);
    reload();
    if (!uuid || !device) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < config.n_devices; i++) {
        if (!strcmp(config.devices[i].uuid, uuid)) { *device = &config.devices[i]; ANSWER(NVML_SUCCESS); }
        for (int slot = 0; slot < config.devices[i].n_mig; slot++)
            if (!strcmp(migs[i][slot].uuid, uuid)) { *device = &migs[i][slot]; ANSWER(NVML_SUCCESS); }
    }
    ANSWER(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    ENTER(dev);
    ANSWER(copy_text(dev->uuid, uuid, length));
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    ENTER(dev);
    if (!index) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *index = dev->index;
    ANSWER(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    ENTER(dev);
    ANSWER(copy_text(dev->mig_slot < 0 ? "Fake NVIDIA H100 80GB HBM3" : "Fake MIG 1g.10gb", name, length));
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t dev, int *mode) {
    ENTER(dev);
    if (!mode) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *mode = 1;
    ANSWER(NVML_SUCCESS);
}

/* A MIG device holds an equal share of its GPU's memory. */
static void memory_of(nvmlDevice_t dev, unsigned long long *total, unsigned long long *used) {
    unsigned long long parts = dev->mig_slot < 0 ? 1 : MAX_MIG;
    *total = dev->total / parts;
    *used = dev->used / parts;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *memory) {
    ENTER(dev);
    if (!memory) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    memory_of(dev, &memory->total, &memory->used);
    memory->free = memory->total - memory->used;
    ANSWER(NVML_SUCCESS);
}

#ifndef OMIT_nvmlDeviceGetMemoryInfo_v2
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *memory) {
    ENTER(dev);
    if (!memory) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2) ANSWER(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    memory_of(dev, &memory->total, &memory->used);
    memory->reserved = 0;
    memory->free = memory->total - memory->used;
    ANSWER(NVML_SUCCESS);
}
#endif

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned int *clock) {
    ENTER(dev);
    PHYSICAL(dev);
    if (!clock) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (type == CLOCK_MEM) *clock = dev->mem_clock;
    else if (type == CLOCK_SM || type == CLOCK_GRAPHICS) *clock = dev->sm_clock;
    else ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    ANSWER(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int *temp) {
    ENTER(dev);
    PHYSICAL(dev);
    if (!temp || sensor != 0) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *temp = dev->temp;
    ANSWER(NVML_SUCCESS);
}

#ifndef OMIT_nvmlDeviceGetTemperatureV
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t dev, nvmlTemperature_v1_t *temperature) {
    ENTER(dev);
    PHYSICAL(dev);
    if (!temperature || temperature->sensorType != 0) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (temperature->version != nvmlTemperature_v1) ANSWER(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    temperature->temperature = dev->temp;
    ANSWER(NVML_SUCCESS);
}
#endif

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *utilization) {
    ENTER(dev);
    if (!utilization) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (dev->mig_slot >= 0) ANSWER(NVML_ERROR_NOT_SUPPORTED); /* as on a MIG device */
    utilization->gpu = dev->util;
    utilization->memory = 0;
    ANSWER(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *power) {
    ENTER(dev);
    PHYSICAL(dev);
    if (!power) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *power = dev->power_mw;
    ANSWER(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t dev, unsigned int *limit) {
    ENTER(dev);
    PHYSICAL(dev);
    if (!limit) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *limit = dev->power_limit_mw;
    ANSWER(NVML_SUCCESS);
}

/* Energy since the driver loaded: what it held at the origin plus the power
 * drawn since (mW times s is mJ). */
static unsigned long long energy_mj(nvmlDevice_t dev) {
    return dev->energy_mj + (unsigned long long)(dev->power_mw * elapsed_s());
}

#ifndef OMIT_nvmlDeviceGetTotalEnergyConsumption
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t dev, unsigned long long *energy) {
    ENTER(dev);
    if (!energy) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->energy || dev->mig_slot >= 0) ANSWER(NVML_ERROR_NOT_SUPPORTED);
    *energy = energy_mj(dev);
    ANSWER(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetCurrentClocksEventReasons
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long *reasons) {
    ENTER(dev);
    PHYSICAL(dev);
    if (!reasons) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = dev->throttle;
    ANSWER(NVML_SUCCESS);
}
#endif

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t dev, unsigned long long *reasons) {
    ENTER(dev);
    PHYSICAL(dev);
    if (!reasons) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = dev->throttle;
    ANSWER(NVML_SUCCESS);
}

/* A GPU lists every process on it, a MIG device those on it. */
static int listed(nvmlDevice_t dev, const struct process *p, int graphics) {
    return p->graphics == graphics && (dev->mig_slot < 0 || p->mig_slot == dev->mig_slot);
}

/* The running-process lists, as NVML answers them: asked with too small an
 * array (NULL to learn the size), INSUFFICIENT_SIZE and the count needed. */
static nvmlReturn_t processes(nvmlDevice_t dev, int graphics, unsigned int *n, void *out, size_t size) {
    if (!n) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int found = 0;
    for (int i = 0; i < dev->n_processes; i++) found += listed(dev, &dev->processes[i], graphics);
    if (found == 0) { *n = 0; ANSWER(NVML_SUCCESS); }
    if (!out || *n < found) { *n = found; ANSWER(NVML_ERROR_INSUFFICIENT_SIZE); }
    unsigned int k = 0;
    for (int i = 0; i < dev->n_processes; i++) {
        struct process *p = &dev->processes[i];
        if (!listed(dev, p, graphics)) continue;
        if (size == sizeof(nvmlProcessInfo_v1_t)) {
            nvmlProcessInfo_v1_t *info = (nvmlProcessInfo_v1_t *)out + k++;
            info->pid = p->pid;
            info->usedGpuMemory = p->used;
        } else {
            nvmlProcessInfo_v2_t *info = (nvmlProcessInfo_v2_t *)out + k++;
            info->pid = p->pid;
            info->usedGpuMemory = p->used;
            info->gpuInstanceId = info->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    *n = found;
    ANSWER(NVML_SUCCESS);
}
#define PROCESS_LIST(name, graphics, type) \
    nvmlReturn_t name(nvmlDevice_t dev, unsigned int *n, type *out) { \
        ENTER(dev); \
        return processes(dev, graphics, n, out, sizeof(type)); \
    }
#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v3
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v3, 0, nvmlProcessInfo_v2_t)
#endif
#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v2
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v2, 0, nvmlProcessInfo_v2_t)
#endif
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses, 0, nvmlProcessInfo_v1_t)
#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses_v3
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, 1, nvmlProcessInfo_v2_t)
#endif
#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses_v2
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, 1, nvmlProcessInfo_v2_t)
#endif
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses, 1, nvmlProcessInfo_v1_t)

/* --- MIG (read only) --------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending) {
    ENTER(dev);
    if (!current || !pending) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (dev->mig_slot >= 0 || !dev->n_mig) ANSWER(NVML_ERROR_NOT_SUPPORTED);
    *current = *pending = 1;
    ANSWER(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int *n) {
    ENTER(dev);
    if (!n) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (dev->mig_slot >= 0 || !dev->n_mig) ANSWER(NVML_ERROR_NOT_SUPPORTED);
    *n = MAX_MIG;
    ANSWER(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int slot, nvmlDevice_t *mig) {
    ENTER(dev);
    if (!mig || slot >= MAX_MIG) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (dev->mig_slot >= 0 || !dev->n_mig) ANSWER(NVML_ERROR_NOT_SUPPORTED);
    if (slot >= (unsigned int)dev->n_mig) ANSWER(NVML_ERROR_NOT_FOUND); /* an empty slot */
    *mig = &migs[dev->index][slot];
    ANSWER(NVML_SUCCESS);
}

/* A MIG device's GPU instance id: its slot + 1 here. */
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned int *id) {
    ENTER(dev);
    if (!id || dev->mig_slot < 0) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *id = dev->mig_slot + 1;
    ANSWER(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned int *is_mig) {
    ENTER(dev);
    if (!is_mig) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *is_mig = dev->mig_slot >= 0;
    ANSWER(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *gpu) {
    ENTER(mig);
    if (!gpu || mig->mig_slot < 0) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *gpu = &config.devices[mig->index];
    ANSWER(NVML_SUCCESS);
}

/* --- counters and the driver's sample buffer --------------------------------------------- */

#ifndef OMIT_nvmlDeviceGetFieldValues
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int n, nvmlFieldValue_t *values) {
    ENTER(dev);
    PHYSICAL(dev);
    if (n < 0 || (n && !values)) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    double seconds = elapsed_s();
    for (int i = 0; i < n; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = now_us();
        v->latencyUsec = 3;
        v->valueType = VALUE_TYPE_UNSIGNED_LONG_LONG;
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        if (v->fieldId == NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION && dev->energy && dev->mig_slot < 0) {
            v->value.ullVal = energy_mj(dev);
            v->nvmlReturn = NVML_SUCCESS;
        }
        for (int f = 0; f < dev->n_fields; f++)
            if (dev->fields[f].id == v->fieldId) {
                v->value.ullVal = (unsigned long long)(dev->fields[f].ns_per_s * seconds);
                v->nvmlReturn = NVML_SUCCESS;
            }
    }
    ANSWER(NVML_SUCCESS);
}
#endif

static int sample_value(nvmlDevice_t dev, int type, long long at_us, unsigned int *value) {
    switch (type) {
    case SAMPLES_POWER: *value = dev->power_mw; break;
    case SAMPLES_GPU_UTIL: *value = dev->util; break;
    case SAMPLES_MEM_UTIL: *value = 0; break;
    case SAMPLES_SM_CLOCK: *value = dev->sm_clock; break;
    case SAMPLES_MEM_CLOCK: *value = dev->mem_clock; break;
    default: return 0;
    }
    for (int s = 0; s < dev->n_spikes; s++) {
        struct spike *spike = &dev->spikes[s];
        if (spike->type == type && at_us >= spike->start_us && at_us < spike->end_us) *value = spike->value;
    }
    return 1;
}

/* The driver samples every sample_period_us and keeps the latest
 * SAMPLE_BUFFER samples; asked for those after last_seen_us, it answers
 * NOT_FOUND when there are none yet. */
#ifndef OMIT_nvmlDeviceGetSamples
nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t dev, int type, unsigned long long last_seen_us, int *value_type,
                                  unsigned int *n, nvmlSample_t *samples) {
    ENTER(dev);
    unsigned int probe;
    if (!value_type || !n) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (!sample_value(dev, type, 0, &probe) || dev->mig_slot >= 0) ANSWER(NVML_ERROR_NOT_SUPPORTED);
    long long period = dev->sample_period_us, now = now_us();
    long long newest = config.origin_us + (now - config.origin_us) / period * period;
    long long oldest = newest - (SAMPLE_BUFFER - 1) * period;
    if ((long long)last_seen_us >= oldest) oldest = config.origin_us + ((long long)last_seen_us - config.origin_us) / period * period + period;
    if (oldest < config.origin_us) oldest = config.origin_us;
    unsigned int available = oldest <= newest ? (unsigned int)((newest - oldest) / period + 1) : 0;
    *value_type = VALUE_TYPE_UNSIGNED_INT;
    if (!available) ANSWER(NVML_ERROR_NOT_FOUND);
    if (!samples) { *n = available; ANSWER(NVML_SUCCESS); }
    unsigned int k = 0;
    for (long long at = oldest; at <= newest && k < *n; at += period, k++) {
        samples[k].timeStamp = at;
        sample_value(dev, type, at, &samples[k].sampleValue.uiVal);
    }
    *n = k;
    ANSWER(NVML_SUCCESS);
}
#endif

/* --- events (critical XID errors) ------------------------------------------------------- */

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
struct event_set {
    int used;
    unsigned long long types[MAX_DEVICES];
    int delivered[MAX_DEVICES]; /* XIDs of each device handed out through this set */
};
typedef struct event_set *nvmlEventSet_t;
static struct event_set event_sets[MAX_EVENT_SETS];

/* Event sets and GPM samples come from fixed pools of structs whose first member is
 * `int used`: the first free slot, cleared and taken (NULL when all are), and whether a
 * pointer is a taken slot of the pool. */
static void *take_slot(void *pool, size_t size, int n) {
    for (int i = 0; i < n; i++) {
        int *used = (int *)((char *)pool + i * size);
        if (!*used) {
            memset(used, 0, size);
            *used = 1;
            return used;
        }
    }
    return NULL;
}

static int taken_slot(const void *slot, const void *pool, size_t size, int n) {
    const char *p = slot, *base = pool;
    return p >= base && p < base + n * size && (size_t)(p - base) % size == 0 && *(const int *)p;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    pthread_mutex_lock(&lock);
    if (!initialized) ANSWER(NVML_ERROR_UNINITIALIZED);
    if (!set) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *set = take_slot(event_sets, sizeof event_sets[0], MAX_EVENT_SETS);
    ANSWER(*set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN);
}

static int valid_set(nvmlEventSet_t set) { return taken_slot(set, event_sets, sizeof *set, MAX_EVENT_SETS); }

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev, unsigned long long *types) {
    ENTER(dev);
    if (!types) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *types = dev->mig_slot < 0 ? EVENT_XID_CRITICAL : 0;
    ANSWER(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types, nvmlEventSet_t set) {
    ENTER(dev);
    if (!valid_set(set)) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (dev->mig_slot >= 0 || types & ~EVENT_XID_CRITICAL) ANSWER(NVML_ERROR_NOT_SUPPORTED);
    set->types[dev->index] |= types;
    ANSWER(NVML_SUCCESS);
}

/* The first XID due (its time come) that this set has not handed out yet, or
 * NVML_ERROR_TIMEOUT after timeout_ms. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    long long deadline = now_us() + timeout_ms * 1000LL;
    for (;;) {
        pthread_mutex_lock(&lock);
        if (!initialized) ANSWER(NVML_ERROR_UNINITIALIZED);
        if (!valid_set(set) || !data) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
        reload();
        nvmlReturn_t failed = misbehave(__func__, -1);
        if (failed) ANSWER(failed);
        long long now = now_us();
        for (int i = 0; i < config.n_devices; i++) {
            struct device *d = &config.devices[i];
            int k = set->delivered[i];
            if (!(set->types[i] & EVENT_XID_CRITICAL) || k >= d->n_xids || d->xids[k].at_us > now) continue;
            set->delivered[i]++;
            count("nvmlEventSetWait_v2", i);
            data->device = d;
            data->eventType = EVENT_XID_CRITICAL;
            data->eventData = d->xids[k].code;
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
            ANSWER(NVML_SUCCESS);
        }
        pthread_mutex_unlock(&lock);
        if (now >= deadline) return NVML_ERROR_TIMEOUT;
        usleep(5000);
    }
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    pthread_mutex_lock(&lock);
    if (!valid_set(set)) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    set->used = 0;
    ANSWER(NVML_SUCCESS);
}

/* --- GPM (GPU performance monitoring, Hopper and later) ---------------------------------- */

typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;
struct gpm_sample { int used; nvmlDevice_t device; long long taken_us; };
typedef struct gpm_sample *nvmlGpmSample_t;
typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;
typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;
static struct gpm_sample gpm_samples[MAX_GPM_SAMPLES];

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t dev, nvmlGpmSupport_t *support) {
    ENTER(dev);
    if (!support) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (support->version != 1) ANSWER(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    support->isSupportedDevice = dev->n_gpm > 0 && dev->mig_slot < 0;
    ANSWER(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    pthread_mutex_lock(&lock);
    if (!sample) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    *sample = take_slot(gpm_samples, sizeof gpm_samples[0], MAX_GPM_SAMPLES);
    ANSWER(*sample ? NVML_SUCCESS : NVML_ERROR_UNKNOWN);
}

static int valid_sample(nvmlGpmSample_t sample) {
    return taken_slot(sample, gpm_samples, sizeof *sample, MAX_GPM_SAMPLES);
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    pthread_mutex_lock(&lock);
    if (!valid_sample(sample)) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    sample->used = 0;
    ANSWER(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t dev, nvmlGpmSample_t sample) {
    ENTER(dev);
    if (!valid_sample(sample)) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->n_gpm || dev->mig_slot >= 0) ANSWER(NVML_ERROR_NOT_SUPPORTED);
    sample->device = dev;
    sample->taken_us = now_us();
    ANSWER(NVML_SUCCESS);
}

/* A sample of the GPU instance ``id`` of GPU ``dev`` (in MIG mode): the MIG device's metrics. */
nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t dev, unsigned int id, nvmlGpmSample_t sample) {
    ENTER(dev);
    if (!valid_sample(sample) || dev->mig_slot >= 0) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->n_gpm || !dev->n_mig) ANSWER(NVML_ERROR_NOT_SUPPORTED);
    if (id < 1 || id > (unsigned int)dev->n_mig) ANSWER(NVML_ERROR_NOT_FOUND);
    sample->device = &migs[dev->index][id - 1];
    sample->taken_us = now_us();
    ANSWER(NVML_SUCCESS);
}

/* Each metric asked for between two samples of one device, the first the older: its
 * configured value, NOT_SUPPORTED for one the device has not got. */
nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *get) {
    pthread_mutex_lock(&lock);
    if (!initialized) ANSWER(NVML_ERROR_UNINITIALIZED);
    if (!get) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    if (get->version != 1) ANSWER(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (!valid_sample(get->sample1) || !valid_sample(get->sample2) || get->numMetrics > GPM_METRIC_MAX) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    nvmlDevice_t dev = get->sample1->device;
    if (!dev || dev != get->sample2->device || get->sample2->taken_us <= get->sample1->taken_us) ANSWER(NVML_ERROR_INVALID_ARGUMENT);
    count(__func__, dev->index);
    for (unsigned int i = 0; i < get->numMetrics; i++) {
        nvmlGpmMetric_t *m = &get->metrics[i];
        m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        m->value = 0;
        m->metricInfo.shortName = m->metricInfo.longName = m->metricInfo.unit = NULL;
        for (int k = 0; k < dev->n_gpm; k++)
            if (dev->gpm[k].metric == m->metricId) {
                m->value = dev->gpm[k].value;
                m->nvmlReturn = NVML_SUCCESS;
            }
    }
    ANSWER(NVML_SUCCESS);
}

/* --- for tests in the process that loaded the library ------------------------------------ */

long fake_nvml_calls(const char *function, int index) {
    pthread_mutex_lock(&lock);
    long n = 0;
    for (int f = 0; f < n_functions; f++)
        if (!strcmp(functions[f].name, function) && index >= 0 && index < MAX_DEVICES) n = functions[f].counts[index];
    pthread_mutex_unlock(&lock);
    return n;
}

const char *fake_nvml_function(int f) { return f >= 0 && f < n_functions ? functions[f].name : NULL; }

long fake_nvml_device_calls(int index) {
    return index >= 0 && index < MAX_DEVICES ? device_calls[index] : 0;
}

int fake_nvml_initialized(void) { return initialized; }
