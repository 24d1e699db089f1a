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
 * Extending (GPM, MIG, events): add per-device fields to struct fake_device and to
 * device_fields[] (the file key is the field name), start every per-device entry point
 * with enter_device() so lost/unsupported/uninitialised checks stay uniform, and give
 * MIG instances their own records in a generation so handles keep working the same way.
 */
#define _GNU_SOURCE
#ifndef NVML_NO_UNVERSIONED_FUNC_DEFS
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* declare the _v1/_v2 prototypes we implement too */
#endif

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
    unsigned long long energy_mj;
    unsigned int temperature_c;
    unsigned int clock_mhz[NVML_CLOCK_COUNT], max_clock_mhz[NVML_CLOCK_COUNT];
    unsigned long long clock_event_reasons;
    unsigned int num_fans, fan_speed_percent;
    unsigned long long ecc_corrected_volatile, ecc_uncorrected_volatile;
    unsigned int pcie_replay_count;
    unsigned int performance_state;
    unsigned int lost;
    struct name_list not_supported; /* exported symbol names answering NOT_SUPPORTED */
    struct process_list processes, mps_processes;
    struct sample_list samples;
};

struct fake_state {
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    unsigned int cuda_version;
    unsigned int init_error; /* an nvmlReturn_t that nvmlInit* should fail with */
    struct fake_device *devices;
    size_t device_count, device_cap;
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
};

struct fake_generation {
    struct nvmlDevice_st *records;
    unsigned int count;
    struct fake_generation *older;
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
}

static void free_state(struct fake_state *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->device_count; i++)
        free_device(&s->devices[i]);
    free(s->devices);
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
    d->energy_mj = 35000000ULL;
    d->temperature_c = 32;
    d->clock_mhz[NVML_CLOCK_GRAPHICS] = 210;
    d->clock_mhz[NVML_CLOCK_SM] = 210;
    d->clock_mhz[NVML_CLOCK_MEM] = 1593;
    d->clock_mhz[NVML_CLOCK_VIDEO] = 795;
    d->max_clock_mhz[NVML_CLOCK_GRAPHICS] = 1410;
    d->max_clock_mhz[NVML_CLOCK_SM] = 1410;
    d->max_clock_mhz[NVML_CLOCK_MEM] = 1593;
    d->max_clock_mhz[NVML_CLOCK_VIDEO] = 1290;
    d->clock_event_reasons = 0x1; /* GpuIdle */
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
    DEV_U64("energy_mj", energy_mj),
    DEV_U32("temperature_c", temperature_c, UINT32_MAX),
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
    DEV_U32("pcie_replay_count", pcie_replay_count, UINT32_MAX),
    DEV_U32("performance_state", performance_state, NVML_PSTATE_UNKNOWN),
    DEV_U32("lost", lost, 1),
    {NULL, FIELD_U32, 0, 0, 0},
};

static const struct field state_fields[] = {
    {"driver_version", FIELD_STR, offsetof(struct fake_state, driver_version),
     sizeof(((struct fake_state *)0)->driver_version), 0},
    {"cuda_version", FIELD_U32, offsetof(struct fake_state, cuda_version), 0, INT32_MAX},
    {"init_error", FIELD_U32, offsetof(struct fake_state, init_error), 0, NVML_ERROR_UNKNOWN},
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
    return true;
}

/*
 * The state file format (one record per line, '#' comments and blank lines ignored):
 *
 *   fake_nvml_state 1                    first line, format version
 *   driver_version 550.54.15             system keys, see state_fields[]
 *   cuda_version 12040
 *   init_error 0
 *   device                               starts the next GPU (index = order in the file),
 *                                        pre-filled with the A100 defaults
 *   name NVIDIA A100-SXM4-80GB           device keys, see device_fields[]; strings run to
 *   ...                                  the end of the line
 *   not_supported nvmlDeviceGetFanSpeed_v2
 *   process PID USED_BYTES|na GI CI
 *   mps_process PID USED_BYTES|na GI CI
 *   sample PID TIMESTAMP_US SM MEM ENC DEC
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
    if (!gen || !(gen->records = calloc(count ? count : 1, sizeof(*gen->records)))) {
        free(gen);
        return false;
    }
    gen->count = (unsigned int)count;
    for (size_t i = 0; i < count; i++) {
        struct nvmlDevice_st *r = &gen->records[i];
        r->generation = gen;
        r->index = (unsigned int)i;
        r->lost = g.state->devices[i].lost;
        memcpy(r->uuid, g.state->devices[i].uuid, sizeof(r->uuid));
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
        free(g.generations);
        g.generations = older;
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
static struct nvmlDevice_st *find_record(nvmlDevice_t handle)
{
    uintptr_t p = (uintptr_t)handle;
    for (struct fake_generation *gen = g.generations; gen; gen = gen->older) {
        uintptr_t first = (uintptr_t)gen->records;
        uintptr_t end = first + gen->count * sizeof(*gen->records);
        if (p >= first && p < end && (p - first) % sizeof(*gen->records) == 0)
            return handle;
    }
    return NULL;
}

/*
 * Common checks of every per-device call, in the driver's order: initialised, valid
 * handle, GPU reachable, query supported.  `func` is the exported symbol (__func__),
 * matched against the device's not_supported names.
 */
static FAKE_MAYBE_UNUSED nvmlReturn_t enter_device(nvmlDevice_t handle, const char *func,
                                                   const struct fake_device **out)
{
    nvmlReturn_t rc = enter_library();
    if (rc != NVML_SUCCESS)
        return rc;
    struct nvmlDevice_st *rec = find_record(handle);
    if (!rec)
        return NVML_ERROR_INVALID_ARGUMENT;
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
    *out = d;
    return NVML_SUCCESS;
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
    nvmlReturn_t rc = enter_device(device, func, &d);
    if (rc == NVML_SUCCESS && !infoCount)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return leave(rc);
    const struct process_list *list = mps ? &d->mps_processes : &d->processes;
    unsigned int needed = (unsigned int)list->count;
    if (*infoCount < needed)
        rc = NVML_ERROR_INSUFFICIENT_SIZE;
    else if (needed && !infos)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (needed)
        memcpy(infos, list->items, needed * sizeof(*infos));
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
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS)
        rc = copy_out_string(d->name, name, length);
    return leave(rc);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetUUID
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    const struct fake_device *d;
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS)
        rc = copy_out_string(d->uuid, uuid, length);
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
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && !memory)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
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
    nvmlReturn_t rc = enter_device(device, __func__, &d);
    if (rc == NVML_SUCCESS && !memory)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (rc == NVML_SUCCESS && memory->version != nvmlMemory_v2)
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (rc == NVML_SUCCESS) {
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
    /* Aggregate counts equal the volatile ones: the fake "driver" never reloads. */
    if (rc == NVML_SUCCESS)
        *eccCounts = errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED ? d->ecc_corrected_volatile
                                                                   : d->ecc_uncorrected_volatile;
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
