/*
 * iscsi-load: the load generator of sliver's benchmark driver (bench/side-by-side).
 *
 * An independent iSCSI client: it speaks to any target through libiscsi (the library behind
 * iscsi-perf and QEMU's iscsi driver) and shares no code with sliver. It exists because the
 * stock clients cannot express part of the benchmark: qemu-img bench only does strided offsets
 * with a constant data pattern, iscsi-perf only reads, and neither reports latency percentiles.
 *
 *   iscsi-load -u URL -o read|write|caw|unmap [-p seq|rand] [-q DEPTH] [-s BYTES]
 *              [-n COUNT] [-t SECONDS] [-O OFFSET] [-L LENGTH] [-d unique|mix|zero|sparse]
 *              [-S SEED] [-V] [-R READBACK] [-F]
 *
 * Data: every 4 KiB unit written is a pure function of (seed, byte offset, key), so reads can
 * be checked. `unique` is incompressible and never repeats (a window of a 16 MiB random pool
 * stamped with a 16-byte hash of seed, offset and key); `mix` is 30 % exact duplicates of 256
 * recurring blocks and 70 % blocks whose first half is unique and second half a repeated
 * 64-byte phrase (about 2:1 with LZ4); `zero` is zeros; `sparse` is unique but highly
 * compressible: the same 16-byte stamp as `unique` (hash, offset), then zeros, so every unit
 * is distinct while a compressing target stores a few dozen bytes of it (bench/scale: the
 * metadata grows like unique data while the disk holds little).
 * A sequential write uses key 0, so a later read with the same seed and -V checks every byte;
 * a random write uses a fresh key per command and, with -R N, reads back up to N of the
 * commands it completed and checks them. COMPARE AND WRITE runs at depth 1 on one block at
 * OFFSET: it reads the block once, then swaps it for new content again and again, each
 * command comparing against what the previous one wrote.
 *
 * -F sends one SYNCHRONIZE CACHE for the whole LUN after the timed run and reports how long
 * it took ("flush_seconds") and the rate counting it ("durable_iops"): a target that answers
 * writes from its page cache makes them durable only then, so a run without it compares
 * durable writes against writes that have not reached the disk.
 *
 * Prints one JSON object. Exit status: 0 ok, 1 usage or connection failure, 2 a command
 * failed (the JSON carries the sense), 3 data read back differed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

#define UNIT 4096u

enum op { OP_READ, OP_WRITE, OP_CAW, OP_UNMAP };
enum data_kind { DATA_UNIQUE, DATA_MIX, DATA_ZERO, DATA_SPARSE };
/* Their names on the command line and in the report, in enum order. */
static const char *const op_names[] = { "read", "write", "caw", "unmap", NULL };
static const char *const data_names[] = { "unique", "mix", "zero", "sparse", NULL };

struct req {
    int busy;
    uint64_t offset; /* bytes */
    uint64_t key;
    uint64_t slot;
    uint64_t started_ns;
    int retries;
    unsigned char *buf;
    struct unmap_list ul;
};

static struct iscsi_context *iscsi;
static int lun;
static uint32_t block_size;
static uint64_t lun_bytes;

static enum op op = OP_READ;
static int random_offsets;
static int depth = 1;
static uint32_t size = UNIT;
static uint64_t max_ops;
static double max_seconds;
static uint64_t region_start, region_len;
static enum data_kind data_kind = DATA_UNIQUE;
static uint64_t seed = 1;
static int verify_reads;
static uint64_t readback;
static int flush_after;

static struct req *reqs;
static int inflight;
static uint64_t issued, completed, errors, mismatches, checked, unit_attentions;
static char first_error[512];
static uint64_t *lat_ns;
static uint64_t lat_cap;
static uint64_t rng_state;
static uint64_t next_seq;
static uint64_t nslots;
static uint64_t *slot_key;     /* random writes: key+1 of the last completed write per slot */
static unsigned char *slot_busy;
static unsigned char *caw_current;
static int phase_readback;
static uint64_t *rb_slots;
static uint64_t rb_count, rb_next;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t next_rand(void)
{
    rng_state = mix64(rng_state);
    return rng_state;
}

static void fill_stream(unsigned char *p, size_t len, uint64_t s)
{
    uint64_t x = s | 1;
    for (size_t i = 0; i < len; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, len - i < 8 ? len - i : 8);
    }
}

/* 16 MiB of random bytes, the same in every process: content is cut from it with memcpy so
 * that generating (and checking) data costs the client almost nothing. */
#define POOL_BYTES (16u << 20)
static unsigned char *pool;

static void pool_init(void)
{
    pool = malloc(POOL_BYTES);
    fill_stream(pool, POOL_BYTES, 0x243f6a8885a308d3ull);
}

/* Content of one 4 KiB unit (or a shorter block for COMPARE AND WRITE): a window of the pool
 * chosen by a hash of (seed, offset, key), stamped with that hash and the offset in its first
 * 16 bytes, so no two units are equal and none compresses. */
static void fill_unique(unsigned char *p, size_t len, uint64_t h, uint64_t offset)
{
    uint64_t start = ((h >> 12) % (POOL_BYTES - 4096)) & ~7ull;
    memcpy(p, pool + start, len);
    if (len >= 16) {
        memcpy(p, &h, 8);
        memcpy(p + 8, &offset, 8);
    }
}

static void fill_unit(unsigned char *p, size_t len, uint64_t offset, uint64_t key)
{
    if (data_kind == DATA_ZERO) {
        memset(p, 0, len);
        return;
    }
    uint64_t h = mix64(seed ^ mix64(offset ^ 0x5bd1e995ull) ^ mix64(key + 0x2545f491ull));
    if (data_kind == DATA_SPARSE) {
        /* The stamp of fill_unique without the pool window: distinct, then zeros. */
        unsigned char stamp[16];
        memcpy(stamp, &h, 8);
        memcpy(stamp + 8, &offset, 8);
        memset(p, 0, len);
        memcpy(p, stamp, len < 16 ? len : 16);
        return;
    }
    if (data_kind == DATA_MIX) {
        if (h % 100 < 30) {
            /* One of 256 recurring blocks: the same bytes wherever they are written. */
            memcpy(p, pool + ((h >> 8) % 256) * 4096, len);
            return;
        }
        /* Unique first half, then a 64-byte phrase repeated: about 2:1 for LZ4. */
        size_t half = len / 2;
        fill_unique(p, half, h, offset);
        unsigned char *q = p + half;
        size_t n = len - half, have = n < 64 ? n : 64;
        for (size_t i = 0; i < have; i++)
            q[i] = 'a' + pool[(h + i * 7) % POOL_BYTES] % 26;
        while (have < n) {
            size_t c = have < n - have ? have : n - have;
            memcpy(q + have, q, c);
            have += c;
        }
        return;
    }
    fill_unique(p, len, h, offset);
}

static void fill_range(unsigned char *p, uint64_t offset, uint32_t len, uint64_t key)
{
    for (uint32_t done = 0; done < len; done += UNIT) {
        uint32_t n = len - done < UNIT ? len - done : UNIT;
        fill_unit(p + done, n, offset + done, key);
    }
}

static void note_error(const char *what, struct scsi_task *task, int status)
{
    errors++;
    if (first_error[0])
        return;
    if (status == SCSI_STATUS_CHECK_CONDITION && task)
        snprintf(first_error, sizeof first_error, "%s: CHECK CONDITION %s (0x%x) %s (0x%04x)",
                 what, scsi_sense_key_str(task->sense.key), task->sense.key,
                 scsi_sense_ascq_str(task->sense.ascq), task->sense.ascq);
    else
        snprintf(first_error, sizeof first_error, "%s: status 0x%x %s", what, status,
                 iscsi_get_error(iscsi));
}

static int pick(struct req *r);
static void submit(struct req *r);

static void record_latency(struct req *r)
{
    if (completed < lat_cap)
        lat_ns[completed] = now_ns() - r->started_ns;
    completed++;
}

static void check_data(const unsigned char *got, uint32_t len, uint64_t offset, uint64_t key)
{
    static unsigned char *want;
    static uint32_t want_len;
    if (want_len < len) {
        free(want);
        want = malloc(len);
        want_len = len;
    }
    fill_range(want, offset, len, key);
    checked++;
    if (memcmp(got, want, len) != 0) {
        mismatches++;
        if (!first_error[0])
            snprintf(first_error, sizeof first_error,
                     "data read back differs at byte offset %" PRIu64, offset);
    }
}

static void done_cb(struct iscsi_context *ctx, int status, void *command_data, void *private)
{
    (void)ctx;
    struct scsi_task *task = command_data;
    struct req *r = private;
    inflight--;
    r->busy = 0;
    if (status == SCSI_STATUS_CHECK_CONDITION && task &&
        task->sense.key == SCSI_SENSE_UNIT_ATTENTION && r->retries < 5) {
        /* A unit attention (e.g. a soft threshold reached) reports an event, not a failure
         * of this command: issue the same command again, as an OS initiator would. */
        unit_attentions++;
        r->retries++;
        scsi_free_scsi_task(task);
        issued--;
        submit(r);
        return;
    }
    r->retries = 0;
    if (status != SCSI_STATUS_GOOD) {
        const char *what = op == OP_READ || phase_readback ? "read" : op == OP_WRITE ? "write"
                          : op == OP_CAW ? "compare and write" : "unmap";
        if (op == OP_CAW && status == SCSI_STATUS_CHECK_CONDITION && task &&
            task->sense.key == SCSI_SENSE_MISCOMPARE)
            mismatches++;
        note_error(what, task, status);
    } else if (phase_readback) {
        if (task->datain.size >= (int)size)
            check_data(task->datain.data, size, r->offset, r->key);
        else
            note_error("read (short)", task, status);
    } else {
        record_latency(r);
        if (op == OP_READ && verify_reads) {
            if (task->datain.size >= (int)size)
                check_data(task->datain.data, size, r->offset, 0);
            else
                note_error("read (short)", task, status);
        } else if (op == OP_WRITE && random_offsets) {
            slot_key[r->slot] = r->key + 1;
        } else if (op == OP_CAW) {
            memcpy(caw_current, r->buf + block_size, block_size);
        }
    }
    if (random_offsets && op == OP_WRITE && !phase_readback)
        slot_busy[r->slot] = 0;
    if (task)
        scsi_free_scsi_task(task);
}

/* Choose the next command for request slot r; 0 when there is nothing left to issue. */
static int pick(struct req *r)
{
    if (phase_readback) {
        if (rb_next >= rb_count)
            return 0;
        uint64_t s = rb_slots[rb_next++];
        r->slot = s;
        r->offset = region_start + s * size;
        r->key = slot_key[s] - 1;
        return 1;
    }
    if (max_ops && issued >= max_ops)
        return 0;
    r->key = issued;
    if (op == OP_CAW) {
        r->offset = region_start;
        return 1;
    }
    if (random_offsets) {
        for (int tries = 0;; tries++) {
            r->slot = next_rand() % nslots;
            if (!(op == OP_WRITE && slot_busy[r->slot]))
                break;
            if (tries > 64)
                return 0;
        }
        if (op == OP_WRITE)
            slot_busy[r->slot] = 1;
    } else {
        if (next_seq >= nslots) {
            if (op == OP_UNMAP || op == OP_WRITE)
                return 0; /* one pass */
            next_seq = 0;
        }
        r->slot = next_seq++;
    }
    r->offset = region_start + r->slot * size;
    return 1;
}

static void submit(struct req *r)
{
    struct scsi_task *t = NULL;
    uint64_t lba = r->offset / block_size;
    r->busy = 1;
    inflight++;
    issued++;
    r->started_ns = now_ns();
    if (phase_readback || op == OP_READ) {
        t = iscsi_read16_task(iscsi, lun, lba, size, block_size, 0, 0, 0, 0, 0, done_cb, r);
    } else if (op == OP_WRITE) {
        fill_range(r->buf, r->offset, size, random_offsets ? r->key : 0);
        t = iscsi_write16_task(iscsi, lun, lba, r->buf, size, block_size, 0, 0, 0, 0, 0,
                               done_cb, r);
    } else if (op == OP_CAW) {
        memcpy(r->buf, caw_current, block_size);
        fill_unit(r->buf + block_size, block_size, r->offset, r->key + 1);
        t = iscsi_compareandwrite_task(iscsi, lun, lba, r->buf, 2 * block_size, block_size,
                                       0, 0, 0, 0, 0, done_cb, r);
    } else {
        r->ul.lba = lba;
        r->ul.num = size / block_size;
        t = iscsi_unmap_task(iscsi, lun, 0, 0, &r->ul, 1, done_cb, r);
    }
    if (!t) {
        inflight--;
        r->busy = 0;
        note_error("submit", NULL, -1);
    }
}

static int event_loop(uint64_t deadline_ns)
{
    for (;;) {
        int stop = (deadline_ns && now_ns() >= deadline_ns) || errors;
        if (!stop) {
            for (int i = 0; i < depth && inflight < depth; i++) {
                if (reqs[i].busy)
                    continue;
                if (!pick(&reqs[i]))
                    break;
                submit(&reqs[i]);
            }
        }
        if (inflight == 0)
            return 0;
        struct pollfd pfd = { .fd = iscsi_get_fd(iscsi), .events = iscsi_which_events(iscsi) };
        int n = poll(&pfd, 1, 1000);
        if (n < 0 && errno != EINTR)
            return -1;
        if (iscsi_service(iscsi, n > 0 ? pfd.revents : 0) < 0) {
            note_error("connection", NULL, -1);
            return -1;
        }
    }
}

static uint64_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    case 't': case 'T': v *= 1024.0 * 1024 * 1024 * 1024; break;
    default: break;
    }
    return (uint64_t)v;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(uint64_t n, double p)
{
    if (!n)
        return 0;
    uint64_t i = (uint64_t)(p * (double)(n - 1) + 0.5);
    return lat_ns[i] / 1000.0;
}

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    }
    putchar('"');
}

static void usage(void)
{
    fprintf(stderr, "usage: iscsi-load -u URL -o read|write|caw|unmap [-p seq|rand] [-q DEPTH] "
                    "[-s BYTES] [-n COUNT] [-t SECONDS] [-O OFFSET] [-L LENGTH] "
                    "[-d unique|mix|zero|sparse] [-S SEED] [-V] [-R READBACK] [-F]\n");
    exit(1);
}

/* The index of `arg` in `names` (NULL-terminated); usage() when it is none of them. */
static int named(const char *arg, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(arg, names[i]))
            return i;
    usage();
    return -1;
}

int main(int argc, char **argv)
{
    const char *url_text = NULL;
    int c;
    while ((c = getopt(argc, argv, "u:o:p:q:s:n:t:O:L:d:S:VR:F")) != -1) {
        switch (c) {
        case 'u': url_text = optarg; break;
        case 'o': op = (enum op)named(optarg, op_names); break;
        case 'p': random_offsets = !strcmp(optarg, "rand"); break;
        case 'q': depth = atoi(optarg); break;
        case 's': size = (uint32_t)parse_bytes(optarg); break;
        case 'n': max_ops = strtoull(optarg, NULL, 10); break;
        case 't': max_seconds = atof(optarg); break;
        case 'O': region_start = parse_bytes(optarg); break;
        case 'L': region_len = parse_bytes(optarg); break;
        case 'd': data_kind = (enum data_kind)named(optarg, data_names); break;
        case 'S': seed = strtoull(optarg, NULL, 10); break;
        case 'V': verify_reads = 1; break;
        case 'R': readback = strtoull(optarg, NULL, 10); break;
        case 'F': flush_after = 1; break;
        default: usage();
        }
    }
    if (!url_text || depth < 1 || size == 0)
        usage();
    if (op == OP_CAW)
        depth = 1;

    char initiator[128];
    snprintf(initiator, sizeof initiator, "iqn.2026-11.bench:iscsi-load-%d", (int)getpid());
    iscsi = iscsi_create_context(initiator);
    struct iscsi_url *url = iscsi ? iscsi_parse_full_url(iscsi, url_text) : NULL;
    if (!url) {
        fprintf(stderr, "iscsi-load: bad URL %s: %s\n", url_text, iscsi ? iscsi_get_error(iscsi) : "");
        return 1;
    }
    iscsi_set_targetname(iscsi, url->target);
    iscsi_set_session_type(iscsi, ISCSI_SESSION_NORMAL);
    iscsi_set_header_digest(iscsi, ISCSI_HEADER_DIGEST_NONE);
    if (iscsi_full_connect_sync(iscsi, url->portal, url->lun) != 0) {
        fprintf(stderr, "iscsi-load: login to %s failed: %s\n", url_text, iscsi_get_error(iscsi));
        return 1;
    }
    lun = url->lun;
    struct scsi_task *cap = iscsi_readcapacity16_sync(iscsi, lun);
    struct scsi_readcapacity16 *rc16 = cap && cap->status == SCSI_STATUS_GOOD
                                           ? scsi_datain_unmarshall(cap) : NULL;
    if (!rc16) {
        fprintf(stderr, "iscsi-load: READ CAPACITY(16) failed: %s\n", iscsi_get_error(iscsi));
        return 1;
    }
    block_size = rc16->block_length;
    lun_bytes = (rc16->returned_lba + 1) * (uint64_t)block_size;
    scsi_free_scsi_task(cap);

    if (op == OP_CAW)
        size = block_size;
    if (size % block_size || region_start % block_size || region_start >= lun_bytes) {
        fprintf(stderr, "iscsi-load: size and offset must be multiples of the %u-byte block "
                        "and inside the %" PRIu64 "-byte LUN\n", block_size, lun_bytes);
        return 1;
    }
    if (!region_len || region_start + region_len > lun_bytes)
        region_len = lun_bytes - region_start;
    nslots = region_len / size;
    if (!nslots)
        usage();

    rng_state = mix64(seed ^ 0x1234567ull ^ (uint64_t)op);
    pool_init();
    reqs = calloc(depth, sizeof *reqs);
    for (int i = 0; i < depth; i++)
        if (posix_memalign((void **)&reqs[i].buf, 4096, 2 * (size_t)size))
            return 1;
    if (random_offsets && op == OP_WRITE) {
        slot_key = calloc(nslots, sizeof *slot_key);
        slot_busy = calloc(nslots, 1);
    }
    lat_cap = max_ops ? max_ops : 20000000;
    lat_ns = malloc(lat_cap * sizeof *lat_ns);

    if (op == OP_CAW) {
        caw_current = malloc(block_size);
        struct scsi_task *t = iscsi_read16_sync(iscsi, lun, region_start / block_size,
                                                block_size, block_size, 0, 0, 0, 0, 0);
        if (!t || t->status != SCSI_STATUS_GOOD || t->datain.size < (int)block_size) {
            fprintf(stderr, "iscsi-load: reading the COMPARE AND WRITE block failed: %s\n",
                    iscsi_get_error(iscsi));
            return 1;
        }
        memcpy(caw_current, t->datain.data, block_size);
        scsi_free_scsi_task(t);
    }

    uint64_t t0 = now_ns();
    uint64_t deadline = max_seconds > 0 ? t0 + (uint64_t)(max_seconds * 1e9) : 0;
    if (!max_ops && !deadline && (random_offsets || op == OP_READ || op == OP_CAW))
        deadline = t0 + 10ull * 1000000000ull;
    event_loop(deadline);
    uint64_t t1 = now_ns();
    double secs = (t1 - t0) / 1e9;
    double flush_secs = -1;
    if (flush_after && !errors) {
        struct scsi_task *t = iscsi_synchronizecache10_sync(iscsi, lun, 0, 0, 1, 0);
        if (!t || t->status != SCSI_STATUS_GOOD) {
            errors++;
            snprintf(first_error, sizeof first_error, "SYNCHRONIZE CACHE failed: %s",
                     iscsi_get_error(iscsi));
        } else {
            flush_secs = (now_ns() - t1) / 1e9;
        }
        if (t)
            scsi_free_scsi_task(t);
    }

    if (readback && !errors && slot_key) {
        rb_slots = malloc(readback * sizeof *rb_slots);
        uint64_t written = 0;
        for (uint64_t s = 0; s < nslots; s++)
            written += slot_key[s] != 0;
        uint64_t stride = written > readback ? written / readback : 1, seen = 0;
        for (uint64_t s = 0; s < nslots && rb_count < readback; s++)
            if (slot_key[s] && seen++ % stride == 0)
                rb_slots[rb_count++] = s;
        phase_readback = 1;
        event_loop(0);
    }

    uint64_t n = completed < lat_cap ? completed : lat_cap;
    qsort(lat_ns, n, sizeof *lat_ns, cmp_u64);
    double sum = 0;
    for (uint64_t i = 0; i < n; i++)
        sum += lat_ns[i];
    printf("{\"op\":\"%s\",\"pattern\":\"%s\",\"depth\":%d,\"size\":%u,\"data\":\"%s\","
           "\"block_size\":%u,\"lun_bytes\":%" PRIu64 ",\"region_start\":%" PRIu64
           ",\"region_len\":%" PRIu64 ",\"ops\":%" PRIu64 ",\"bytes\":%" PRIu64
           ",\"seconds\":%.6f,\"iops\":%.1f,\"bytes_per_s\":%.1f,"
           "\"lat_us\":{\"mean\":%.1f,\"p50\":%.1f,\"p90\":%.1f,\"p99\":%.1f,\"p999\":%.1f,"
           "\"max\":%.1f},\"errors\":%" PRIu64 ",\"unit_attentions\":%" PRIu64 ",\"verified\":%" PRIu64
           ",\"mismatches\":%" PRIu64 ",\"flush_seconds\":%.6f,\"durable_iops\":%.1f"
           ",\"first_error\":",
           op_names[op], random_offsets ? "rand" : "seq", depth, size, data_names[data_kind],
           block_size, lun_bytes, region_start, region_len, completed, completed * (uint64_t)size,
           secs, completed / secs, completed * (double)size / secs, n ? sum / n / 1000.0 : 0,
           pct(n, 0.5), pct(n, 0.9), pct(n, 0.99), pct(n, 0.999), n ? lat_ns[n - 1] / 1000.0 : 0,
           errors, unit_attentions, checked, mismatches, flush_secs,
           flush_secs >= 0 ? completed / (secs + flush_secs) : 0.0);
    json_string(first_error);
    printf("}\n");
    iscsi_logout_sync(iscsi);
    iscsi_destroy_url(url);
    iscsi_destroy_context(iscsi);
    if (mismatches && op != OP_CAW)
        return 3;
    return errors ? 2 : 0;
}
