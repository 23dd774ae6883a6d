/* vcpu-gaps: how long this machine's CPUs stop running a thread that never sleeps.
 *
 *     vcpu-gaps SECONDS
 *
 * One thread per online CPU, each pinned to its CPU, reads CLOCK_MONOTONIC in a loop for
 * SECONDS and counts the gaps between two reads: a gap is time the thread did not run
 * (interrupts, kernel work on that CPU, other threads, or, in a virtual machine, the
 * hypervisor not running the virtual CPU). Prints one JSON line per CPU. bench/vcpu-stalls
 * runs it idle and beside disk writes, to tell the machine's own stalls from sliver's.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double seconds;

struct result {
    long cpu, over1, over5, over20;
    double worst_ms, stopped_ms;
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *spin(void *arg) {
    struct result *r = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(r->cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    double start = now(), prev = start;
    while (prev - start < seconds) {
        double t = now(), gap = t - prev;
        if (gap > 0.001) {
            r->over1++;
            r->stopped_ms += gap * 1e3;
        }
        if (gap > 0.005) r->over5++;
        if (gap > 0.020) r->over20++;
        if (gap * 1e3 > r->worst_ms) r->worst_ms = gap * 1e3;
        prev = t;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2 || (seconds = atof(argv[1])) <= 0 || seconds > 600) {
        fprintf(stderr, "usage: vcpu-gaps SECONDS (at most 600)\n");
        return 2;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus < 1 || cpus > 1024) cpus = 1;
    pthread_t *threads = calloc(cpus, sizeof *threads);
    struct result *results = calloc(cpus, sizeof *results);
    for (long i = 0; i < cpus; i++) {
        results[i].cpu = i;
        if (pthread_create(&threads[i], NULL, spin, &results[i]) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    for (long i = 0; i < cpus; i++) pthread_join(threads[i], NULL);
    for (long i = 0; i < cpus; i++) {
        struct result *r = &results[i];
        printf("{\"cpu\": %ld, \"seconds\": %.1f, \"gaps_over_1ms\": %ld, \"gaps_over_5ms\": %ld, "
               "\"gaps_over_20ms\": %ld, \"worst_ms\": %.1f, \"stopped_ms\": %.0f}\n",
               r->cpu, seconds, r->over1, r->over5, r->over20, r->worst_ms, r->stopped_ms);
    }
    return 0;
}
