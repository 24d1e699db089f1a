/*
 * fake_nvml.c - a fake libnvidia-ml.so.1 for testing NVML clients without a GPU.
 *
 * It is compiled against the real nvml.h (with NVML_NO_UNVERSIONED_FUNC_DEFS, so
 * every versioned prototype is declared and our definitions are type-checked against
 * it) and loaded by the real pynvml.  The aim is to look like a driver *as pynvml sees
 * it*: same symbols, same struct layouts, same return codes for the situations an
 * exporter has to survive (lost GPUs, unsupported queries, old drivers, init failures).
 *
 * State comes from a line-based text file named by $FAKE_NVML_STATE (written by
 * tests/fake_nvml/state.py; see parse_state() for the format).  The file is read
 * at init and re-read whenever its identity (inode, size, mtime, ctime) changes, so a
 * test can change GPU readings while the client keeps running.
 *
 * Build-time knobs: -DFAKE_OMIT_<symbol> leaves that exported function out of the
 * library so that callers see the "function not found" of an older driver.  Every
 * exported function is wrapped in such a guard; tests/fake_nvml/build.py derives the
 * list of exports from those guards.
 *
 * Extending: add per-device fields to struct fake_device and to device_fields[] (the file
 * key is the field name), and start every per-device entry point with enter_device() (or
 * enter_any() where a MIG device handle is accepted too) so lost/unsupported/uninitialised
 * checks stay uniform.
 *
 * A device with `hang 1` blocks every call about it (other GPUs' calls go on) until the state
 * file clears it: a GPU fallen off the bus, as the daemon must survive it.
 *
 * GPM, MIG and events: a device's state gives the GPM metric values any two samples yield
 * (`gpm_metric ID VALUE`), its MIG instances (`mig ...`, each with GPM values of its own) and
 * the events the driver has queued (`event SEQ TYPE DATA`). An event set delivers, per device,
 * the events whose sequence number is above the highest one present when the device was
 * registered, so a test injects an event by rewriting the state file with a new line.
 * nvmlEventSetWait_v2 polls the state file until an event is due or the timeout passes
 * (then NVML_ERROR_TIMEOUT); nvmlDeviceGetPcieThroughput blocks 20 ms like the real one.
 *
 * NVLink: a device's `nvlink LINK ...` lines are its links (a device without any has no
 * NVLink: NOT_SUPPORTED); links up to the highest listed one exist, an unlisted one among them
 * is inactive. Field values answer per slot, as the real driver does: `not_supported_field ID`
 * makes that field answer NOT_SUPPORTED in its own slot while the others still answer.
 */
#define _GNU_SOURCE
#ifndef NVML_NO_UNVERSIONED_FUNC_DEFS
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* declare the _v1/_v2 prototypes we implement too */
#endif

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <nvml.h>

#define FAKE_STATE_ENV "FAKE_NVML_STATE"
#define FAKE_FORMAT_HEADER "fake_nvml_state 1"
#define FAKE_FUNC_NAME_MAX 96
#define FAKE_LINE_MAX 512
#define FAKE_ERR_MAX 512
/* pynvml compares usedGpuMemory against c_ulonglong(-1) to report None. */
#define FAKE_VALUE_NOT_AVAILABLE_ULL ((unsigned long long)NVML_VALUE_NOT_AVAILABLE)
/* Helpers whose callers a build may omit (FAKE_OMIT_*) must not trip -Werror=unused-function. */
#define FAKE_MAYBE_UNUSED __attribute__((unused))
#define FAKE_MIG_SLOTS 7 /* MIG devices one GPU can hold */
#define FAKE_PROFILE_MAX 32
#define FAKE_DEFAULT_EVENTS \
    (nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError)
#define FAKE_PCIE_WINDOW_NS 20000000L /* nvmlDeviceGetPcieThroughput counts over 20 ms */
#define FAKE_PROCESS_NAME_MAX 256     /* a process name, NUL included */
#define FAKE_POLL_NS 5000000L         /* an event wait looks at the state file this often */

/* ------------------------------------------------------------------------------------ */
/* State model                                                                          */
/* ------------------------------------------------------------------------------------ */

struct func_name {
    char name[FAKE_FUNC_NAME_MAX];
};

/* Growable arrays; parse_state() builds them and free_state() releases them. */
struct name_list {
    struct func_name *items;
    size_t count, cap;
};
struct process_list {
    nvmlProcessInfo_t *items;
    size_t count, cap;
};
struct sample_list {
    nvmlProcessUtilizationSample_t *items;
    size_t count, cap;
};

/* What nvmlGpmMetricsGet reports for any two samples of a GPU or MIG instance. */
struct gpm_values {
    double value[NVML_GPM_METRIC_MAX];
    bool set[NVML_GPM_METRIC_MAX]; /* unset metrics answer NOT_SUPPORTED */
};

struct fake_mig {
    unsigned int slot, gpu_instance, compute_instance, slices;
    unsigned long long memory_total, memory_used;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char profile[FAKE_PROFILE_MAX]; /* "-": a name without the profile (older drivers) */
    struct gpm_values gpm;
};
struct mig_list {
    struct fake_mig *items;
    size_t count, cap;
};

struct fake_event {
    unsigned long long seq, type, data;
};
struct event_list {
    struct fake_event *items;
    size_t count, cap;
};

/* One NVLink link: whether it is up, its data counters (KiB) and its error counters. */
struct fake_nvlink {
    unsigned int link, active;
    unsigned long long tx_kib, rx_kib;
    unsigned long long error[NVML_NVLINK_ERROR_COUNT]; /* by nvmlNvLinkErrorCounter_t */
};
struct nvlink_list {
    struct fake_nvlink *items;
    size_t count, cap;
};
struct field_id_list {
    unsigned int *items;
    size_t count, cap;
};

struct fake_process_name {
    unsigned int pid;
    char name[FAKE_PROCESS_NAME_MAX];
};
struct process_name_list {
    struct fake_process_name *items;
    size_t count, cap;
};

/* Everything the state file says about one GPU.  Member names double as file keys. */
struct fake_device {
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char pci_bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned int pci_domain, pci_bus, pci_device; /* derived from pci_bus_id */
    unsigned int pci_device_id, pci_subsystem_id, minor_number;
    unsigned int util_gpu_percent, util_memory_percent;
    unsigned long long memory_total_bytes, memory_reserved_bytes, memory_used_bytes;
    unsigned int power_usage_mw, power_limit_mw;
    unsigned int power_min_limit_mw, power_max_limit_mw, power_default_limit_mw;
    unsigned long long energy_mj;
    unsigned int temperature_c, memory_temperature_c;
    unsigned int clock_mhz[NVML_CLOCK_COUNT], max_clock_mhz[NVML_CLOCK_COUNT];
    unsigned long long clock_event_reasons;
    unsigned int num_fans, fan_speed_percent;
    unsigned long long ecc_corrected_volatile, ecc_uncorrected_volatile;
    /* errors from before the driver loaded: the aggregate counts add them */
    unsigned long long ecc_corrected_before_load, ecc_uncorrected_before_load;
    unsigned int pcie_replay_count;
    unsigned int pcie_generation, pcie_max_generation, pcie_width, pcie_max_width;
    unsigned int compute_mode, persistence_mode;
    unsigned int performance_state;
    unsigned int encoder_util_percent, decoder_util_percent;
    unsigned int lost;
    unsigned int hang; /* every call about this GPU blocks while set (a GPU off the bus) */
    struct name_list not_supported; /* exported symbol names answering NOT_SUPPORTED */
    struct process_list processes, mps_processes;
    struct sample_list samples;
    unsigned int gpm_supported;
    struct gpm_values gpm;
    unsigned int mig_mode;
    struct mig_list migs;
    unsigned long long violation_power_ns, violation_thermal_ns, violation_sync_boost_ns,
        violation_board_limit_ns, violation_low_utilization_ns, violation_reliability_ns,
        violation_app_clocks_ns, violation_base_clocks_ns;
    unsigned int remapped_rows_correctable, remapped_rows_uncorrectable, remapped_rows_pending,
        remapped_rows_failed;
    unsigned int retired_pages_single_bit, retired_pages_double_bit, retired_pages_pending;
    unsigned int pcie_tx_kbps, pcie_rx_kbps;
    unsigned long long supported_events;
    struct event_list events;
    struct nvlink_list nvlinks;
    unsigned int nvlink_count; /* derived: the highest listed link + 1 (0: no NVLink) */
    struct field_id_list not_supported_fields;
};

struct fake_state {
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    unsigned int cuda_version;
    unsigned int init_error; /* an nvmlReturn_t that nvmlInit* should fail with */
    unsigned int event_wait_error; /* an nvmlReturn_t that nvmlEventSetWait_v2 fails with */
    struct fake_device *devices;
    size_t device_count, device_cap;
    struct process_name_list process_names; /* nvmlSystemGetProcessName: NOT_FOUND for others */
};

/*
 * A device handle points at a record of the init "generation" that handed it out.
 * Records hold what must survive a state reload but not a re-init: the identity the
 * handle was issued for and a sticky "lost" flag.  A real driver does not bring a GPU
 * back from "fallen off the bus" under an existing handle; only shutdown + init does.
 * Generations are never freed while the library is loaded, so a stale handle is
 * always safe to recognise (no use-after-free on a client's old pointer).
 */
struct nvmlDevice_st {
    struct fake_generation *generation;
    unsigned int index;
    bool lost;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    int mig_slot; /* -1 for a GPU; else a MIG device of GPU `index` (uuid: the instance's) */
};

struct fake_generation {
    struct nvmlDevice_st *records;
    struct nvmlDevice_st *mig_records; /* FAKE_MIG_SLOTS per GPU, valid in this generation only */
    unsigned int count;
    struct fake_generation *older;
};

/* A GPM sample buffer; like generations, never freed while the library is loaded. */
struct nvmlGpmSample_st {
    struct nvmlGpmSample_st *next;
    bool allocated, filled;
    struct fake_generation *generation;
    unsigned int index;
    int gpu_instance; /* -1: the whole GPU */
};

struct event_registration {
    nvmlDevice_t handle; /* as registered: events carry it back */
    unsigned int index;
    unsigned long long mask, cursor;
};

/* An event set; kept after nvmlEventSetFree too, so a stale pointer is recognised. */
struct nvmlEventSet_st {
    struct nvmlEventSet_st *next;
    bool freed;
    struct fake_generation *generation;
    struct event_registration *items;
    size_t count, cap;
};

struct file_identity {
    bool valid; /* false: stat() failed (file missing), compare by errno only */
    int stat_errno;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
};

/* All mutable library state, behind one lock: calls are short and tests are not hot. */
static struct {
    pthread_mutex_t lock;
    unsigned int refcount;
    struct fake_state *state;
    struct file_identity identity; /* of the file `state` was last (attempted) from */
    struct fake_generation *current;     /* NULL while uninitialised */
    struct fake_generation *generations; /* every generation ever made, newest first */
    struct nvmlGpmSample_st *gpm_samples;
    struct nvmlEventSet_st *event_sets;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* ------------------------------------------------------------------------------------ */
/* Small helpers                                                                        */
/* ------------------------------------------------------------------------------------ */

/* Append one zeroed element; NULL only when out of memory. */
static void *list_push(void **items, size_t *count, size_t *cap, size_t size)
{
    if (*count == *cap) {
        size_t new_cap = *cap ? *cap * 2 : 4;
        void *grown = realloc(*items, new_cap * size);
        if (!grown)
            return NULL;
        *items = grown;
        *cap = new_cap;
    }
    void *slot = (char *)*items + (*count)++ * size;
    memset(slot, 0, size);
    return slot;
}

#define LIST_PUSH(list) \
    list_push((void **)&(list)->items, &(list)->count, &(list)->cap, sizeof(*(list)->items))

static void free_device(struct fake_device *d)
{
    free(d->not_supported.items);
    free(d->processes.items);
    free(d->mps_processes.items);
    free(d->samples.items);
    free(d->migs.items);
    free(d->events.items);
    free(d->nvlinks.items);
    free(d->not_supported_fields.items);
}

static void free_state(struct fake_state *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->device_count; i++)
        free_device(&s->devices[i]);
    free(s->devices);
    free(s->process_names.items);
    free(s);
}

/* Copy a NUL-terminated string into a caller buffer the way NVML does. */
static FAKE_MAYBE_UNUSED nvmlReturn_t copy_out_string(const char *value, char *buf, unsigned int length)
{
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------ */
/* Defaults: one idle A100 (kept in step with FakeDevice's defaults in state.py)        */
/* ------------------------------------------------------------------------------------ */

static void set_default_device(struct fake_device *d)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->name, sizeof(d->name), "NVIDIA A100-SXM4-80GB");
    snprintf(d->uuid, sizeof(d->uuid), "GPU-6a9f2c1e-5b3d-4e8a-9c71-0d2e4f6a0000");
    snprintf(d->pci_bus_id, sizeof(d->pci_bus_id), "00000000:07:00.0");
    d->pci_bus = 0x07;
    d->pci_device_id = 0x20B210DE;
    d->pci_subsystem_id = 0x147F10DE;
    d->memory_total_bytes = 85899345920ULL;   /* 80 GiB */
    d->memory_reserved_bytes = 605028352ULL;  /* 577 MiB */
    d->power_usage_mw = 62000;
    d->power_limit_mw = 400000;
    d->power_min_limit_mw = 100000;
    d->power_max_limit_mw = 400000;
    d->power_default_limit_mw = 400000;
    d->energy_mj = 35000000ULL;
    d->temperature_c = 32;
    d->memory_temperature_c = 35;
    d->pcie_generation = 1; /* an idle A100 trains its link down */
    d->pcie_max_generation = 4;
    d->pcie_width = 16;
    d->pcie_max_width = 16;
    d->compute_mode = NVML_COMPUTEMODE_DEFAULT;
    d->persistence_mode = NVML_FEATURE_ENABLED;
    d->clock_mhz[NVML_CLOCK_GRAPHICS] = 210;
    d->clock_mhz[NVML_CLOCK_SM] = 210;
    d->clock_mhz[NVML_CLOCK_MEM] = 1593;
    d->clock_mhz[NVML_CLOCK_VIDEO] = 795;
    d->max_clock_mhz[NVML_CLOCK_GRAPHICS] = 1410;
    d->max_clock_mhz[NVML_CLOCK_SM] = 1410;
    d->max_clock_mhz[NVML_CLOCK_MEM] = 1593;
    d->max_clock_mhz[NVML_CLOCK_VIDEO] = 1290;
    d->clock_event_reasons = 0x1; /* GpuIdle */
    d->supported_events = FAKE_DEFAULT_EVENTS;
}

static void set_default_state(struct fake_state *s)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->driver_version, sizeof(s->driver_version), "550.54.15");
    s->cuda_version = 12040;
}

/* ------------------------------------------------------------------------------------ */
/* State file parsing                                                                   */
/* ------------------------------------------------------------------------------------ */

enum field_kind { FIELD_U32, FIELD_U64, FIELD_STR };

/* Scalar "key value" lines.  A table keeps new keys (GPM, MIG...) to one line each. */
struct field {
    const char *key;
    enum field_kind kind;
    size_t offset;
    size_t size;             /* buffer size for FIELD_STR */
    unsigned long long max;  /* inclusive upper bound for numbers */
};

#define DEV_U32(key, member, max) {key, FIELD_U32, offsetof(struct fake_device, member), 0, max}
#define DEV_U64(key, member) {key, FIELD_U64, offsetof(struct fake_device, member), 0, UINT64_MAX}
#define DEV_STR(member) \
    {#member, FIELD_STR, offsetof(struct fake_device, member), \
     sizeof(((struct fake_device *)0)->member), 0}

static const struct field device_fields[] = {
    DEV_STR(name),
    DEV_STR(uuid),
    DEV_STR(pci_bus_id),
    DEV_U32("pci_device_id", pci_device_id, UINT32_MAX),
    DEV_U32("pci_subsystem_id", pci_subsystem_id, UINT32_MAX),
    DEV_U32("minor_number", minor_number, UINT32_MAX),
    DEV_U32("util_gpu_percent", util_gpu_percent, 100),
    DEV_U32("util_memory_percent", util_memory_percent, 100),
    DEV_U64("memory_total_bytes", memory_total_bytes),
    DEV_U64("memory_reserved_bytes", memory_reserved_bytes),
    DEV_U64("memory_used_bytes", memory_used_bytes),
    DEV_U32("power_usage_mw", power_usage_mw, UINT32_MAX),
    DEV_U32("power_limit_mw", power_limit_mw, UINT32_MAX),
    DEV_U32("power_min_limit_mw", power_min_limit_mw, UINT32_MAX),
    DEV_U32("power_max_limit_mw", power_max_limit_mw, UINT32_MAX),
    DEV_U32("power_default_limit_mw", power_default_limit_mw, UINT32_MAX),
    DEV_U64("energy_mj", energy_mj),
    DEV_U32("temperature_c", temperature_c, UINT32_MAX),
    DEV_U32("memory_temperature_c", memory_temperature_c, UINT32_MAX),
    DEV_U32("clock_graphics_mhz", clock_mhz[NVML_CLOCK_GRAPHICS], UINT32_MAX),
    DEV_U32("clock_sm_mhz", clock_mhz[NVML_CLOCK_SM], UINT32_MAX),
    DEV_U32("clock_mem_mhz", clock_mhz[NVML_CLOCK_MEM], UINT32_MAX),
    DEV_U32("clock_video_mhz", clock_mhz[NVML_CLOCK_VIDEO], UINT32_MAX),
    DEV_U32("max_clock_graphics_mhz", max_clock_mhz[NVML_CLOCK_GRAPHICS], UINT32_MAX),
    DEV_U32("max_clock_sm_mhz", max_clock_mhz[NVML_CLOCK_SM], UINT32_MAX),
    DEV_U32("max_clock_mem_mhz", max_clock_mhz[NVML_CLOCK_MEM], UINT32_MAX),
    DEV_U32("max_clock_video_mhz", max_clock_mhz[NVML_CLOCK_VIDEO], UINT32_MAX),
    DEV_U64("clock_event_reasons", clock_event_reasons),
    DEV_U32("num_fans", num_fans, 64),
    DEV_U32("fan_speed_percent", fan_speed_percent, 100),
    DEV_U64("ecc_corrected_volatile", ecc_corrected_volatile),
    DEV_U64("ecc_uncorrected_volatile", ecc_uncorrected_volatile),
    DEV_U64("ecc_corrected_before_load", ecc_corrected_before_load),
    DEV_U64("ecc_uncorrected_before_load", ecc_uncorrected_before_load),
    DEV_U32("pcie_replay_count", pcie_replay_count, UINT32_MAX),
    DEV_U32("pcie_generation", pcie_generation, 6),
    DEV_U32("pcie_max_generation", pcie_max_generation, 6),
    DEV_U32("pcie_width", pcie_width, 32),
    DEV_U32("pcie_max_width", pcie_max_width, 32),
    DEV_U32("compute_mode", compute_mode, NVML_COMPUTEMODE_COUNT - 1),
    DEV_U32("persistence_mode", persistence_mode, 1),
    DEV_U32("performance_state", performance_state, NVML_PSTATE_UNKNOWN),
    DEV_U32("encoder_util_percent", encoder_util_percent, 100),
    DEV_U32("decoder_util_percent", decoder_util_percent, 100),
    DEV_U32("lost", lost, 1),
    DEV_U32("hang", hang, 1),
    DEV_U32("gpm_supported", gpm_supported, 1),
    DEV_U32("mig_mode", mig_mode, 1),
    DEV_U64("violation_power_ns", violation_power_ns),
    DEV_U64("violation_thermal_ns", violation_thermal_ns),
    DEV_U64("violation_sync_boost_ns", violation_sync_boost_ns),
    DEV_U64("violation_board_limit_ns", violation_board_limit_ns),
    DEV_U64("violation_low_utilization_ns", violation_low_utilization_ns),
    DEV_U64("violation_reliability_ns", violation_reliability_ns),
    DEV_U64("violation_app_clocks_ns", violation_app_clocks_ns),
    DEV_U64("violation_base_clocks_ns", violation_base_clocks_ns),
    DEV_U32("remapped_rows_correctable", remapped_rows_correctable, UINT32_MAX),
    DEV_U32("remapped_rows_uncorrectable", remapped_rows_uncorrectable, UINT32_MAX),
    DEV_U32("remapped_rows_pending", remapped_rows_pending, 1),
    DEV_U32("remapped_rows_failed", remapped_rows_failed, 1),
    DEV_U32("retired_pages_single_bit", retired_pages_single_bit, 4096),
    DEV_U32("retired_pages_double_bit", retired_pages_double_bit, 4096),
    DEV_U32("retired_pages_pending", retired_pages_pending, 1),
    DEV_U32("pcie_tx_kbps", pcie_tx_kbps, UINT32_MAX),
    DEV_U32("pcie_rx_kbps", pcie_rx_kbps, UINT32_MAX),
    DEV_U64("supported_events", supported_events),
    {NULL, FIELD_U32, 0, 0, 0},
};

static const struct field state_fields[] = {
    {"driver_version", FIELD_STR, offsetof(struct fake_state, driver_version),
     sizeof(((struct fake_state *)0)->driver_version), 0},
    {"cuda_version", FIELD_U32, offsetof(struct fake_state, cuda_version), 0, INT32_MAX},
    {"init_error", FIELD_U32, offsetof(struct fake_state, init_error), 0, NVML_ERROR_UNKNOWN},
    {"event_wait_error", FIELD_U32, offsetof(struct fake_state, event_wait_error), 0,
     NVML_ERROR_UNKNOWN},
    {NULL, FIELD_U32, 0, 0, 0},
};

/* Parse one unsigned decimal/0x token at *cursor and advance past it. */
static bool take_number(char **cursor, unsigned long long max, unsigned long long *out)
{
    char *p = *cursor, *end;
    while (*p == ' ')
        p++;
    if (*p < '0' || *p > '9') /* strtoull would accept "-1" and wrap it */
        return false;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 0);
    if (errno || (*end != ' ' && *end != '\0') || v > max)
        return false;
    *out = v;
    *cursor = end;
    return true;
}

static bool at_end(const char *cursor)
{
    while (*cursor == ' ')
        cursor++;
    return *cursor == '\0';
}

/* Returns false with err filled when the value does not fit the field. */
static bool set_field(const struct field *f, void *base, char *value, char *err, size_t errlen)
{
    char *field_ptr = (char *)base + f->offset;
    if (f->kind == FIELD_STR) {
        if (strlen(value) + 1 > f->size) {
            snprintf(err, errlen, "value of '%s' is longer than %zu bytes", f->key, f->size - 1);
            return false;
        }
        memcpy(field_ptr, value, strlen(value) + 1);
        return true;
    }
    unsigned long long v;
    char *cursor = value;
    if (!take_number(&cursor, f->max, &v) || !at_end(cursor)) {
        snprintf(err, errlen, "'%s' needs an integer in 0..%llu, got '%.80s'", f->key, f->max, value);
        return false;
    }
    if (f->kind == FIELD_U32)
        *(unsigned int *)field_ptr = (unsigned int)v;
    else
        *(unsigned long long *)field_ptr = v;
    return true;
}

static const struct field *find_field(const struct field *table, const char *key)
{
    for (const struct field *f = table; f->key; f++)
        if (strcmp(f->key, key) == 0)
            return f;
    return NULL;
}

/* "process PID USED_BYTES|na GPU_INSTANCE_ID COMPUTE_INSTANCE_ID" */
static bool parse_process(struct process_list *list, char *rest)
{
    unsigned long long pid, mem = FAKE_VALUE_NOT_AVAILABLE_ULL, gi, ci;
    if (!take_number(&rest, UINT32_MAX, &pid))
        return false;
    while (*rest == ' ')
        rest++;
    if (strncmp(rest, "na ", 3) == 0)
        rest += 2;
    else if (!take_number(&rest, UINT64_MAX, &mem))
        return false;
    if (!take_number(&rest, UINT32_MAX, &gi) || !take_number(&rest, UINT32_MAX, &ci) ||
        !at_end(rest))
        return false;
    nvmlProcessInfo_t *p = LIST_PUSH(list);
    if (!p)
        return false;
    p->pid = (unsigned int)pid;
    p->usedGpuMemory = mem;
    p->gpuInstanceId = (unsigned int)gi;
    p->computeInstanceId = (unsigned int)ci;
    return true;
}

/* "sample PID TIMESTAMP_US SM_UTIL MEM_UTIL ENC_UTIL DEC_UTIL" */
static bool parse_sample(struct sample_list *list, char *rest)
{
    unsigned long long pid, ts, sm, mem, enc, dec;
    if (!take_number(&rest, UINT32_MAX, &pid) || !take_number(&rest, UINT64_MAX, &ts) ||
        !take_number(&rest, 100, &sm) || !take_number(&rest, 100, &mem) ||
        !take_number(&rest, 100, &enc) || !take_number(&rest, 100, &dec) || !at_end(rest))
        return false;
    nvmlProcessUtilizationSample_t *s = LIST_PUSH(list);
    if (!s)
        return false;
    *s = (nvmlProcessUtilizationSample_t){
        .pid = (unsigned int)pid,
        .timeStamp = ts,
        .smUtil = (unsigned int)sm,
        .memUtil = (unsigned int)mem,
        .encUtil = (unsigned int)enc,
        .decUtil = (unsigned int)dec,
    };
    return true;
}

static bool parse_not_supported(struct name_list *list, const char *rest)
{
    if (*rest == '\0' || strchr(rest, ' ') || strlen(rest) >= FAKE_FUNC_NAME_MAX)
        return false;
    struct func_name *n = LIST_PUSH(list);
    if (!n)
        return false;
    memcpy(n->name, rest, strlen(rest) + 1);
    return true;
}

/* One space-separated word at *cursor into buf; false when empty or too long. */
static bool take_word(char **cursor, char *buf, size_t size)
{
    char *p = *cursor;
    while (*p == ' ')
        p++;
    size_t len = strcspn(p, " ");
    if (len == 0 || len >= size)
        return false;
    memcpy(buf, p, len);
    buf[len] = '\0';
    *cursor = p + len;
    return true;
}

/* "ID VALUE": a GPM metric id below NVML_GPM_METRIC_MAX and a decimal number. */
static bool parse_gpm_metric(struct gpm_values *gpm, char *rest)
{
    unsigned long long id;
    if (!take_number(&rest, NVML_GPM_METRIC_MAX - 1, &id))
        return false;
    char *end;
    errno = 0;
    double value = strtod(rest, &end);
    if (errno || end == rest || !at_end(end))
        return false;
    gpm->value[id] = value;
    gpm->set[id] = true;
    return true;
}

/* "mig SLOT GI CI SLICES MEMORY_TOTAL MEMORY_USED UUID PROFILE" */
static bool parse_mig(struct mig_list *list, char *rest)
{
    unsigned long long slot, gi, ci, slices, total, used;
    struct fake_mig m = {0};
    if (!take_number(&rest, FAKE_MIG_SLOTS - 1, &slot) || !take_number(&rest, UINT32_MAX, &gi) ||
        !take_number(&rest, UINT32_MAX, &ci) || !take_number(&rest, 7, &slices) ||
        !take_number(&rest, UINT64_MAX, &total) || !take_number(&rest, UINT64_MAX, &used) ||
        !take_word(&rest, m.uuid, sizeof(m.uuid)) ||
        !take_word(&rest, m.profile, sizeof(m.profile)) || !at_end(rest))
        return false;
    struct fake_mig *slot_entry = LIST_PUSH(list);
    if (!slot_entry)
        return false;
    m.slot = (unsigned int)slot;
    m.gpu_instance = (unsigned int)gi;
    m.compute_instance = (unsigned int)ci;
    m.slices = (unsigned int)slices;
    m.memory_total = total;
    m.memory_used = used;
    *slot_entry = m;
    return true;
}

/* "mig_gpm_metric GI ID VALUE", after the instance's "mig" line. */
static bool parse_mig_gpm_metric(struct mig_list *list, char *rest)
{
    unsigned long long gi;
    if (!take_number(&rest, UINT32_MAX, &gi))
        return false;
    for (size_t i = 0; i < list->count; i++)
        if (list->items[i].gpu_instance == gi)
            return parse_gpm_metric(&list->items[i].gpm, rest);
    return false;
}

/* "event SEQ TYPE DATA" */
static bool parse_event(struct event_list *list, char *rest)
{
    unsigned long long seq, type, data;
    if (!take_number(&rest, UINT64_MAX, &seq) || !take_number(&rest, UINT64_MAX, &type) ||
        !take_number(&rest, UINT64_MAX, &data) || !at_end(rest))
        return false;
    struct fake_event *e = LIST_PUSH(list);
    if (!e)
        return false;
    *e = (struct fake_event){.seq = seq, .type = type, .data = data};
    return true;
}

/* "nvlink LINK ACTIVE TX_KIB RX_KIB CRC_FLIT CRC_DATA REPLAY RECOVERY" */
static bool parse_nvlink(struct nvlink_list *list, char *rest)
{
    unsigned long long link, active, tx, rx, flit, data, replay, recovery;
    if (!take_number(&rest, NVML_NVLINK_MAX_LINKS - 1, &link) || !take_number(&rest, 1, &active) ||
        !take_number(&rest, UINT64_MAX, &tx) || !take_number(&rest, UINT64_MAX, &rx) ||
        !take_number(&rest, UINT64_MAX, &flit) || !take_number(&rest, UINT64_MAX, &data) ||
        !take_number(&rest, UINT64_MAX, &replay) || !take_number(&rest, UINT64_MAX, &recovery) ||
        !at_end(rest))
        return false;
    struct fake_nvlink *l = LIST_PUSH(list);
    if (!l)
        return false;
    l->link = (unsigned int)link;
    l->active = (unsigned int)active;
    l->tx_kib = tx;
    l->rx_kib = rx;
    l->error[NVML_NVLINK_ERROR_DL_CRC_FLIT] = flit;
    l->error[NVML_NVLINK_ERROR_DL_CRC_DATA] = data;
    l->error[NVML_NVLINK_ERROR_DL_REPLAY] = replay;
    l->error[NVML_NVLINK_ERROR_DL_RECOVERY] = recovery;
    return true;
}

/* "not_supported_field ID" */
static bool parse_field_id(struct field_id_list *list, char *rest)
{
    unsigned long long id;
    if (!take_number(&rest, UINT32_MAX, &id) || !at_end(rest))
        return false;
    unsigned int *slot = LIST_PUSH(list);
    if (!slot)
        return false;
    *slot = (unsigned int)id;
    return true;
}

/* "process_name PID NAME": the name runs to the end of the line. */
static bool parse_process_name(struct process_name_list *list, char *rest)
{
    unsigned long long pid;
    if (!take_number(&rest, UINT32_MAX, &pid))
        return false;
    while (*rest == ' ')
        rest++;
    if (*rest == '\0' || strlen(rest) >= FAKE_PROCESS_NAME_MAX)
        return false;
    struct fake_process_name *n = LIST_PUSH(list);
    if (!n)
        return false;
    n->pid = (unsigned int)pid;
    memcpy(n->name, rest, strlen(rest) + 1);
    return true;
}

/* Links up to the highest listed exist; two lines for one link are an error. */
static bool check_nvlinks(struct fake_device *d, size_t index, char *err, size_t errlen)
{
    d->nvlink_count = 0;
    for (size_t i = 0; i < d->nvlinks.count; i++) {
        unsigned int link = d->nvlinks.items[i].link;
        for (size_t j = 0; j < i; j++)
            if (d->nvlinks.items[j].link == link) {
                snprintf(err, errlen, "device %zu: NVLink link %u listed twice", index, link);
                return false;
            }
        if (link + 1 > d->nvlink_count)
            d->nvlink_count = link + 1;
    }
    return true;
}

static bool check_migs(const struct fake_device *d, size_t index, char *err, size_t errlen)
{
    for (size_t i = 0; i < d->migs.count; i++) {
        const struct fake_mig *m = &d->migs.items[i];
        if (strncmp(m->uuid, "MIG-", 4) != 0) {
            snprintf(err, errlen, "device %zu: MIG uuid '%s' does not start with MIG-", index,
                     m->uuid);
            return false;
        }
        if (m->memory_used > m->memory_total) {
            snprintf(err, errlen, "device %zu: MIG slot %u uses more memory than it has", index,
                     m->slot);
            return false;
        }
        for (size_t j = 0; j < i; j++)
            if (d->migs.items[j].slot == m->slot || d->migs.items[j].gpu_instance == m->gpu_instance) {
                snprintf(err, errlen, "device %zu: two MIG instances share slot %u or GI %u", index,
                         m->slot, m->gpu_instance);
                return false;
            }
    }
    return true;
}

/* Cross-field checks that would otherwise surface as nonsense readings. */
static bool check_device(struct fake_device *d, size_t index, char *err, size_t errlen)
{
    unsigned int domain, bus, device, function;
    char trailing;
    if (sscanf(d->pci_bus_id, "%x:%x:%x.%x%c", &domain, &bus, &device, &function, &trailing) != 4 ||
        bus > 0xff || device > 0x1f) {
        snprintf(err, errlen, "device %zu: pci_bus_id '%s' is not DDDDDDDD:BB:DD.F", index,
                 d->pci_bus_id);
        return false;
    }
    d->pci_domain = domain;
    d->pci_bus = bus;
    d->pci_device = device;
    if (d->memory_reserved_bytes > d->memory_total_bytes ||
        d->memory_used_bytes > d->memory_total_bytes - d->memory_reserved_bytes) {
        snprintf(err, errlen, "device %zu: reserved + used memory exceeds total", index);
        return false;
    }
    if (strncmp(d->uuid, "GPU-", 4) != 0) {
        snprintf(err, errlen, "device %zu: uuid '%s' does not start with GPU-", index, d->uuid);
        return false;
    }
    return check_nvlinks(d, index, err, errlen) && check_migs(d, index, err, errlen);
}

/*
 * The state file format (one record per line, '#' comments and blank lines ignored):
 *
 *   fake_nvml_state 1                    first line, format version
 *   driver_version 550.54.15             system keys, see state_fields[]
 *   cuda_version 12040
 *   init_error 0
 *   event_wait_error 0                   nonzero: every event wait fails with it
 *   device                               starts the next GPU (index = order in the file),
 *                                        pre-filled with the A100 defaults
 *   name NVIDIA A100-SXM4-80GB           device keys, see device_fields[]; strings run to
 *   ...                                  the end of the line
 *   not_supported nvmlDeviceGetFanSpeed_v2
 *   process PID USED_BYTES|na GI CI
 *   mps_process PID USED_BYTES|na GI CI
 *   sample PID TIMESTAMP_US SM MEM ENC DEC
 *   gpm_metric ID VALUE                  what GPM reports for this GPU (any two samples)
 *   mig SLOT GI CI SLICES TOTAL USED MIG-UUID PROFILE   a MIG instance ("-": unnamed profile)
 *   mig_gpm_metric GI ID VALUE           GPM of that instance
 *   event SEQ TYPE DATA                  an event the driver queued (SEQ orders delivery)
 *   nvlink LINK ACTIVE TX_KIB RX_KIB CRC_FLIT CRC_DATA REPLAY RECOVERY   an NVLink link
 *   not_supported_field ID               a field value answering NOT_SUPPORTED in its slot
 *   process_name PID NAME                what nvmlSystemGetProcessName says (a system key)
 *
 * Anything else is an error: a key the writer knows but we do not must fail loudly.
 */
static struct fake_state *parse_state(FILE *in, const char *path, char *err, size_t errlen)
{
    struct fake_state *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    set_default_state(s);

    char line[FAKE_LINE_MAX + 2]; /* the text, its newline and the NUL */
    char what[FAKE_ERR_MAX / 2] = ""; /* leaves room for the path prefix in err */
    struct fake_device *dev = NULL;
    unsigned lineno = 0;
    bool header_seen = false;

    while (fgets(line, sizeof(line), in)) {
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] != '\n' && !feof(in)) { /* fgets() stopped mid-line */
            snprintf(what, sizeof(what), "line longer than %d bytes", FAKE_LINE_MAX);
            goto fail;
        }
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            line[--len] = '\0';
        if (len == 0 || line[0] == '#')
            continue;
        if (!header_seen) {
            if (strcmp(line, FAKE_FORMAT_HEADER) != 0) {
                snprintf(what, sizeof(what), "expected '%s' as the first line", FAKE_FORMAT_HEADER);
                goto fail;
            }
            header_seen = true;
            continue;
        }

        char *rest = strchr(line, ' ');
        if (rest)
            *rest++ = '\0';
        else
            rest = line + len;
        const char *key = line;
        const struct field *f;

        if (strcmp(key, "device") == 0 && *rest == '\0') {
            if (dev && !check_device(dev, s->device_count - 1, what, sizeof(what)))
                goto fail;
            dev = list_push((void **)&s->devices, &s->device_count, &s->device_cap,
                            sizeof(*s->devices));
            if (!dev) {
                snprintf(what, sizeof(what), "out of memory");
                goto fail;
            }
            set_default_device(dev);
            dev->minor_number = (unsigned int)(s->device_count - 1);
        } else if ((f = find_field(state_fields, key))) {
            if (!set_field(f, s, rest, what, sizeof(what)))
                goto fail;
        } else if (strcmp(key, "process_name") == 0) {
            if (!parse_process_name(&s->process_names, rest)) {
                snprintf(what, sizeof(what), "bad process_name '%.80s' (want PID NAME)", rest);
                goto fail;
            }
        } else if (!dev) {
            snprintf(what, sizeof(what), "unknown key '%.80s' (or device key before 'device')", key);
            goto fail;
        } else if ((f = find_field(device_fields, key))) {
            if (!set_field(f, dev, rest, what, sizeof(what)))
                goto fail;
        } else if (strcmp(key, "not_supported") == 0) {
            if (!parse_not_supported(&dev->not_supported, rest)) {
                snprintf(what, sizeof(what), "bad not_supported '%.80s'", rest);
                goto fail;
            }
        } else if (strcmp(key, "process") == 0 || strcmp(key, "mps_process") == 0) {
            struct process_list *list = key[0] == 'm' ? &dev->mps_processes : &dev->processes;
            if (!parse_process(list, rest)) {
                snprintf(what, sizeof(what), "bad %.16s '%.80s' (want PID BYTES|na GI CI)", key, rest);
                goto fail;
            }
        } else if (strcmp(key, "sample") == 0) {
            if (!parse_sample(&dev->samples, rest)) {
                snprintf(what, sizeof(what), "bad sample '%.80s' (want PID TS SM MEM ENC DEC)", rest);
                goto fail;
            }
        } else if (strcmp(key, "gpm_metric") == 0) {
            if (!parse_gpm_metric(&dev->gpm, rest)) {
                snprintf(what, sizeof(what), "bad gpm_metric '%.80s' (want ID VALUE)", rest);
                goto fail;
            }
        } else if (strcmp(key, "mig") == 0) {
            if (!parse_mig(&dev->migs, rest)) {
                snprintf(what, sizeof(what),
                         "bad mig '%.80s' (want SLOT GI CI SLICES TOTAL USED UUID PROFILE)", rest);
                goto fail;
            }
        } else if (strcmp(key, "mig_gpm_metric") == 0) {
            if (!parse_mig_gpm_metric(&dev->migs, rest)) {
                snprintf(what, sizeof(what), "bad mig_gpm_metric '%.80s' (want GI ID VALUE)", rest);
                goto fail;
            }
        } else if (strcmp(key, "event") == 0) {
            if (!parse_event(&dev->events, rest)) {
                snprintf(what, sizeof(what), "bad event '%.80s' (want SEQ TYPE DATA)", rest);
                goto fail;
            }
        } else if (strcmp(key, "nvlink") == 0) {
            if (!parse_nvlink(&dev->nvlinks, rest)) {
                snprintf(what, sizeof(what),
                         "bad nvlink '%.80s' (want LINK ACTIVE TX RX FLIT DATA REPLAY RECOVERY)",
                         rest);
                goto fail;
            }
        } else if (strcmp(key, "not_supported_field") == 0) {
            if (!parse_field_id(&dev->not_supported_fields, rest)) {
                snprintf(what, sizeof(what), "bad not_supported_field '%.80s' (want ID)", rest);
                goto fail;
            }
        } else {
            snprintf(what, sizeof(what), "unknown key '%.80s'", key);
            goto fail;
        }
    }
    if (ferror(in)) {
        snprintf(what, sizeof(what), "read error: %s", strerror(errno));
        goto fail;
    }
    if (!header_seen) {
        snprintf(what, sizeof(what), "empty file (expected '%s')", FAKE_FORMAT_HEADER);
        goto fail;
    }
    if (dev && !check_device(dev, s->device_count - 1, what, sizeof(what)))
        goto fail;
    return s;

fail:
    snprintf(err, errlen, "%.200s:%u: %s", path, lineno, what);
    free_state(s);
    return NULL;
}

/* ------------------------------------------------------------------------------------ */
/* Loading and reloading (all called with g.lock held)                                  */
/* ------------------------------------------------------------------------------------ */

static void identity_from_stat(const struct stat *st, struct file_identity *id)
{
    *id = (struct file_identity){
        .valid = true,
        .dev = st->st_dev,
        .ino = st->st_ino,
        .size = st->st_size,
        .mtime = st->st_mtim,
        .ctime = st->st_ctim,
    };
}

/*
 * The inode is part of the identity because os.replace() of a same-sized file can land
 * within one coarse timestamp tick; the writer also bumps mtime, belt and braces.
 */
static bool same_identity(const struct file_identity *a, const struct file_identity *b)
{
    if (a->valid != b->valid)
        return false;
    if (!a->valid)
        return a->stat_errno == b->stat_errno;
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec &&
           a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec;
}

/*
 * A reload never revives a GPU for existing handles: devices that are lost, gone from
 * the file or replaced by another UUID stay lost for this generation.
 */
static void install_state(struct fake_state *s)
{
    if (g.current) {
        for (unsigned int i = 0; i < g.current->count; i++) {
            struct nvmlDevice_st *r = &g.current->records[i];
            if (r->index >= s->device_count || s->devices[r->index].lost ||
                strcmp(s->devices[r->index].uuid, r->uuid) != 0)
                r->lost = true;
        }
    }
    free_state(g.state);
    g.state = s;
}

/*
 * Bring g.state up to date with the state file.  `force` re-reads even an unchanged
 * file (a fresh init attaches to the "driver" again).  On failure g.state is kept and
 * the failed file's identity remembered, so a bad file is reported once, not per call.
 */
static bool refresh_state(bool force, char *err, size_t errlen)
{
    const char *path = getenv(FAKE_STATE_ENV);
    if (!path || !*path) {
        if (!g.state) {
            struct fake_state *s = calloc(1, sizeof(*s));
            struct fake_device *d = s ? calloc(1, sizeof(*d)) : NULL;
            if (!d) {
                free(s);
                snprintf(err, errlen, "out of memory");
                return false;
            }
            set_default_state(s);
            set_default_device(d);
            s->devices = d;
            s->device_count = s->device_cap = 1;
            install_state(s);
        }
        return true;
    }

    struct file_identity now = {0};
    struct stat st;
    if (stat(path, &st) == 0)
        identity_from_stat(&st, &now);
    else
        now.stat_errno = errno;
    if (!force && g.state && same_identity(&now, &g.identity))
        return true;
    g.identity = now;

    FILE *in = fopen(path, "r");
    if (!in) {
        snprintf(err, errlen, "cannot open %s=%s: %s", FAKE_STATE_ENV, path, strerror(errno));
        return false;
    }
    /* Remember what was actually read, in case the file was replaced since stat(). */
    if (fstat(fileno(in), &st) == 0)
        identity_from_stat(&st, &g.identity);
    struct fake_state *s = parse_state(in, path, err, errlen);
    fclose(in);
    if (!s)
        return false;
    install_state(s);
    return true;
}

static bool start_generation(void)
{
    struct fake_generation *gen = calloc(1, sizeof(*gen));
    size_t count = g.state->device_count;
    if (!gen || !(gen->records = calloc(count ? count : 1, sizeof(*gen->records))) ||
        !(gen->mig_records = calloc((count ? count : 1) * FAKE_MIG_SLOTS, sizeof(*gen->records)))) {
        if (gen)
            free(gen->records);
        free(gen);
        return false;
    }
    gen->count = (unsigned int)count;
    for (size_t i = 0; i < count; i++) {
        struct nvmlDevice_st *r = &gen->records[i];
        r->generation = gen;
        r->index = (unsigned int)i;
        r->lost = g.state->devices[i].lost;
        r->mig_slot = -1;
        memcpy(r->uuid, g.state->devices[i].uuid, sizeof(r->uuid));
        for (int slot = 0; slot < FAKE_MIG_SLOTS; slot++) {
            struct nvmlDevice_st *m = &gen->mig_records[i * FAKE_MIG_SLOTS + (size_t)slot];
            m->generation = gen;
            m->index = (unsigned int)i;
            m->mig_slot = slot;
        }
    }
    gen->older = g.generations;
    g.generations = gen;
    g.current = gen;
    return true;
}

static FAKE_MAYBE_UNUSED nvmlReturn_t init_locked(void)
{
    char err[FAKE_ERR_MAX];
    if (!refresh_state(g.refcount == 0, err, sizeof(err))) {
        fprintf(stderr, "fake-nvml: %s\n", err);
        return NVML_ERROR_UNKNOWN;
    }
    if (g.state->init_error != NVML_SUCCESS)
        return (nvmlReturn_t)g.state->init_error;
    if (g.refcount == 0 && !start_generation())
        return NVML_ERROR_MEMORY;
    g.refcount++;
    return NVML_SUCCESS;
}

/* Unloading the library is the only point where no client handle can be used again. */
__attribute__((destructor)) static void release_everything(void)
{
    while (g.generations) {
        struct fake_generation *older = g.generations->older;
        free(g.generations->records);
        free(g.generations->mig_records);
        free(g.generations);
        g.generations = older;
    }
    while (g.gpm_samples) {
        struct nvmlGpmSample_st *next = g.gpm_samples->next;
        free(g.gpm_samples);
        g.gpm_samples = next;
    }
    while (g.event_sets) {
        struct nvmlEventSet_st *next = g.event_sets->next;
        free(g.event_sets->items);
        free(g.event_sets);
        g.event_sets = next;
    }
    free_state(g.state);
    g.state = NULL;
}

/* ------------------------------------------------------------------------------------ */
/* Call prologue/epilogue: every export takes the lock in enter_*() and drops it in     */
/* leave(), whatever enter_*() returned.                                                */
/* ------------------------------------------------------------------------------------ */

static FAKE_MAYBE_UNUSED nvmlReturn_t enter_library(void)
{
    pthread_mutex_lock(&g.lock);
    if (g.refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    char err[FAKE_ERR_MAX];
    if (!refresh_state(false, err, sizeof(err)))
        fprintf(stderr, "fake-nvml: %s (keeping the previous state)\n", err);
    return NVML_SUCCESS;
}

static FAKE_MAYBE_UNUSED nvmlReturn_t leave(nvmlReturn_t rc)
{
    pthread_mutex_unlock(&g.lock);
    return rc;
}

/* Recognise our own records without dereferencing whatever the caller passed. */
static bool in_records(uintptr_t p, const struct nvmlDevice_st *records, size_t count)
{
    uintptr_t first = (uintptr_t)records;
    uintptr_t end = first + count * sizeof(*records);
    return p >= first && p < end && (p - first) % sizeof(*records) == 0;
}

static struct nvmlDevice_st *find_record(nvmlDevice_t handle)
{
    uintptr_t p = (uintptr_t)handle;
    for (struct fake_generation *gen = g.generations; gen; gen = gen->older)
        if (in_records(p, gen->records, gen->count) ||
            in_records(p, gen->mig_records, (size_t)gen->count * FAKE_MIG_SLOTS))
            return handle;
    return NULL;
}

static const struct fake_mig *find_mig(const struct fake_device *d, unsigned int slot)
{
    for (size_t i = 0; i < d->migs.count; i++)
        if (d->migs.items[i].slot == slot)
            return &d->migs.items[i];
    return NULL;
}

/*
 * Common checks of every per-device call, in the driver's order: initialised, valid
 * handle, GPU reachable, query supported.  `func` is the exported symbol (__func__),
 * matched against the device's not_supported names.  A MIG device handle is checked
 * through its parent GPU and then must still name the instance it was handed out for
 * (*mig_out is then that instance, else NULL).
 */
static FAKE_MAYBE_UNUSED nvmlReturn_t enter_any_once(nvmlDevice_t handle, const char *func,
                                   const struct fake_device **out, const struct fake_mig **mig_out);

/*
 * A device whose state says `hang 1` blocks every call about it, without holding the library
 * lock (calls about other GPUs go on), until the state file clears the flag.
 */
static FAKE_MAYBE_UNUSED nvmlReturn_t enter_any(nvmlDevice_t handle, const char *func,
                                                const struct fake_device **out,
                                                const struct fake_mig **mig_out)
{
    for (;;) {
        nvmlReturn_t rc = enter_any_once(handle, func, out, mig_out);
        if (rc != NVML_SUCCESS || !(*out)->hang)
            return rc;
        pthread_mutex_unlock(&g.lock);
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

static FAKE_MAYBE_UNUSED nvmlReturn_t enter_any_once(nvmlDevice_t handle, const char *func,
                                   const struct fake_device **out, const struct fake_mig **mig_out)
{
    nvmlReturn_t rc = enter_library();
    if (rc != NVML_SUCCESS)
        return rc;
    struct nvmlDevice_st *rec = find_record(handle);
    if (!rec)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct nvmlDevice_st *mig_rec = NULL;
    if (rec->mig_slot >= 0) {
        if (rec->generation != g.current || !rec->uuid[0])
            return NVML_ERROR_INVALID_ARGUMENT; /* MIG handles die with their init */
        mig_rec = rec;
        rec = &rec->generation->records[rec->index];
    }
    if (rec->generation != g.current) {
        /*
         * A handle from before the last re-init.  The driver keeps such a handle usable
         * for a GPU that is still present, never for one that fell off the bus.
         */
        if (rec->lost)
            return NVML_ERROR_GPU_IS_LOST;
        const char *uuid = rec->uuid;
        rec = NULL;
        for (unsigned int i = 0; i < g.current->count && !rec; i++)
            if (strcmp(g.current->records[i].uuid, uuid) == 0)
                rec = &g.current->records[i];
        if (!rec)
            return NVML_ERROR_GPU_IS_LOST;
    }
    if (rec->lost)
        return NVML_ERROR_GPU_IS_LOST;
    const struct fake_device *d = &g.state->devices[rec->index];
    for (size_t i = 0; i < d->not_supported.count; i++)
        if (strcmp(d->not_supported.items[i].name, func) == 0)
            return NVML_ERROR_NOT_SUPPORTED;
    const struct fake_mig *mig = NULL;
    if (mig_rec) {
        mig = d->mig_mode ? find_mig(d, (unsigned int)mig_rec->mig_slot) : NULL;
        if (!mig || strcmp(mig->uuid, mig_rec->uuid) != 0)
            return NVML_ERROR_INVALID_ARGUMENT; /* the instance was destroyed */
    }
    *out = d;
    *mig_out = mig;
    return NVML_SUCCESS;
}

/* enter_any() for calls about a whole GPU: a MIG device handle answers NOT_SUPPORTED. */
static FAKE_MAYBE_UNUSED nvmlReturn_t enter_device(nvmlDevice_t handle, const char *func,
                                                   const struct fake_device **out)
{
    const struct fake_mig *mig;
    nvmlReturn_t rc = enter_any(handle, func, out, &mig);
    if (rc == NVML_SUCCESS && mig)
        rc = NVML_ERROR_NOT_SUPPORTED;
    return rc;
}

/* Most getters copy one number out; these keep each of them to a single line. */
static FAKE_MAYBE_UNUSED nvmlReturn_t get_u32(nvmlDevice_t device, const char *func,
                                              size_t offset, unsigned int *out)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, func, &d);
    if (rc == NVML_SUCCESS && !out)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *out = *(const unsigned int *)((const char *)d + offset);
    return leave(rc);
}

static FAKE_MAYBE_UNUSED nvmlReturn_t get_u64(nvmlDevice_t device, const char *func,
                                              size_t offset, unsigned long long *out)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, func, &d);
    if (rc == NVML_SUCCESS && !out)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *out = *(const unsigned long long *)((const char *)d + offset);
    return leave(rc);
}

#define FIELD_OF(member) offsetof(struct fake_device, member)

static FAKE_MAYBE_UNUSED nvmlReturn_t get_clock(nvmlDevice_t device, const char *func,
                                                nvmlClockType_t type, bool max,
                                                unsigned int *clock)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, func, &d);
    if (rc == NVML_SUCCESS && (!clock || (unsigned int)type >= NVML_CLOCK_COUNT))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *clock = max ? d->max_clock_mhz[type] : d->clock_mhz[type];
    return leave(rc);
}

/*
 * The process-list protocol: *infoCount in = capacity of infos, out = entries needed or
 * written.  An empty list answers SUCCESS even to the count query (pynvml relies on it).
 */
static FAKE_MAYBE_UNUSED nvmlReturn_t get_processes(nvmlDevice_t device, const char *func,
                                                    bool mps, unsigned int *infoCount,
                                                    nvmlProcessInfo_t *infos)
{
    const struct fake_device *d;
    const struct fake_mig *mig;
    nvmlReturn_t rc = enter_any(device, func, &d, &mig);
    if (rc == NVML_SUCCESS && !infoCount)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return leave(rc);
    /* On a MIG device, only the processes of its GPU instance. */
    const struct process_list *list = mps ? &d->mps_processes : &d->processes;
    unsigned int needed = 0;
    for (size_t i = 0; i < list->count; i++)
        needed += !mig || list->items[i].gpuInstanceId == mig->gpu_instance;
    if (*infoCount < needed)
        rc = NVML_ERROR_INSUFFICIENT_SIZE;
    else if (needed && !infos)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else
        for (size_t i = 0, n = 0; i < list->count; i++)
            if (!mig || list->items[i].gpuInstanceId == mig->gpu_instance)
                infos[n++] = list->items[i];
    if (rc != NVML_ERROR_INVALID_ARGUMENT)
        *infoCount = needed;
    return leave(rc);
}

/* ------------------------------------------------------------------------------------ */
/* Exported NVML API                                                                    */
/* ------------------------------------------------------------------------------------ */

#ifndef FAKE_OMIT_nvmlInitWithFlags
nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS / NO_ATTACH change nothing for a fake with a known device list */
    pthread_mutex_lock(&g.lock);
    return leave(init_locked());
}
#endif

#ifndef FAKE_OMIT_nvmlInit_v2
nvmlReturn_t nvmlInit_v2(void)
{
    pthread_mutex_lock(&g.lock);
    return leave(init_locked());
}
#endif

#ifndef FAKE_OMIT_nvmlShutdown
nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g.lock);
    if (g.refcount == 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    if (--g.refcount == 0)
        g.current = NULL; /* the generation's records stay, so stale handles are detected */
    return leave(NVML_SUCCESS);
}
#endif

#ifndef FAKE_OMIT_nvmlErrorString
const char *nvmlErrorString(nvmlReturn_t result)
{
    /* The texts of the real library, so error messages read the same in logs. */
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset type not supported";
    default: return "Unknown Error";
    }
}
#endif

#ifndef FAKE_OMIT_nvmlSystemGetDriverVersion
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = enter_library();
    if (rc == NVML_SUCCESS)
        rc = copy_out_string(g.state->driver_version, version, length);
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlSystemGetNVMLVersion
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = enter_library();
    if (rc == NVML_SUCCESS) {
        /* Real format: CUDA major, then the driver version, e.g. "12.550.54.15". */
        char buf[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE + 16];
        snprintf(buf, sizeof(buf), "%u.%s", g.state->cuda_version / 1000,
                 g.state->driver_version);
        rc = copy_out_string(buf, version, length);
    }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlSystemGetCudaDriverVersion
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    nvmlReturn_t rc = enter_library();
    if (rc == NVML_SUCCESS && !cudaDriverVersion)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *cudaDriverVersion = (int)g.state->cuda_version;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetCount_v2
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t rc = enter_library();
    if (rc == NVML_SUCCESS && !deviceCount)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *deviceCount = g.current->count; /* fixed per init, as hot-plug is invisible too */
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetHandleByIndex_v2
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t rc = enter_library();
    if (rc == NVML_SUCCESS && (!device || index >= g.current->count))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (rc == NVML_SUCCESS && g.current->records[index].lost)
        rc = NVML_ERROR_GPU_IS_LOST;
    if (rc == NVML_SUCCESS)
        *device = &g.current->records[index];
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetName
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    const struct fake_device *d;
    const struct fake_mig *mig;
    nvmlReturn_t rc = enter_any(device, __func__, &d, &mig);
    if (rc == NVML_SUCCESS && mig) {
        /* A MIG device is named after its parent and profile: "NVIDIA H100 ... MIG 3g.40gb". */
        char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE + FAKE_PROFILE_MAX + 8];
        if (strcmp(mig->profile, "-") == 0)
            snprintf(buf, sizeof(buf), "%s MIG", d->name);
        else
            snprintf(buf, sizeof(buf), "%s MIG %s", d->name, mig->profile);
        rc = copy_out_string(buf, name, length);
    } else if (rc == NVML_SUCCESS) {
        rc = copy_out_string(d->name, name, length);
    }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetUUID
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    const struct fake_device *d;
    const struct fake_mig *mig;
    nvmlReturn_t rc = enter_any(device, __func__, &d, &mig);
    if (rc == NVML_SUCCESS)
        rc = copy_out_string(mig ? mig->uuid : d->uuid, uuid, length);
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetPciInfo_v3
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && !pci)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        memset(pci, 0, sizeof(*pci));
        pci->domain = d->pci_domain;
        pci->bus = d->pci_bus;
        pci->device = d->pci_device;
        pci->pciDeviceId = d->pci_device_id;
        pci->pciSubSystemId = d->pci_subsystem_id;
        /* The driver reformats rather than echoing the input, so callers see its casing. */
        snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT,
                 d->pci_domain & 0xffff, d->pci_bus, d->pci_device);
        snprintf(pci->busId, sizeof(pci->busId), NVML_DEVICE_PCI_BUS_ID_FMT, d->pci_domain,
                 d->pci_bus, d->pci_device);
    }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetUtilizationRates
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && !utilization)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        utilization->gpu = d->util_gpu_percent;
        utilization->memory = d->util_memory_percent;
    }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetMemoryInfo
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    const struct fake_device *d;
    const struct fake_mig *mig;
    nvmlReturn_t rc = enter_any(device, __func__, &d, &mig);
    if (rc == NVML_SUCCESS && !memory)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && mig) {
        memory->total = mig->memory_total;
        memory->used = mig->memory_used;
        memory->free = mig->memory_total - mig->memory_used;
    } else if (rc == NVML_SUCCESS) {
        /* v1 has no "reserved": it is folded into "used", as nvml.h documents. */
        memory->total = d->memory_total_bytes;
        memory->used = d->memory_reserved_bytes + d->memory_used_bytes;
        memory->free = d->memory_total_bytes - memory->used;
    }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetMemoryInfo_v2
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    const struct fake_device *d;
    const struct fake_mig *mig;
    nvmlReturn_t rc = enter_any(device, __func__, &d, &mig);
    if (rc == NVML_SUCCESS && !memory)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (rc == NVML_SUCCESS && memory->version != nvmlMemory_v2)
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (rc == NVML_SUCCESS && mig) {
        memory->total = mig->memory_total;
        memory->reserved = 0;
        memory->used = mig->memory_used;
        memory->free = mig->memory_total - mig->memory_used;
    } else if (rc == NVML_SUCCESS) {
        memory->total = d->memory_total_bytes;
        memory->reserved = d->memory_reserved_bytes;
        memory->used = d->memory_used_bytes;
        memory->free = d->memory_total_bytes - d->memory_reserved_bytes - d->memory_used_bytes;
    }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetPowerUsage
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    return get_u32(device, __func__, FIELD_OF(power_usage_mw), power);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetEnforcedPowerLimit
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return get_u32(device, __func__, FIELD_OF(power_limit_mw), limit);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetTotalEnergyConsumption
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    return get_u64(device, __func__, FIELD_OF(energy_mj), energy);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetTemperature
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                      unsigned int *temp)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && (!temp || (unsigned int)sensorType >= NVML_TEMPERATURE_COUNT))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (rc == NVML_SUCCESS && sensorType != NVML_TEMPERATURE_GPU)
        rc = NVML_ERROR_NOT_SUPPORTED; /* only the die sensor is modelled */
    if (rc == NVML_SUCCESS)
        *temp = d->temperature_c;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetClockInfo
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    return get_clock(device, __func__, type, false, clock);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetMaxClockInfo
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                       unsigned int *clock)
{
    return get_clock(device, __func__, type, true, clock);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetCurrentClocksEventReasons
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                    unsigned long long *clocksEventReasons)
{
    return get_u64(device, __func__, FIELD_OF(clock_event_reasons), clocksEventReasons);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetCurrentClocksThrottleReasons
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                       unsigned long long *clocksThrottleReasons)
{
    return get_u64(device, __func__, FIELD_OF(clock_event_reasons), clocksThrottleReasons);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetNumFans
nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *numFans)
{
    return get_u32(device, __func__, FIELD_OF(num_fans), numFans);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetFanSpeed_v2
nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && d->num_fans == 0)
        rc = NVML_ERROR_NOT_SUPPORTED; /* passively cooled boards (SXM) have no fan to read */
    else if (rc == NVML_SUCCESS && (!speed || fan >= d->num_fans))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *speed = d->fan_speed_percent;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetTotalEccErrors
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType,
                                         unsigned long long *eccCounts)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS &&
        (!eccCounts || (unsigned int)errorType >= NVML_MEMORY_ERROR_TYPE_COUNT ||
         (unsigned int)counterType >= NVML_ECC_COUNTER_TYPE_COUNT))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    /* Aggregate counts are the volatile ones plus those from before the driver loaded. */
    if (rc == NVML_SUCCESS) {
        bool corrected = errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED;
        *eccCounts = corrected ? d->ecc_corrected_volatile : d->ecc_uncorrected_volatile;
        if (counterType == NVML_AGGREGATE_ECC)
            *eccCounts += corrected ? d->ecc_corrected_before_load : d->ecc_uncorrected_before_load;
    }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetPcieReplayCounter
nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
    return get_u32(device, __func__, FIELD_OF(pcie_replay_count), value);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetPerformanceState
nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *pState)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && !pState)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *pState = (nvmlPstates_t)d->performance_state;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetMinorNumber
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    return get_u32(device, __func__, FIELD_OF(minor_number), minorNumber);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetComputeRunningProcesses_v3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return get_processes(device, __func__, false, infoCount, infos);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetComputeRunningProcesses_v2
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos)
{
    return get_processes(device, __func__, false, infoCount, infos);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetMPSComputeRunningProcesses_v3
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                        unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos)
{
    return get_processes(device, __func__, true, infoCount, infos);
}
#endif

/*
 * Functions other NVML clients call (nvitop and its exporter, for the peer benchmark in
 * benchmarks/peers.py): the video engines, the power limit and first fan by their older
 * names, and graphics processes (none: data-center GPUs run no graphics contexts).
 */
static FAKE_MAYBE_UNUSED nvmlReturn_t get_engine_util(nvmlDevice_t device, const char *func,
                                                      size_t offset, unsigned int *utilization,
                                                      unsigned int *samplingPeriodUs)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, func, &d);
    if (rc == NVML_SUCCESS && (!utilization || !samplingPeriodUs))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        memcpy(utilization, (const char *)d + offset, sizeof(*utilization));
        *samplingPeriodUs = 167000; /* what a real GPU reports for its video engines */
    }
    return leave(rc);
}

#ifndef FAKE_OMIT_nvmlDeviceGetEncoderUtilization
nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                             unsigned int *samplingPeriodUs)
{
    return get_engine_util(device, __func__, FIELD_OF(encoder_util_percent), utilization,
                           samplingPeriodUs);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetDecoderUtilization
nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                             unsigned int *samplingPeriodUs)
{
    return get_engine_util(device, __func__, FIELD_OF(decoder_util_percent), utilization,
                           samplingPeriodUs);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetPowerManagementLimit
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    return get_u32(device, __func__, FIELD_OF(power_limit_mw), limit);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetFanSpeed
nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && d->num_fans == 0)
        rc = NVML_ERROR_NOT_SUPPORTED;
    else if (rc == NVML_SUCCESS && !speed)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *speed = d->fan_speed_percent;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetGraphicsRunningProcesses_v3
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                      unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    const struct fake_device *d;
    const struct fake_mig *mig;
    (void)infos;
    nvmlReturn_t rc = enter_any(device, __func__, &d, &mig);
    if (rc == NVML_SUCCESS && !infoCount)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *infoCount = 0;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetProcessUtilization
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && !processSamplesCount)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return leave(rc);
    unsigned int newer = 0;
    for (size_t i = 0; i < d->samples.count; i++)
        newer += d->samples.items[i].timeStamp > lastSeenTimeStamp;
    /*
     * NOT_FOUND means "no activity since then", even for the size query; a NULL buffer
     * (or a short one) answers INSUFFICIENT_SIZE with the count, as pynvml expects.
     */
    if (newer == 0) {
        rc = NVML_ERROR_NOT_FOUND;
    } else if (!utilization || *processSamplesCount < newer) {
        rc = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        unsigned int n = 0;
        for (size_t i = 0; i < d->samples.count; i++)
            if (d->samples.items[i].timeStamp > lastSeenTimeStamp)
                utilization[n++] = d->samples.items[i];
    }
    *processSamplesCount = newer;
    return leave(rc);
}
#endif

/* ------------------------------------------------------------------------------------ */
/* Throttle time, memory health, PCIe throughput                                       */
/* ------------------------------------------------------------------------------------ */

/* The violation counter (ns) behind a perf policy; false for a policy NVML does not count. */
static FAKE_MAYBE_UNUSED bool violation_of(const struct fake_device *d, unsigned int policy,
                                           unsigned long long *ns)
{
    switch (policy) {
    case NVML_PERF_POLICY_POWER: *ns = d->violation_power_ns; return true;
    case NVML_PERF_POLICY_THERMAL: *ns = d->violation_thermal_ns; return true;
    case NVML_PERF_POLICY_SYNC_BOOST: *ns = d->violation_sync_boost_ns; return true;
    case NVML_PERF_POLICY_BOARD_LIMIT: *ns = d->violation_board_limit_ns; return true;
    case NVML_PERF_POLICY_LOW_UTILIZATION: *ns = d->violation_low_utilization_ns; return true;
    case NVML_PERF_POLICY_RELIABILITY: *ns = d->violation_reliability_ns; return true;
    case NVML_PERF_POLICY_TOTAL_APP_CLOCKS: *ns = d->violation_app_clocks_ns; return true;
    case NVML_PERF_POLICY_TOTAL_BASE_CLOCKS: *ns = d->violation_base_clocks_ns; return true;
    default: return false;
    }
}

static FAKE_MAYBE_UNUSED long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

#ifndef FAKE_OMIT_nvmlDeviceGetViolationStatus
nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, nvmlPerfPolicyType_t perfPolicyType,
                                          nvmlViolationTime_t *violTime)
{
    const struct fake_device *d;
    unsigned long long ns = 0;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && (!violTime || !violation_of(d, (unsigned int)perfPolicyType, &ns)))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        violTime->referenceTime = (unsigned long long)now_us();
        violTime->violationTime = ns;
    }
    return leave(rc);
}
#endif

/* The link record of `link` (NULL for a link that exists but is not listed: inactive). */
static FAKE_MAYBE_UNUSED const struct fake_nvlink *find_nvlink(const struct fake_device *d,
                                                               unsigned int link)
{
    for (size_t i = 0; i < d->nvlinks.count; i++)
        if (d->nvlinks.items[i].link == link)
            return &d->nvlinks.items[i];
    return NULL;
}

/* Whether the device can be asked about `link`: it has NVLink, and that link. */
static FAKE_MAYBE_UNUSED nvmlReturn_t check_link(const struct fake_device *d, unsigned int link)
{
    if (d->nvlink_count == 0)
        return NVML_ERROR_NOT_SUPPORTED; /* a GPU without NVLink (a PCIe card) */
    return link < d->nvlink_count ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

static FAKE_MAYBE_UNUSED bool field_refused(const struct fake_device *d, unsigned int field)
{
    for (size_t i = 0; i < d->not_supported_fields.count; i++)
        if (d->not_supported_fields.items[i] == field)
            return true;
    return false;
}

/* One field's answer in its own slot: the value, or why not. */
static FAKE_MAYBE_UNUSED void field_value(const struct fake_device *d, nvmlFieldValue_t *v)
{
    unsigned int policy = NVML_PERF_POLICY_COUNT;
    unsigned long long ns = 0;
    v->timestamp = now_us();
    v->latencyUsec = 0;
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    v->value.ullVal = 0;
    v->nvmlReturn = NVML_SUCCESS;
    if (field_refused(d, v->fieldId)) {
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        return;
    }
    switch (v->fieldId) {
    case NVML_FI_DEV_MEMORY_TEMP:
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = d->memory_temperature_c;
        return;
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: {
        bool tx = v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX;
        if (v->scopeId == UINT_MAX && d->nvlink_count) { /* every link, summed */
            for (size_t i = 0; i < d->nvlinks.count; i++)
                v->value.ullVal += tx ? d->nvlinks.items[i].tx_kib : d->nvlinks.items[i].rx_kib;
            return;
        }
        v->nvmlReturn = check_link(d, v->scopeId);
        const struct fake_nvlink *l = find_nvlink(d, v->scopeId);
        if (v->nvmlReturn == NVML_SUCCESS && l)
            v->value.ullVal = tx ? l->tx_kib : l->rx_kib;
        return;
    }
    case NVML_FI_DEV_PERF_POLICY_POWER: policy = NVML_PERF_POLICY_POWER; break;
    case NVML_FI_DEV_PERF_POLICY_THERMAL:
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: policy = NVML_PERF_POLICY_THERMAL; break;
    case NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: policy = NVML_PERF_POLICY_SYNC_BOOST; break;
    case NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: policy = NVML_PERF_POLICY_BOARD_LIMIT; break;
    case NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: policy = NVML_PERF_POLICY_LOW_UTILIZATION; break;
    case NVML_FI_DEV_PERF_POLICY_RELIABILITY: policy = NVML_PERF_POLICY_RELIABILITY; break;
    case NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS: policy = NVML_PERF_POLICY_TOTAL_APP_CLOCKS; break;
    case NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS: policy = NVML_PERF_POLICY_TOTAL_BASE_CLOCKS; break;
    default: break;
    }
    v->nvmlReturn = violation_of(d, policy, &ns) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    v->value.ullVal = ns;
}

#ifndef FAKE_OMIT_nvmlDeviceGetFieldValues
/*
 * Throttle time (the perf-policy fields, in nanoseconds), memory temperature and per-link
 * NVLink data (KiB; the link in scopeId, UINT_MAX for all of them summed); any other field id,
 * or one the state lists as not_supported_field, answers NOT_SUPPORTED in its own slot.
 */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && (valuesCount <= 0 || !values))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; rc == NVML_SUCCESS && i < valuesCount; i++)
        field_value(d, &values[i]);
    return leave(rc);
}
#endif

/* ------------------------------------------------------------------------------------ */
/* NVLink, PCIe link, power limits, modes, process names                                */
/* ------------------------------------------------------------------------------------ */

#ifndef FAKE_OMIT_nvmlDeviceGetNvLinkState
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                      nvmlEnableState_t *isActive)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS)
        rc = check_link(d, link);
    if (rc == NVML_SUCCESS && !isActive)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        const struct fake_nvlink *l = find_nvlink(d, link);
        *isActive = l && l->active ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetNvLinkErrorCounter
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                             nvmlNvLinkErrorCounter_t counter,
                                             unsigned long long *counterValue)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS)
        rc = check_link(d, link);
    if (rc == NVML_SUCCESS && (!counterValue || (unsigned int)counter >= NVML_NVLINK_ERROR_COUNT))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (rc == NVML_SUCCESS && counter == NVML_NVLINK_ERROR_DL_ECC_DATA)
        rc = NVML_ERROR_NOT_SUPPORTED; /* not modelled */
    if (rc == NVML_SUCCESS) {
        const struct fake_nvlink *l = find_nvlink(d, link);
        *counterValue = l ? l->error[counter] : 0;
    }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetCurrPcieLinkGeneration
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen)
{
    return get_u32(device, __func__, FIELD_OF(pcie_generation), currLinkGen);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetMaxPcieLinkGeneration
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGen)
{
    return get_u32(device, __func__, FIELD_OF(pcie_max_generation), maxLinkGen);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetCurrPcieLinkWidth
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth)
{
    return get_u32(device, __func__, FIELD_OF(pcie_width), currLinkWidth);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetMaxPcieLinkWidth
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth)
{
    return get_u32(device, __func__, FIELD_OF(pcie_max_width), maxLinkWidth);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetPowerManagementLimitConstraints
nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device,
                                                          unsigned int *minLimit,
                                                          unsigned int *maxLimit)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && (!minLimit || !maxLimit))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        *minLimit = d->power_min_limit_mw;
        *maxLimit = d->power_max_limit_mw;
    }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetPowerManagementDefaultLimit
nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *defaultLimit)
{
    return get_u32(device, __func__, FIELD_OF(power_default_limit_mw), defaultLimit);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetComputeMode
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && !mode)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *mode = (nvmlComputeMode_t)d->compute_mode;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetPersistenceMode
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && !mode)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *mode = d->persistence_mode ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlSystemGetProcessName
nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    nvmlReturn_t rc = enter_library();
    if (rc != NVML_SUCCESS)
        return leave(rc);
    if (!name || length == 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    rc = NVML_ERROR_NOT_FOUND; /* no such process, as the driver sees it */
    for (size_t i = 0; i < g.state->process_names.count; i++)
        if (g.state->process_names.items[i].pid == pid) {
            rc = copy_out_string(g.state->process_names.items[i].name, name, length);
            break;
        }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetRemappedRows
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                       unsigned int *uncRows, unsigned int *isPending,
                                       unsigned int *failureOccurred)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && (!corrRows || !uncRows || !isPending || !failureOccurred))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        *corrRows = d->remapped_rows_correctable;
        *uncRows = d->remapped_rows_uncorrectable;
        *isPending = d->remapped_rows_pending;
        *failureOccurred = d->remapped_rows_failed;
    }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetRetiredPages
/* The count protocol: too small a buffer (or none) answers INSUFFICIENT_SIZE with the count. */
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                       unsigned int *pageCount, unsigned long long *addresses)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && (!pageCount || (unsigned int)cause >= NVML_PAGE_RETIREMENT_CAUSE_COUNT))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return leave(rc);
    unsigned int count = cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
                             ? d->retired_pages_double_bit
                             : d->retired_pages_single_bit;
    if (count && (!addresses || *pageCount < count))
        rc = NVML_ERROR_INSUFFICIENT_SIZE;
    else
        for (unsigned int i = 0; i < count; i++)
            addresses[i] = 0x100000000ULL * ((unsigned long long)cause + 1) + 0x1000ULL * i;
    *pageCount = count;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetRetiredPagesPendingStatus
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && !isPending)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *isPending = d->retired_pages_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetPcieThroughput
/* Blocks for the 20 ms window the real driver counts bytes over (outside the lock). */
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter,
                                         unsigned int *value)
{
    const struct fake_device *d;
    unsigned int kbps = 0;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && (!value || (unsigned int)counter >= NVML_PCIE_UTIL_COUNT))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        kbps = counter == NVML_PCIE_UTIL_TX_BYTES ? d->pcie_tx_kbps : d->pcie_rx_kbps;
    leave(rc);
    if (rc == NVML_SUCCESS) {
        struct timespec window = {.tv_sec = 0, .tv_nsec = FAKE_PCIE_WINDOW_NS};
        nanosleep(&window, NULL);
        *value = kbps;
    }
    return rc;
}
#endif

/* ------------------------------------------------------------------------------------ */
/* MIG                                                                                  */
/* ------------------------------------------------------------------------------------ */

#ifndef FAKE_OMIT_nvmlDeviceGetMigMode
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && (!currentMode || !pendingMode))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *currentMode = *pendingMode = d->mig_mode ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetMaxMigDeviceCount
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && !count)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *count = d->mig_mode ? FAKE_MIG_SLOTS : 0; /* zero unless MIG mode is on, as documented */
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetMigDeviceHandleByIndex
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && (!migDevice || index >= FAKE_MIG_SLOTS || !d->mig_mode))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_mig *mig = rc == NVML_SUCCESS ? find_mig(d, index) : NULL;
    if (rc == NVML_SUCCESS && !mig)
        rc = NVML_ERROR_NOT_FOUND; /* an empty slot */
    if (rc == NVML_SUCCESS) {
        unsigned int parent = (unsigned int)(d - g.state->devices);
        struct nvmlDevice_st *rec = &g.current->mig_records[parent * FAKE_MIG_SLOTS + index];
        memcpy(rec->uuid, mig->uuid, sizeof(rec->uuid));
        *migDevice = rec;
    }
    return leave(rc);
}
#endif

/* The MIG instance behind a handle; a GPU's own handle is INVALID_ARGUMENT, as in NVML. */
static FAKE_MAYBE_UNUSED nvmlReturn_t enter_mig(nvmlDevice_t device, const char *func,
                                                const struct fake_mig **mig)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_any(device, func, &d, mig);
    if (rc == NVML_SUCCESS && !*mig)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    return rc;
}

#ifndef FAKE_OMIT_nvmlDeviceGetGpuInstanceId
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    const struct fake_mig *mig;
    nvmlReturn_t rc = enter_mig(device, __func__, &mig);
    if (rc == NVML_SUCCESS && !id)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *id = mig->gpu_instance;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetComputeInstanceId
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    const struct fake_mig *mig;
    nvmlReturn_t rc = enter_mig(device, __func__, &mig);
    if (rc == NVML_SUCCESS && !id)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *id = mig->compute_instance;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetAttributes_v2
nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    const struct fake_mig *mig;
    nvmlReturn_t rc = enter_mig(device, __func__, &mig);
    if (rc == NVML_SUCCESS && !attributes)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        memset(attributes, 0, sizeof(*attributes));
        attributes->gpuInstanceSliceCount = mig->slices;
        attributes->computeInstanceSliceCount = mig->slices;
        attributes->memorySizeMB = mig->memory_total / (1024 * 1024);
    }
    return leave(rc);
}
#endif

/* ------------------------------------------------------------------------------------ */
/* GPM                                                                                  */
/* ------------------------------------------------------------------------------------ */

static FAKE_MAYBE_UNUSED struct nvmlGpmSample_st *find_sample(nvmlGpmSample_t sample)
{
    for (struct nvmlGpmSample_st *s = g.gpm_samples; s; s = s->next)
        if (s == sample && s->allocated)
            return s;
    return NULL;
}

#ifndef FAKE_OMIT_nvmlGpmQueryDeviceSupport
nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && !gpmSupport)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (rc == NVML_SUCCESS && gpmSupport->version != NVML_GPM_SUPPORT_VERSION)
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (rc == NVML_SUCCESS)
        gpmSupport->isSupportedDevice = d->gpm_supported;
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlGpmSampleAlloc
nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample)
{
    nvmlReturn_t rc = enter_library();
    if (rc == NVML_SUCCESS && !gpmSample)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        struct nvmlGpmSample_st *s = calloc(1, sizeof(*s));
        if (!s)
            return leave(NVML_ERROR_MEMORY);
        s->allocated = true;
        s->next = g.gpm_samples;
        g.gpm_samples = s;
        *gpmSample = s;
    }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlGpmSampleFree
nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample)
{
    nvmlReturn_t rc = enter_library();
    struct nvmlGpmSample_st *s = rc == NVML_SUCCESS ? find_sample(gpmSample) : NULL;
    if (rc == NVML_SUCCESS && !s)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        s->allocated = s->filled = false;
    return leave(rc);
}
#endif

/* Fill a sample of a GPU (gpu_instance -1) or of one of its MIG instances. */
static FAKE_MAYBE_UNUSED nvmlReturn_t take_sample(nvmlDevice_t device, const char *func,
                                                  int gpu_instance, nvmlGpmSample_t sample)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, func, &d);
    struct nvmlGpmSample_st *s = rc == NVML_SUCCESS ? find_sample(sample) : NULL;
    if (rc == NVML_SUCCESS && !s)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (rc == NVML_SUCCESS && !d->gpm_supported)
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc == NVML_SUCCESS && gpu_instance >= 0) {
        bool found = false;
        for (size_t i = 0; i < d->migs.count && d->mig_mode; i++)
            found |= d->migs.items[i].gpu_instance == (unsigned int)gpu_instance;
        if (!found)
            rc = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (rc == NVML_SUCCESS) {
        s->filled = true;
        s->generation = g.current;
        s->index = (unsigned int)(d - g.state->devices);
        s->gpu_instance = gpu_instance;
    }
    return leave(rc);
}

#ifndef FAKE_OMIT_nvmlGpmSampleGet
nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
    return take_sample(device, __func__, -1, gpmSample);
}
#endif

#ifndef FAKE_OMIT_nvmlGpmMigSampleGet
nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId,
                                 nvmlGpmSample_t gpmSample)
{
    if (gpuInstanceId > INT32_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    return take_sample(device, __func__, (int)gpuInstanceId, gpmSample);
}
#endif

#ifndef FAKE_OMIT_nvmlGpmMetricsGet
/* Both samples must be filled, of the same GPU or instance, in this init generation. */
nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet)
{
    nvmlReturn_t rc = enter_library();
    if (rc == NVML_SUCCESS && !metricsGet)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (rc == NVML_SUCCESS && metricsGet->version != NVML_GPM_METRICS_GET_VERSION)
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (rc != NVML_SUCCESS)
        return leave(rc);
    const struct nvmlGpmSample_st *a = find_sample(metricsGet->sample1);
    const struct nvmlGpmSample_st *b = find_sample(metricsGet->sample2);
    if (!a || !b || !a->filled || !b->filled || a->generation != g.current ||
        b->generation != g.current || a->index != b->index || a->gpu_instance != b->gpu_instance ||
        a->index >= g.state->device_count || metricsGet->numMetrics > NVML_GPM_METRIC_MAX)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    const struct fake_device *d = &g.state->devices[a->index];
    const struct gpm_values *values = &d->gpm;
    for (size_t i = 0; a->gpu_instance >= 0 && i < d->migs.count; i++)
        if (d->migs.items[i].gpu_instance == (unsigned int)a->gpu_instance)
            values = &d->migs.items[i].gpm;
    for (unsigned int i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        bool known = m->metricId < NVML_GPM_METRIC_MAX && values->set[m->metricId];
        m->nvmlReturn = known ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
        m->value = known ? values->value[m->metricId] : 0.0;
        m->metricInfo.shortName = m->metricInfo.longName = m->metricInfo.unit = NULL;
    }
    return leave(NVML_SUCCESS);
}
#endif

/* ------------------------------------------------------------------------------------ */
/* Events                                                                               */
/* ------------------------------------------------------------------------------------ */

static FAKE_MAYBE_UNUSED struct nvmlEventSet_st *find_set(nvmlEventSet_t set)
{
    for (struct nvmlEventSet_st *s = g.event_sets; s; s = s->next)
        if (s == set && !s->freed)
            return s;
    return NULL;
}

#ifndef FAKE_OMIT_nvmlEventSetCreate
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    nvmlReturn_t rc = enter_library();
    if (rc == NVML_SUCCESS && !set)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        struct nvmlEventSet_st *s = calloc(1, sizeof(*s));
        if (!s)
            return leave(NVML_ERROR_MEMORY);
        s->generation = g.current;
        s->next = g.event_sets;
        g.event_sets = s;
        *set = s;
    }
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetSupportedEventTypes
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    return get_u64(device, __func__, FIELD_OF(supported_events), eventTypes);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceRegisterEvents
/* Events already queued when a GPU is registered are not delivered: only newer ones. */
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    struct nvmlEventSet_st *s = rc == NVML_SUCCESS ? find_set(set) : NULL;
    if (rc == NVML_SUCCESS && !s)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (rc == NVML_SUCCESS && (eventTypes & ~d->supported_events))
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc != NVML_SUCCESS)
        return leave(rc);
    struct event_registration *r = LIST_PUSH(s);
    if (!r)
        return leave(NVML_ERROR_MEMORY);
    r->handle = device;
    r->index = (unsigned int)(d - g.state->devices);
    r->mask = eventTypes;
    for (size_t i = 0; i < d->events.count; i++)
        if (d->events.items[i].seq > r->cursor)
            r->cursor = d->events.items[i].seq;
    return leave(NVML_SUCCESS);
}
#endif

/* The oldest undelivered event of a registered GPU, consumed; false when there is none. */
static FAKE_MAYBE_UNUSED bool next_event(struct nvmlEventSet_st *s, nvmlEventData_t *data)
{
    for (size_t i = 0; i < s->count; i++) {
        struct event_registration *r = &s->items[i];
        if (r->index >= g.state->device_count)
            continue;
        const struct fake_device *d = &g.state->devices[r->index];
        const struct fake_event *best = NULL;
        for (size_t j = 0; j < d->events.count; j++) {
            const struct fake_event *e = &d->events.items[j];
            if (e->seq > r->cursor && (e->type & r->mask) && (!best || e->seq < best->seq))
                best = e;
        }
        if (best) {
            r->cursor = best->seq;
            data->device = r->handle;
            data->eventType = best->type;
            data->eventData = best->type == nvmlEventTypeXidCriticalError ? best->data : 0;
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
            return true;
        }
    }
    return false;
}

#ifndef FAKE_OMIT_nvmlEventSetWait_v2
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        nvmlReturn_t rc = enter_library();
        struct nvmlEventSet_st *s = rc == NVML_SUCCESS ? find_set(set) : NULL;
        if (rc == NVML_SUCCESS && (!s || !data))
            rc = NVML_ERROR_INVALID_ARGUMENT;
        if (rc == NVML_SUCCESS && g.state->event_wait_error != NVML_SUCCESS)
            rc = (nvmlReturn_t)g.state->event_wait_error;
        if (rc != NVML_SUCCESS)
            return leave(rc);
        if (next_event(s, data))
            return leave(NVML_SUCCESS);
        leave(NVML_SUCCESS);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long waited_ms = (now.tv_sec - start.tv_sec) * 1000LL +
                              (now.tv_nsec - start.tv_nsec) / 1000000LL;
        if (waited_ms >= (long long)timeoutms)
            return NVML_ERROR_TIMEOUT;
        struct timespec poll = {.tv_sec = 0, .tv_nsec = FAKE_POLL_NS};
        nanosleep(&poll, NULL);
    }
}
#endif

#ifndef FAKE_OMIT_nvmlEventSetFree
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    nvmlReturn_t rc = enter_library();
    struct nvmlEventSet_st *s = rc == NVML_SUCCESS ? find_set(set) : NULL;
    if (rc == NVML_SUCCESS && !s)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        s->freed = true;
    return leave(rc);
}
#endif
