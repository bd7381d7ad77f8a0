/*
 * fakenvml: a stand-in for libnvidia-ml.so.1 that the real pynvml can load.
 *
 * It exports exactly the NVML symbols the gpuhealth agent calls (through pynvml's ctypes
 * wrappers) and those NVIDIA's device plugin and GPU Feature Discovery call through go-nvml
 * (devkit/nvidia_plugins.py NVML_CALLS: handle by UUID, minor number, memory, compute capability,
 * the unversioned fabric info GFD's clique label reads, the PCIe topology and NVLink far ends of
 * the plugin's preferred allocation), and answers from a scenario file named by $FAKE_NVML_SCENARIO. Types, layouts and
 * prototypes are NVIDIA's own: devkit/fakenvml/build.py compiles this file against nvml.h
 * (from the nvidia-nvml-dev wheel) when it is installed, with NVML_NO_UNVERSIONED_FUNC_DEFS (so the
 * legacy unversioned names are declared too) and -Wmissing-prototypes -Werror, so every exported
 * function must match a prototype of NVIDIA's. Without the header it uses fakenvml_types.h, a
 * copy that tests/unit/agent/test_fakenvml_abi.py checks against the header. The file is re-read whenever it changes (path, inode, size or
 * mtime), so a test can rewrite it while the agent runs; write it atomically (tmp + rename).
 *
 * Scenario format: one directive per line, '#' starts a comment.
 *
 *   gpus <n>                         number of GPUs (default 8; lowering it "removes" GPUs:
 *                                    their handles then answer GPU_IS_LOST)
 *   driver <version>                 driver version string (default 550.90.07)
 *   cuda <int>                       CUDA driver version as NVML encodes it (default 12040)
 *   init_error <code>                nvmlInit fails with this NVML return code (e.g. 9)
 *   missing <symbol>                 that NVML function answers FUNCTION_NOT_FOUND
 *   block <symbol>                   that NVML function never returns while the line is there, as a
 *                                    call into a wedged GPU or driver does: the caller blocks (the
 *                                    library's lock released, so other calls still answer) until the
 *                                    scenario no longer names it, then the call goes on as usual.
 *                                    nvmlInit and nvmlInit_v2 are nvmlInitWithFlags here.
 *   gpu <i|*> <key> <value>          per-GPU value; keys: name uuid pci temp slowdown shutdown
 *                                    power_mw clock_reasons ecc_mode mig recovery_action lost
 *                                    ecc_volatile_uncorrected ecc_volatile_corrected
 *                                    ecc_aggregate_uncorrected ecc_aggregate_corrected
 *                                    retired_sbe retired_dbe retired_pending
 *                                    remap_corrected remap_uncorrected remap_pending remap_failure
 *                                    inforom_corrupt (1: nvmlDeviceValidateInforom answers
 *                                    NVML_ERROR_CORRUPTED_INFOROM; default 0, valid)
 *   gpu <i|*> <fabric key> <value>   the fabric between GPUs (defaults: an HGX H100 on NVSwitch):
 *                                    nvlinks (links that exist, default 18; 0: no NVLink)
 *                                    nvlink_inactive (bit mask of inactive links, default 0)
 *                                    nvlink_speed (MBps per link, field 164, default 26562)
 *                                    nvlink_version (field 166, default 6 = NVLink 4.0)
 *                                    nvlink_errors "<replay> <recovery> <crc_flit> <crc_data> <ecc>"
 *                                    (nvmlDeviceGetNvLinkErrorCounter, the same on every link)
 *                                    nvlink_recovery "<successful> <failed> <total>" (fields 213-215,
 *                                    Blackwell; unsupported until set, per link)
 *                                    nvlink_peers (bit mask of GPUs with NVLink P2P; default -1:
 *                                    every other GPU with NVLink, as through NVSwitches)
 *                                    fabric_state fabric_status fabric_clique fabric_mask
 *                                    fabric_summary fabric_cluster (a UUID) (nvmlDeviceGetGpuFabricInfoV;
 *                                    default state 0 = NOT_SUPPORTED)
 *                                    pcie_width pcie_max_width pcie_gen pcie_max_gen pcie_replays
 *                                    (defaults 16 16 5 5 0)
 *                                    throttle_ns "<sw_thermal> <hw_thermal> <hw_power_brake>"
 *                                    (accumulated ns, fields 269-271, default 0 0 0)
 *   gpu <i|*> notsupported <query>   that query answers NOT_SUPPORTED; queries: ecc ecc_mode mig
 *                                    retired_pages remapped_rows temperature thresholds
 *                                    clock_reasons power recovery_action events all
 *                                    nvlink nvlink_errors p2p fabric pcie throttle_ns inforom
 *                                    recovery_events unavailable_events (the GPU does not offer
 *                                    those event types, as drivers before NVML 13)
 *                                    (case, '_' and '-' are ignored)
 *   gpu <i|*> max_mig <n>            nvmlDeviceGetMaxMigDeviceCount (default 7, at most 16)
 *   gpu <i|*> mig_device <slot> <gi> <ci> <profile> [<uuid>]
 *                                    a MIG device at MIG index <slot> (nvmlDeviceGetMigDeviceHandleByIndex)
 *                                    with GPU/compute instance IDs <gi>/<ci>; its name is the GPU's
 *                                    name + " MIG " + <profile> (e.g. 3g.40gb), its UUID <uuid> or a
 *                                    deterministic "MIG-..."; "gpu <i> mig_device <slot> none" empties
 *                                    the slot. Listed only while "gpu <i> mig 1" (MIG mode enabled).
 *   xid <seq> gpu <i> code <n> [gi <g> ci <c>]
 *                                    an XID, delivered once through nvmlEventSetWait to each event
 *                                    set registered for XIDs on that GPU. <seq> identifies it, so
 *                                    the same code can be injected again with a new seq. gi/ci
 *                                    attribute it to a MIG instance (nvmlEventData_t's
 *                                    gpuInstanceId/computeInstanceId; 0xFFFFFFFF otherwise).
 *   event <seq> gpu <i> type <t>     another NVML event, delivered the same way (and sharing the
 *                                    XIDs' <seq> space) to sets registered for its type on that
 *                                    GPU. <t>: recovery_action (nvmlEventTypeGpuRecoveryAction;
 *                                    set the new value with "gpu <i> recovery_action <n>") or
 *                                    unavailable (nvmlEventTypeGpuUnavailableError), or a number.
 *
 * With $FAKE_NVML_EMIT_LOG set, each XID delivery appends a line "xid <seq> gpu <i> code <n> at
 * <unix-ns>" (other events: "event <seq> gpu <i> type <t> at <unix-ns>") to that file (the wall-clock instant the library hands the event to the caller), so
 * a benchmark can measure from the GPU event itself rather than from when a test wrote the file.
 *
 * As with the real driver, an XID only reaches event sets that were registered before it
 * happened: XID lines already in the file when a set registers for a GPU count as past (so a
 * restarted agent does not see old XIDs again). Inject XIDs after the agent is up; the agent
 * registers before its first report write.
 *
 * Numbers accept C syntax (0x48 is hex). The default is 8 healthy "NVIDIA H100 80GB HBM3".
 */
#include <ctype.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>

#ifdef FAKENVML_WITH_NVML_H
#include <nvml.h>
#else
#include "fakenvml_types.h"
#endif

#define EXPORT __attribute__((visibility("default")))

#define MAX_GPUS 64
#define MAX_XIDS 4096
#define MAX_MISSING 32
#define MAX_MIG 16
#define NO_INSTANCE 0xffffffffu

#define EVENT_SBE ((unsigned long long)nvmlEventTypeSingleBitEccError)
#define EVENT_DBE ((unsigned long long)nvmlEventTypeDoubleBitEccError)
#define EVENT_XID ((unsigned long long)nvmlEventTypeXidCriticalError)
#define EVENT_UNAVAILABLE ((unsigned long long)nvmlEventTypeGpuUnavailableError)
#define EVENT_RECOVERY ((unsigned long long)nvmlEventTypeGpuRecoveryAction)
#define EVENTS_ALL (EVENT_XID | EVENT_SBE | EVENT_DBE | EVENT_UNAVAILABLE | EVENT_RECOVERY)

enum {
    NS_ECC = 1u << 0,
    NS_ECC_MODE = 1u << 1,
    NS_MIG = 1u << 2,
    NS_RETIRED = 1u << 3,
    NS_REMAP = 1u << 4,
    NS_TEMP = 1u << 5,
    NS_THRESH = 1u << 6,
    NS_CLOCK = 1u << 7,
    NS_POWER = 1u << 8,
    NS_RECOVERY = 1u << 9,
    NS_EVENTS = 1u << 10,
    NS_EV_RECOVERY = 1u << 11,
    NS_EV_UNAVAILABLE = 1u << 12,
    NS_NVLINK = 1u << 13,
    NS_NVLINK_ERRORS = 1u << 14,
    NS_P2P = 1u << 15,
    NS_FABRIC = 1u << 16,
    NS_PCIE = 1u << 17,
    NS_THROTTLE_NS = 1u << 18,
    NS_INFOROM = 1u << 19,
};

#define MAX_LINKS 36 /* NVML_NVLINK_MAX_LINKS */
#define FABRIC_INFO_V3 ((unsigned int)(sizeof(nvmlGpuFabricInfo_v3_t) | (3U << 24U))) /* nvmlGpuFabricInfo_v3 */
#define FABRIC_INFO_V2 ((unsigned int)(sizeof(nvmlGpuFabricInfo_v2_t) | (2U << 24U))) /* nvmlGpuFabricInfo_v2 */

/* Handles are addresses in these arrays; NVML only declares the struct, so the fake defines it. */
struct nvmlDevice_st {
    char unused;
};

struct fake_mig {
    int present;
    unsigned int gi, ci;
    char profile[32];
    char uuid[96];
};

struct fake_gpu {
    char name[96];
    char uuid[96];
    char pci[32];
    unsigned int temp, slowdown, shutdown, power_mw;
    unsigned long long clock_reasons;
    unsigned int ecc_mode, mig_mode;
    unsigned long long ecc[2][2]; /* [corrected=0|uncorrected=1][volatile=0|aggregate=1] */
    unsigned int retired_sbe, retired_dbe, retired_pending;
    unsigned int remap_corrected, remap_uncorrected, remap_pending, remap_failure;
    unsigned int recovery_action;
    unsigned int inforom_corrupt;
    int lost;
    unsigned int notsupported;
    unsigned int max_mig;
    struct fake_mig mig[MAX_MIG];
    /* the fabric between GPUs */
    unsigned int nvlinks, nvlink_speed, nvlink_version;
    unsigned long long nvlink_inactive;
    unsigned long long nvlink_err[5];
    int nvlink_recovery_set;
    unsigned long long nvlink_recovery[3];
    long long nvlink_peers;
    unsigned int fabric_state, fabric_status, fabric_clique, fabric_mask, fabric_summary;
    unsigned char fabric_cluster[16];
    unsigned int pcie_width, pcie_max_width, pcie_gen, pcie_max_gen, pcie_replays;
    unsigned long long throttle_ns[3];
};

/* An XID or another event, in the order the scenario lists them. */
struct fake_xid {
    unsigned long long seq;
    int gpu;
    unsigned long long type; /* EVENT_XID, EVENT_RECOVERY, ... */
    unsigned long long code; /* the XID; 0 for other events (as NVML's eventData) */
    unsigned int gi, ci;     /* MIG attribution, NO_INSTANCE when none */
};

struct scenario {
    int gpus;
    char driver[80];
    int cuda;
    int init_error;
    char missing[MAX_MISSING][96];
    int n_missing;
    char blocked[MAX_MISSING][96];
    int n_blocked;
    struct fake_gpu gpu[MAX_GPUS];
    struct fake_xid xids[MAX_XIDS];
    int n_xids;
};

struct nvmlEventSet_st {
    unsigned long long magic;
    unsigned long long mask[MAX_GPUS];
    unsigned long long seen[MAX_XIDS]; /* XID seqs delivered to, or predating, this set */
    int n_seen;
};
#define EVENT_SET_MAGIC 0x66616b65766e7473ULL

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct scenario S;
static int init_count;
static struct nvmlDevice_st handles[MAX_GPUS]; /* a device handle is &handles[index] */
static struct nvmlDevice_st mig_handles[MAX_GPUS][MAX_MIG]; /* a MIG device's is &mig_handles[gpu][slot] */
static struct {
    int loaded;
    int exists;
    char path[4096];
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} file;

static const unsigned int PCI_BUS[8] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

static void set_defaults(struct scenario *s) {
    memset(s, 0, sizeof(*s));
    s->gpus = 8;
    snprintf(s->driver, sizeof(s->driver), "550.90.07");
    s->cuda = 12040;
    for (int i = 0; i < MAX_GPUS; i++) {
        struct fake_gpu *g = &s->gpu[i];
        unsigned int h = 2654435761u * (unsigned int)(i + 1);
        snprintf(g->name, sizeof(g->name), "NVIDIA H100 80GB HBM3");
        snprintf(g->uuid, sizeof(g->uuid), "GPU-%08x-fa4e-4a1b-9c2d-%012x", h, (unsigned int)(i + 1) * 0x1111u);
        snprintf(g->pci, sizeof(g->pci), "00000000:%02X:00.0", i < 8 ? PCI_BUS[i] : 0x40u + (unsigned int)i);
        g->temp = 35;
        g->slowdown = 87;
        g->shutdown = 92;
        g->power_mw = 120000;
        g->clock_reasons = 0x1; /* GPU idle */
        g->ecc_mode = 1;
        g->max_mig = 7;
        g->nvlinks = 18;
        g->nvlink_speed = 26562;
        g->nvlink_version = 6;
        g->nvlink_peers = -1;
        g->pcie_width = g->pcie_max_width = 16;
        g->pcie_gen = g->pcie_max_gen = 5;
    }
}

static void normalize(const char *in, char *out, size_t n) {
    size_t j = 0;
    for (size_t i = 0; in[i] && j + 1 < n; i++) {
        if (in[i] == '_' || in[i] == '-') continue;
        out[j++] = (char)tolower((unsigned char)in[i]);
    }
    out[j] = '\0';
}

static unsigned int notsupported_bit(const char *name) {
    static const struct {
        const char *name;
        unsigned int bit;
    } table[] = {
        {"ecc", NS_ECC},
        {"eccerrors", NS_ECC},
        {"eccmode", NS_ECC_MODE},
        {"mig", NS_MIG},
        {"migmode", NS_MIG},
        {"retiredpages", NS_RETIRED},
        {"remappedrows", NS_REMAP},
        {"temp", NS_TEMP},
        {"temperature", NS_TEMP},
        {"thresholds", NS_THRESH},
        {"temperaturethresholds", NS_THRESH},
        {"clockreasons", NS_CLOCK},
        {"clockeventreasons", NS_CLOCK},
        {"power", NS_POWER},
        {"powerw", NS_POWER},
        {"recoveryaction", NS_RECOVERY},
        {"events", NS_EVENTS},
        {"xidevents", NS_EVENTS},
        {"recoveryevents", NS_EV_RECOVERY},
        {"unavailableevents", NS_EV_UNAVAILABLE},
        {"nvlink", NS_NVLINK},
        {"nvlinkerrors", NS_NVLINK_ERRORS},
        {"p2p", NS_P2P},
        {"fabric", NS_FABRIC},
        {"pcie", NS_PCIE},
        {"throttlens", NS_THROTTLE_NS},
        {"inforom", NS_INFOROM},
        {"all", 0xffffffffu},
    };
    char key[64];
    normalize(name, key, sizeof(key));
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (strcmp(key, table[i].name) == 0) return table[i].bit;
    return 0;
}

static int set_gpu_value(struct fake_gpu *g, int index, const char *key, const char *val) {
    unsigned long long v = strtoull(val, NULL, 0);
    unsigned int u = (unsigned int)v;
    if (strcmp(key, "name") == 0) snprintf(g->name, sizeof(g->name), "%s", val);
    else if (strcmp(key, "uuid") == 0) snprintf(g->uuid, sizeof(g->uuid), "%s", val);
    else if (strcmp(key, "pci") == 0) snprintf(g->pci, sizeof(g->pci), "%s", val);
    else if (strcmp(key, "temp") == 0) g->temp = u;
    else if (strcmp(key, "slowdown") == 0) g->slowdown = u;
    else if (strcmp(key, "shutdown") == 0) g->shutdown = u;
    else if (strcmp(key, "power_mw") == 0) g->power_mw = u;
    else if (strcmp(key, "clock_reasons") == 0) g->clock_reasons = v;
    else if (strcmp(key, "ecc_mode") == 0) g->ecc_mode = u;
    else if (strcmp(key, "inforom_corrupt") == 0) g->inforom_corrupt = u;
    else if (strcmp(key, "mig") == 0) g->mig_mode = u;
    else if (strcmp(key, "max_mig") == 0) g->max_mig = u > MAX_MIG ? MAX_MIG : u;
    else if (strcmp(key, "mig_device") == 0) {
        int slot = -1;
        unsigned int gi = 0, ci = 0;
        char profile[32] = "", uuid[96] = "", none[8] = "";
        if (sscanf(val, "%d %7s", &slot, none) == 2 && strcmp(none, "none") == 0) {
            if (slot < 0 || slot >= MAX_MIG) return -1;
            memset(&g->mig[slot], 0, sizeof(g->mig[slot]));
            return 0;
        }
        int n = sscanf(val, "%d %u %u %31s %95s", &slot, &gi, &ci, profile, uuid);
        if (n < 4 || slot < 0 || slot >= MAX_MIG) return -1;
        struct fake_mig *m = &g->mig[slot];
        m->present = 1;
        m->gi = gi;
        m->ci = ci;
        snprintf(m->profile, sizeof(m->profile), "%s", profile);
        if (n == 5) snprintf(m->uuid, sizeof(m->uuid), "%s", uuid);
        else {
            unsigned int h = 2246822519u * (unsigned int)(index * MAX_MIG + slot + 1);
            snprintf(m->uuid, sizeof(m->uuid), "MIG-%08x-%04x-4%03x-8%03x-%012x", h, gi & 0xffffu, ci & 0xfffu,
                     (unsigned int)slot, (unsigned int)(index + 1) * 0x1111u);
        }
    }
    else if (strcmp(key, "recovery_action") == 0) g->recovery_action = u;
    else if (strcmp(key, "nvlinks") == 0) g->nvlinks = u > MAX_LINKS ? MAX_LINKS : u;
    else if (strcmp(key, "nvlink_inactive") == 0) g->nvlink_inactive = v;
    else if (strcmp(key, "nvlink_speed") == 0) g->nvlink_speed = u;
    else if (strcmp(key, "nvlink_version") == 0) g->nvlink_version = u;
    else if (strcmp(key, "nvlink_peers") == 0) g->nvlink_peers = strtoll(val, NULL, 0);
    else if (strcmp(key, "nvlink_errors") == 0) {
        unsigned long long e[5];
        if (sscanf(val, "%llu %llu %llu %llu %llu", &e[0], &e[1], &e[2], &e[3], &e[4]) != 5) return -1;
        memcpy(g->nvlink_err, e, sizeof(e));
    } else if (strcmp(key, "nvlink_recovery") == 0) {
        unsigned long long r[3];
        if (sscanf(val, "%llu %llu %llu", &r[0], &r[1], &r[2]) != 3) return -1;
        memcpy(g->nvlink_recovery, r, sizeof(r));
        g->nvlink_recovery_set = 1;
    } else if (strcmp(key, "throttle_ns") == 0) {
        unsigned long long t[3];
        if (sscanf(val, "%llu %llu %llu", &t[0], &t[1], &t[2]) != 3) return -1;
        memcpy(g->throttle_ns, t, sizeof(t));
    }
    else if (strcmp(key, "fabric_state") == 0) g->fabric_state = u;
    else if (strcmp(key, "fabric_status") == 0) g->fabric_status = u;
    else if (strcmp(key, "fabric_clique") == 0) g->fabric_clique = u;
    else if (strcmp(key, "fabric_mask") == 0) g->fabric_mask = u;
    else if (strcmp(key, "fabric_summary") == 0) g->fabric_summary = u;
    else if (strcmp(key, "fabric_cluster") == 0) {
        unsigned char b[16];
        int n = 0;
        for (const char *c = val; *c && n < 32; c++) {
            if (*c == '-') continue;
            if (!isxdigit((unsigned char)*c)) return -1;
            int d = isdigit((unsigned char)*c) ? *c - '0' : tolower((unsigned char)*c) - 'a' + 10;
            if (n % 2 == 0) b[n / 2] = (unsigned char)(d << 4);
            else b[n / 2] |= (unsigned char)d;
            n++;
        }
        if (n != 32) return -1;
        memcpy(g->fabric_cluster, b, sizeof(b));
    }
    else if (strcmp(key, "pcie_width") == 0) g->pcie_width = u;
    else if (strcmp(key, "pcie_max_width") == 0) g->pcie_max_width = u;
    else if (strcmp(key, "pcie_gen") == 0) g->pcie_gen = u;
    else if (strcmp(key, "pcie_max_gen") == 0) g->pcie_max_gen = u;
    else if (strcmp(key, "pcie_replays") == 0) g->pcie_replays = u;
    else if (strcmp(key, "lost") == 0) g->lost = u != 0;
    else if (strcmp(key, "ecc_volatile_corrected") == 0) g->ecc[0][0] = v;
    else if (strcmp(key, "ecc_aggregate_corrected") == 0) g->ecc[0][1] = v;
    else if (strcmp(key, "ecc_volatile_uncorrected") == 0) g->ecc[1][0] = v;
    else if (strcmp(key, "ecc_aggregate_uncorrected") == 0) g->ecc[1][1] = v;
    else if (strcmp(key, "retired_sbe") == 0) g->retired_sbe = u;
    else if (strcmp(key, "retired_dbe") == 0) g->retired_dbe = u;
    else if (strcmp(key, "retired_pending") == 0) g->retired_pending = u;
    else if (strcmp(key, "remap_corrected") == 0) g->remap_corrected = u;
    else if (strcmp(key, "remap_uncorrected") == 0) g->remap_uncorrected = u;
    else if (strcmp(key, "remap_pending") == 0) g->remap_pending = u;
    else if (strcmp(key, "remap_failure") == 0) g->remap_failure = u;
    else if (strcmp(key, "notsupported") == 0) {
        unsigned int bit = notsupported_bit(val);
        if (!bit) return -1;
        g->notsupported |= bit;
    } else return -1;
    return 0;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

/* Splits off the first whitespace-delimited token of *rest. */
static char *token(char **rest) {
    char *s = *rest;
    while (isspace((unsigned char)*s)) s++;
    if (!*s) return NULL;
    char *t = s;
    while (*s && !isspace((unsigned char)*s)) s++;
    if (*s) *s++ = '\0';
    *rest = s;
    return t;
}

static void parse_line(struct scenario *s, char *line, const char *path, int lineno) {
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *rest = line;
    char *verb = token(&rest);
    if (!verb) return;
    int ok = 1;
    if (strcmp(verb, "gpus") == 0) {
        char *n = token(&rest);
        if (n) {
            int v = atoi(n);
            s->gpus = v < 0 ? 0 : (v > MAX_GPUS ? MAX_GPUS : v);
        } else ok = 0;
    } else if (strcmp(verb, "driver") == 0) {
        snprintf(s->driver, sizeof(s->driver), "%s", trim(rest));
    } else if (strcmp(verb, "cuda") == 0) {
        char *n = token(&rest);
        if (n) s->cuda = (int)strtol(n, NULL, 0); else ok = 0;
    } else if (strcmp(verb, "init_error") == 0) {
        char *n = token(&rest);
        if (n) s->init_error = (int)strtol(n, NULL, 0); else ok = 0;
    } else if (strcmp(verb, "missing") == 0) {
        char *n = token(&rest);
        if (n && s->n_missing < MAX_MISSING)
            snprintf(s->missing[s->n_missing++], sizeof(s->missing[0]), "%s", n);
        else ok = 0;
    } else if (strcmp(verb, "block") == 0) {
        char *n = token(&rest);
        if (n && s->n_blocked < MAX_MISSING)
            snprintf(s->blocked[s->n_blocked++], sizeof(s->blocked[0]), "%s", n);
        else ok = 0;
    } else if (strcmp(verb, "gpu") == 0) {
        char *sel = token(&rest);
        char *key = token(&rest);
        char *val = trim(rest);
        if (!sel || !key || !*val) ok = 0;
        else if (strcmp(sel, "*") == 0) {
            for (int i = 0; i < MAX_GPUS && ok; i++) ok = set_gpu_value(&s->gpu[i], i, key, val) == 0;
        } else {
            int i = atoi(sel);
            ok = i >= 0 && i < MAX_GPUS && set_gpu_value(&s->gpu[i], i, key, val) == 0;
        }
    } else if (strcmp(verb, "xid") == 0) {
        char *seq = token(&rest), *kg = token(&rest), *gpu = token(&rest), *kc = token(&rest),
             *code = token(&rest);
        unsigned int gi = NO_INSTANCE, ci = NO_INSTANCE;
        for (char *k = token(&rest), *v = k ? token(&rest) : NULL; k; k = token(&rest), v = k ? token(&rest) : NULL) {
            if (v && strcmp(k, "gi") == 0) gi = (unsigned int)strtoul(v, NULL, 0);
            else if (v && strcmp(k, "ci") == 0) ci = (unsigned int)strtoul(v, NULL, 0);
            else ok = 0;
        }
        if (ok && seq && kg && gpu && kc && code && strcmp(kg, "gpu") == 0 && strcmp(kc, "code") == 0 &&
            s->n_xids < MAX_XIDS) {
            struct fake_xid *x = &s->xids[s->n_xids++];
            x->seq = strtoull(seq, NULL, 0);
            x->gpu = atoi(gpu);
            x->type = EVENT_XID;
            x->code = strtoull(code, NULL, 0);
            x->gi = gi;
            x->ci = ci;
        } else ok = 0;
    } else if (strcmp(verb, "event") == 0) {
        char *seq = token(&rest), *kg = token(&rest), *gpu = token(&rest), *kt = token(&rest),
             *type = token(&rest);
        unsigned long long t = 0;
        if (type && strcmp(type, "recovery_action") == 0) t = EVENT_RECOVERY;
        else if (type && strcmp(type, "unavailable") == 0) t = EVENT_UNAVAILABLE;
        else if (type) t = strtoull(type, NULL, 0);
        if (seq && kg && gpu && kt && t && strcmp(kg, "gpu") == 0 && strcmp(kt, "type") == 0 &&
            s->n_xids < MAX_XIDS) {
            struct fake_xid *x = &s->xids[s->n_xids++];
            x->seq = strtoull(seq, NULL, 0);
            x->gpu = atoi(gpu);
            x->type = t;
            x->code = 0;
            x->gi = x->ci = NO_INSTANCE;
        } else ok = 0;
    } else ok = 0;
    if (!ok) fprintf(stderr, "fakenvml: %s:%d: ignoring unparsable line\n", path, lineno);
}

/* Re-reads the scenario when its path or file identity changed. Caller holds mu. */
static void refresh_locked(void) {
    const char *path = getenv("FAKE_NVML_SCENARIO");
    if (!path) path = "";
    struct stat st;
    int exists = path[0] && stat(path, &st) == 0;
    int path_changed = strcmp(path, file.path) != 0;
    if (file.loaded && !path_changed) {
        if (!exists && !file.exists) return;
        if (exists && file.exists && st.st_dev == file.dev && st.st_ino == file.ino &&
            st.st_size == file.size && st.st_mtim.tv_sec == file.mtime.tv_sec &&
            st.st_mtim.tv_nsec == file.mtime.tv_nsec)
            return;
    }
    if (path_changed) snprintf(file.path, sizeof(file.path), "%s", path);
    set_defaults(&S);
    file.loaded = 1;
    file.exists = exists;
    if (!exists) return;
    file.dev = st.st_dev;
    file.ino = st.st_ino;
    file.size = st.st_size;
    file.mtime = st.st_mtim;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0;
    while (getline(&line, &cap, f) >= 0) parse_line(&S, line, path, ++lineno);
    free(line);
    fclose(f);
}

static int is_missing(const char *fn) {
    for (int i = 0; i < S.n_missing; i++)
        if (strcmp(S.missing[i], fn) == 0) return 1;
    return 0;
}

static int is_blocked(const char *fn) {
    for (int i = 0; i < S.n_blocked; i++)
        if (strcmp(S.blocked[i], fn) == 0) return 1;
    return 0;
}

/* A blocked function waits, without the lock, until the scenario stops naming it. Caller holds mu. */
static void wait_while_blocked_locked(const char *fn) {
    while (is_blocked(fn)) {
        pthread_mutex_unlock(&mu);
        struct timespec pause = {0, 20 * 1000 * 1000};
        nanosleep(&pause, NULL);
        pthread_mutex_lock(&mu);
        refresh_locked();
    }
}

#define ENTER()                                                                    \
    pthread_mutex_lock(&mu);                                                       \
    refresh_locked();                                                              \
    wait_while_blocked_locked(__func__);                                           \
    if (is_missing(__func__)) {                                                    \
        pthread_mutex_unlock(&mu);                                                 \
        return NVML_ERROR_FUNCTION_NOT_FOUND;                                      \
    }
#define LEAVE(rc)                                                                  \
    do {                                                                           \
        nvmlReturn_t rc_ = (rc);                                                   \
        pthread_mutex_unlock(&mu);                                                 \
        return rc_;                                                                \
    } while (0)

/* Resolves a handle to its GPU, applying lost / removed / not-supported rules. */
static nvmlReturn_t gpu_of(nvmlDevice_t handle, unsigned int ns_bit, struct fake_gpu **out) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (!handle) return NVML_ERROR_INVALID_ARGUMENT;
    if (handle < handles || handle >= handles + MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    ptrdiff_t i = handle - handles;
    if (i < 0 || i >= MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    if (i >= S.gpus || S.gpu[i].lost) return NVML_ERROR_GPU_IS_LOST;
    if (S.gpu[i].notsupported & ns_bit) return NVML_ERROR_NOT_SUPPORTED;
    *out = &S.gpu[i];
    return NVML_SUCCESS;
}

#define DEVICE(handle, bit)                                                        \
    struct fake_gpu *g = NULL;                                                     \
    {                                                                              \
        nvmlReturn_t r_ = gpu_of((handle), (bit), &g);                             \
        if (r_ != NVML_SUCCESS) LEAVE(r_);                                         \
    }

static nvmlReturn_t copy_string(char *dst, unsigned int len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---- library lifecycle ------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    ENTER();
    if (S.init_error) LEAVE(S.init_error);
    init_count++;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    ENTER();
    if (!init_count) LEAVE(NVML_ERROR_UNINITIALIZED);
    init_count--;
    LEAVE(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch ((int)result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
    }
}

/* ---- system queries ---------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER();
    if (!init_count) LEAVE(NVML_ERROR_UNINITIALIZED);
    LEAVE(copy_string(version, length, S.driver));
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    ENTER();
    if (!version) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *version = S.cuda;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    ENTER();
    if (!version) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *version = S.cuda;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    ENTER();
    if (!init_count) LEAVE(NVML_ERROR_UNINITIALIZED);
    if (!count) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned int)S.gpus;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    ENTER();
    if (!init_count) LEAVE(NVML_ERROR_UNINITIALIZED);
    if (!device || index >= MAX_GPUS || (int)index >= S.gpus) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *device = &handles[index];
    if (S.gpu[index].lost) LEAVE(NVML_ERROR_GPU_IS_LOST);
    LEAVE(NVML_SUCCESS);
}

/* ---- identity ------------------------------------------------------------------------ */

/* Resolves a MIG device handle: its parent GPU (lost rules as gpu_of) and its slot. */
static nvmlReturn_t mig_of(nvmlDevice_t handle, struct fake_gpu **gpu, struct fake_mig **mig) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    struct nvmlDevice_st *first = &mig_handles[0][0];
    if (!handle || handle < first || handle >= first + MAX_GPUS * MAX_MIG) return NVML_ERROR_INVALID_ARGUMENT;
    ptrdiff_t at = handle - first;
    int i = (int)(at / MAX_MIG), slot = (int)(at % MAX_MIG);
    if (i >= S.gpus || S.gpu[i].lost) return NVML_ERROR_GPU_IS_LOST;
    if (!S.gpu[i].mig_mode || !S.gpu[i].mig[slot].present) return NVML_ERROR_INVALID_ARGUMENT; /* destroyed */
    *gpu = &S.gpu[i];
    *mig = &S.gpu[i].mig[slot];
    return NVML_SUCCESS;
}

static int is_mig_handle(nvmlDevice_t handle) {
    struct nvmlDevice_st *first = &mig_handles[0][0];
    return handle >= first && handle < first + MAX_GPUS * MAX_MIG;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    ENTER();
    if (is_mig_handle(device)) {
        struct fake_gpu *parent = NULL;
        struct fake_mig *m = NULL;
        nvmlReturn_t r = mig_of(device, &parent, &m);
        if (r != NVML_SUCCESS) LEAVE(r);
        char full[160];
        snprintf(full, sizeof(full), "%s MIG %s", parent->name, m->profile);
        LEAVE(copy_string(name, length, full));
    }
    DEVICE(device, 0);
    LEAVE(copy_string(name, length, g->name));
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    ENTER();
    if (is_mig_handle(device)) {
        struct fake_gpu *parent = NULL;
        struct fake_mig *m = NULL;
        nvmlReturn_t r = mig_of(device, &parent, &m);
        if (r != NVML_SUCCESS) LEAVE(r);
        LEAVE(copy_string(uuid, length, m->uuid));
    }
    DEVICE(device, 0);
    LEAVE(copy_string(uuid, length, g->uuid));
}

/* ---- MIG ------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    ENTER();
    DEVICE(device, NS_MIG);
    if (!count) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *count = g->max_mig;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice) {
    ENTER();
    DEVICE(device, NS_MIG);
    if (!migDevice || index >= g->max_mig) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    /* A MIG-capable GPU with MIG mode off has no MIG device at any index (the driver answers NOT_FOUND,
     * which go-nvlib and NVIDIA's device plugin with MIG_STRATEGY=single rely on); a GPU without MIG
     * ("notsupported mig") answered NOT_SUPPORTED above. */
    if (!g->mig_mode || !g->mig[index].present) LEAVE(NVML_ERROR_NOT_FOUND);
    *migDevice = &mig_handles[device - handles][index];
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    ENTER();
    struct fake_gpu *parent = NULL;
    struct fake_mig *m = NULL;
    nvmlReturn_t r = mig_of(device, &parent, &m);
    if (r != NVML_SUCCESS) LEAVE(r);
    if (!id) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *id = m->gi;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    ENTER();
    struct fake_gpu *parent = NULL;
    struct fake_mig *m = NULL;
    nvmlReturn_t r = mig_of(device, &parent, &m);
    if (r != NVML_SUCCESS) LEAVE(r);
    if (!id) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *id = m->ci;
    LEAVE(NVML_SUCCESS);
}

static nvmlReturn_t fill_pci(struct fake_gpu *g, nvmlPciInfo_t *pci) {
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
    sscanf(g->pci, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x233010deu; /* H100 SXM5 */
    pci->pciSubSystemId = 0x16c110deu;
    snprintf(pci->busId, sizeof(pci->busId), "%s", g->pci);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X", domain & 0xffffu, bus, dev, fn);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    ENTER();
    DEVICE(device, 0);
    LEAVE(fill_pci(g, pci));
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    ENTER();
    DEVICE(device, 0);
    LEAVE(fill_pci(g, pci));
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    ENTER();
    DEVICE(device, NS_MIG);
    if (!current || !pending) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *current = g->mig_mode;
    *pending = g->mig_mode;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending) {
    ENTER();
    DEVICE(device, NS_ECC_MODE);
    if (!current || !pending) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *current = g->ecc_mode ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    *pending = *current;
    LEAVE(NVML_SUCCESS);
}

/* ---- what NVIDIA's device plugin and GPU Feature Discovery read ------------------------ */

/* An H100 80GB HBM3 as its driver reports it: 81559 MiB, compute capability 9.0. */
#define FAKE_MEMORY_TOTAL (81559ULL * 1024ULL * 1024ULL)
#define FAKE_MEMORY_RESERVED (531ULL * 1024ULL * 1024ULL)

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    ENTER();
    if (!init_count) LEAVE(NVML_ERROR_UNINITIALIZED);
    if (!uuid || !device) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < S.gpus && i < MAX_GPUS; i++) {
        if (strcmp(S.gpu[i].uuid, uuid) != 0) continue;
        if (S.gpu[i].lost) LEAVE(NVML_ERROR_GPU_IS_LOST);
        *device = &handles[i];
        LEAVE(NVML_SUCCESS);
    }
    LEAVE(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    ENTER();
    DEVICE(device, 0);
    if (!minorNumber) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *minorNumber = (unsigned int)(device - handles); /* /dev/nvidia<index> */
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    ENTER();
    DEVICE(device, 0);
    if (!memory) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    memory->total = FAKE_MEMORY_TOTAL;
    memory->used = FAKE_MEMORY_RESERVED;
    memory->free = FAKE_MEMORY_TOTAL - FAKE_MEMORY_RESERVED;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    ENTER();
    DEVICE(device, 0);
    if (!major || !minor) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *major = 9;
    *minor = 0;
    LEAVE(NVML_SUCCESS);
}

/* The unversioned fabric query (deprecated in NVML 13, still exported): the v1 fields of the same state. */
EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo) {
    ENTER();
    DEVICE(device, NS_FABRIC);
    if (!gpuFabricInfo) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    memcpy(gpuFabricInfo->clusterUuid, g->fabric_cluster, sizeof(g->fabric_cluster));
    gpuFabricInfo->status = (nvmlReturn_t)g->fabric_status;
    gpuFabricInfo->cliqueId = g->fabric_clique;
    gpuFabricInfo->state = (nvmlGpuFabricState_t)g->fabric_state;
    LEAVE(NVML_SUCCESS);
}

/* ---- health counters ----------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                nvmlEccCounterType_t counterType, unsigned long long *count) {
    ENTER();
    DEVICE(device, NS_ECC);
    if (!count || errorType > 1 || counterType > 1) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->ecc_mode) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *count = g->ecc[errorType][counterType];
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause, unsigned int *pageCount,
                                              unsigned long long *addresses) {
    ENTER();
    DEVICE(device, NS_RETIRED);
    if (!pageCount || cause > 1) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = cause == 0 ? g->retired_sbe : g->retired_dbe;
    if (!addresses || *pageCount < n) {
        *pageCount = n;
        LEAVE(n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS);
    }
    for (unsigned int i = 0; i < n; i++) addresses[i] = ((unsigned long long)cause << 40) | (0x1000ULL * (i + 1));
    *pageCount = n;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending) {
    ENTER();
    DEVICE(device, NS_RETIRED);
    if (!isPending) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *isPending = g->retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                              unsigned int *isPending, unsigned int *failureOccurred) {
    ENTER();
    DEVICE(device, NS_REMAP);
    if (!corrRows || !uncRows || !isPending || !failureOccurred) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *corrRows = g->remap_corrected;
    *uncRows = g->remap_uncorrected;
    *isPending = g->remap_pending ? 1 : 0;
    *failureOccurred = g->remap_failure ? 1 : 0;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceValidateInforom(nvmlDevice_t device) {
    ENTER();
    DEVICE(device, NS_INFOROM);
    LEAVE(g->inforom_corrupt ? NVML_ERROR_CORRUPTED_INFOROM : NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor, unsigned int *temp) {
    ENTER();
    DEVICE(device, NS_TEMP);
    if (!temp || sensor != 0) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *temp = g->temp;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t threshold,
                                                      unsigned int *temp) {
    ENTER();
    DEVICE(device, NS_THRESH);
    if (!temp) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (threshold == NVML_TEMPERATURE_THRESHOLD_SHUTDOWN) *temp = g->shutdown;
    else if (threshold == NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) *temp = g->slowdown;
    else LEAVE(NVML_ERROR_NOT_SUPPORTED);
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    ENTER();
    DEVICE(device, NS_CLOCK);
    if (!reasons) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = g->clock_reasons;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    ENTER();
    DEVICE(device, NS_CLOCK);
    if (!reasons) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = g->clock_reasons;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    ENTER();
    DEVICE(device, NS_POWER);
    if (!power) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *power = g->power_mw;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    ENTER();
    DEVICE(device, 0);
    if (valuesCount < 0 || (valuesCount > 0 && !values)) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    struct timeval tv;
    gettimeofday(&tv, NULL);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)tv.tv_sec * 1000000LL + tv.tv_usec;
        v->latencyUsec = 0;
        v->nvmlReturn = NVML_SUCCESS;
        v->value.ullVal = 0;
        int link_ok = g->nvlinks > 0 && !(g->notsupported & NS_NVLINK) && v->scopeId < g->nvlinks;
        if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION && !(g->notsupported & NS_RECOVERY)) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = g->recovery_action;
        } else if (v->fieldId == NVML_FI_DEV_NVLINK_GET_SPEED && link_ok) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = (g->nvlink_inactive >> v->scopeId) & 1 ? 0 : g->nvlink_speed;
        } else if (v->fieldId == NVML_FI_DEV_NVLINK_GET_VERSION && link_ok) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = g->nvlink_version;
        } else if (v->fieldId >= NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS &&
                   v->fieldId <= NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS && link_ok && g->nvlink_recovery_set) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            v->value.ullVal = g->nvlink_recovery[v->fieldId - NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS];
        } else if (v->fieldId >= NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN &&
                   v->fieldId <= NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN &&
                   !(g->notsupported & NS_THROTTLE_NS)) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            v->value.ullVal = g->throttle_ns[v->fieldId - NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN];
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    LEAVE(NVML_SUCCESS);
}

/* ---- the fabric between GPUs --------------------------------------------------------- */

/* A link of a GPU with NVLink: INVALID_ARGUMENT past the links it has (as NVML, for a link id it lacks). */
#define LINK(g, link)                                                                       \
    do {                                                                                    \
        if ((g)->nvlinks == 0) LEAVE(NVML_ERROR_NOT_SUPPORTED);                             \
        if ((link) >= MAX_LINKS) LEAVE(NVML_ERROR_INVALID_ARGUMENT);                        \
    } while (0)

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    ENTER();
    DEVICE(device, NS_NVLINK);
    LINK(g, link);
    if (!isActive) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (link >= g->nvlinks) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *isActive = (g->nvlink_inactive >> link) & 1 ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                                  nvmlNvLinkCapability_t capability, unsigned int *capResult) {
    ENTER();
    DEVICE(device, NS_NVLINK);
    LINK(g, link);
    if (!capResult || capability >= NVML_NVLINK_CAP_COUNT) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    /* NVML_NVLINK_CAP_VALID: the link exists; the others are true of every link the fake has. */
    *capResult = link < g->nvlinks ? 1u : 0u;
    LEAVE(NVML_SUCCESS);
}

/* What each link reaches: the fake is an HGX board, every link to its NVSwitches. */
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                        nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType) {
    ENTER();
    DEVICE(device, NS_NVLINK);
    LINK(g, link);
    if (!pNvLinkDeviceType || link >= g->nvlinks) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *pNvLinkDeviceType = NVML_NVLINK_DEVICE_TYPE_SWITCH;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                    nvmlNvLinkErrorCounter_t counter, unsigned long long *counterValue) {
    ENTER();
    DEVICE(device, NS_NVLINK);
    LINK(g, link);
    if (g->notsupported & NS_NVLINK_ERRORS) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    if (!counterValue || counter >= NVML_NVLINK_ERROR_COUNT || link >= g->nvlinks) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *counterValue = g->nvlink_err[counter];
    LEAVE(NVML_SUCCESS);
}

static int nvlink_up(const struct fake_gpu *g) {
    if (g->nvlinks == 0 || (g->notsupported & NS_NVLINK)) return 0;
    unsigned long long all = g->nvlinks >= 64 ? ~0ULL : (1ULL << g->nvlinks) - 1;
    return (g->nvlink_inactive & all) != all;
}

EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, nvmlGpuP2PCapsIndex_t p2pIndex,
                                           nvmlGpuP2PStatus_t *p2pStatus) {
    ENTER();
    DEVICE(device1, NS_P2P);
    struct fake_gpu *a = g;
    struct fake_gpu *b = NULL;
    {
        nvmlReturn_t r = gpu_of(device2, NS_P2P, &b);
        if (r != NVML_SUCCESS) LEAVE(r);
    }
    if (!p2pStatus || p2pIndex >= NVML_P2P_CAPS_INDEX_UNKNOWN) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (p2pIndex != NVML_P2P_CAPS_INDEX_NVLINK) {
        *p2pStatus = NVML_P2P_STATUS_OK; /* PCIe P2P: the fake's GPUs share a switch */
        LEAVE(NVML_SUCCESS);
    }
    int ia = (int)(device1 - handles), ib = (int)(device2 - handles);
    int listed = a->nvlink_peers < 0 || (ib < 64 && ((unsigned long long)a->nvlink_peers >> ib) & 1);
    int back = b->nvlink_peers < 0 || (ia < 64 && ((unsigned long long)b->nvlink_peers >> ia) & 1);
    *p2pStatus = ia != ib && listed && back && nvlink_up(a) && nvlink_up(b) ? NVML_P2P_STATUS_OK
                                                                            : NVML_P2P_STATUS_NOT_SUPPORTED;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo) {
    ENTER();
    DEVICE(device, NS_FABRIC);
    if (!gpuFabricInfo) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    /* v2 (go-nvml's GetGpuFabricInfoV().V2()) is v3 without healthSummary: the same leading layout. */
    int v3 = gpuFabricInfo->version == FABRIC_INFO_V3;
    if (!v3 && gpuFabricInfo->version != FABRIC_INFO_V2) LEAVE(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    memcpy(gpuFabricInfo->clusterUuid, g->fabric_cluster, sizeof(g->fabric_cluster));
    gpuFabricInfo->status = (nvmlReturn_t)g->fabric_status;
    gpuFabricInfo->cliqueId = g->fabric_clique;
    gpuFabricInfo->state = (nvmlGpuFabricState_t)g->fabric_state;
    gpuFabricInfo->healthMask = g->fabric_mask;
    if (v3) gpuFabricInfo->healthSummary = (unsigned char)g->fabric_summary;
    LEAVE(NVML_SUCCESS);
}

/* The PCIe path between two GPUs: an HGX board's two halves hang off one CPU socket each (GPUs 0-3 and
 * 4-7), each GPU behind a PCIe switch of its own (go-gpuallocator's P2P links, the plugin's preferred
 * allocation). */
EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                        nvmlGpuTopologyLevel_t *pathInfo) {
    ENTER();
    DEVICE(device1, 0);
    (void)g;
    struct fake_gpu *other = NULL;
    {
        nvmlReturn_t r = gpu_of(device2, 0, &other);
        if (r != NVML_SUCCESS) LEAVE(r);
    }
    if (!pathInfo) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    int a = (int)(device1 - handles), b = (int)(device2 - handles);
    *pathInfo = a == b ? NVML_TOPOLOGY_INTERNAL : (a / 4 == b / 4 ? NVML_TOPOLOGY_NODE : NVML_TOPOLOGY_SYSTEM);
    LEAVE(NVML_SUCCESS);
}

/* The far end of an active NVLink: on the fake's NVSwitch board, one of four NVSwitches (as on an HGX
 * H100), never another GPU; INVALID_ARGUMENT past the links the GPU has, as nvmlDeviceGetNvLinkState. */
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    ENTER();
    DEVICE(device, NS_NVLINK);
    LINK(g, link);
    if (!pci || link >= g->nvlinks) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof(*pci));
    pci->bus = 0x05u + link % 4u;
    pci->pciDeviceId = 0x22a310deu; /* NVSwitch (third generation) */
    snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", pci->bus);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", pci->bus);
    LEAVE(NVML_SUCCESS);
}

#define PCIE_QUERY(fn, member)                                                              \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, unsigned int *value) {                      \
        ENTER();                                                                            \
        DEVICE(device, NS_PCIE);                                                            \
        if (!value) LEAVE(NVML_ERROR_INVALID_ARGUMENT);                                     \
        *value = g->member;                                                                 \
        LEAVE(NVML_SUCCESS);                                                                \
    }

PCIE_QUERY(nvmlDeviceGetCurrPcieLinkWidth, pcie_width)
PCIE_QUERY(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width)
PCIE_QUERY(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen)
PCIE_QUERY(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen)
PCIE_QUERY(nvmlDeviceGetPcieReplayCounter, pcie_replays)

/* ---- events -------------------------------------------------------------------------- */

static int was_seen(const struct nvmlEventSet_st *set, unsigned long long seq) {
    for (int i = 0; i < set->n_seen; i++)
        if (set->seen[i] == seq) return 1;
    return 0;
}

static void mark_seen(struct nvmlEventSet_st *set, unsigned long long seq) {
    if (!was_seen(set, seq) && set->n_seen < MAX_XIDS) set->seen[set->n_seen++] = seq;
}

/* The event types a GPU offers (nvmlDeviceGetSupportedEventTypes), less what the scenario withholds. */
static unsigned long long offered_events(const struct fake_gpu *g) {
    if (g->notsupported & NS_EVENTS) return 0;
    unsigned long long types = EVENTS_ALL;
    if (g->notsupported & NS_EV_RECOVERY) types &= ~EVENT_RECOVERY;
    if (g->notsupported & NS_EV_UNAVAILABLE) types &= ~EVENT_UNAVAILABLE;
    return types;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    ENTER();
    if (!init_count) LEAVE(NVML_ERROR_UNINITIALIZED);
    if (!set) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    struct nvmlEventSet_st *s = calloc(1, sizeof(*s));
    if (!s) LEAVE(NVML_ERROR_UNKNOWN);
    s->magic = EVENT_SET_MAGIC;
    *set = s;
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    ENTER();
    if (!set || set->magic != EVENT_SET_MAGIC) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    set->magic = 0;
    free(set);
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    ENTER();
    DEVICE(device, 0);
    if (!eventTypes) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *eventTypes = offered_events(g);
    LEAVE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                             nvmlEventSet_t set) {
    ENTER();
    DEVICE(device, NS_EVENTS);
    if (!set || set->magic != EVENT_SET_MAGIC) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~offered_events(g)) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    int index = (int)(device - handles);
    unsigned long long added = eventTypes & ~set->mask[index];
    /* Events that happened before registration are never delivered to this set. */
    for (int i = 0; i < S.n_xids; i++)
        if (S.xids[i].gpu == index && (S.xids[i].type & added)) mark_seen(set, S.xids[i].seq);
    set->mask[index] |= eventTypes;
    LEAVE(NVML_SUCCESS);
}

/* Append the delivery of an XID, with the wall-clock instant, to $FAKE_NVML_EMIT_LOG (if set). */
static void log_emit(const struct fake_xid *x) {
    const char *path = getenv("FAKE_NVML_EMIT_LOG");
    if (!path || !*path) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    FILE *f = fopen(path, "a");
    if (!f) return;
    long long ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    if (x->type == EVENT_XID) fprintf(f, "xid %llu gpu %d code %llu at %lld\n", x->seq, x->gpu, x->code, ns);
    else fprintf(f, "event %llu gpu %d type 0x%llx at %lld\n", x->seq, x->gpu, x->type, ns);
    fclose(f);
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        ENTER();
        if (!init_count) LEAVE(NVML_ERROR_UNINITIALIZED);
        if (!set || set->magic != EVENT_SET_MAGIC || !data) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
        for (int i = 0; i < S.n_xids; i++) {
            struct fake_xid *x = &S.xids[i];
            if (x->gpu < 0 || x->gpu >= MAX_GPUS || !(set->mask[x->gpu] & x->type)) continue;
            if (was_seen(set, x->seq)) continue;
            mark_seen(set, x->seq);
            memset(data, 0, sizeof(*data));
            data->device = &handles[x->gpu];
            data->eventType = x->type;
            data->eventData = x->code;
            data->gpuInstanceId = x->gi;
            data->computeInstanceId = x->ci;
            log_emit(x);
            LEAVE(NVML_SUCCESS);
        }
        pthread_mutex_unlock(&mu);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long elapsed_ms =
            (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000LL;
        if (elapsed_ms >= (long long)timeoutms) return NVML_ERROR_TIMEOUT;
        long long left = (long long)timeoutms - elapsed_ms;
        struct timespec nap = {0, (left < 5 ? left : 5) * 1000000L};
        nanosleep(&nap, NULL);
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
