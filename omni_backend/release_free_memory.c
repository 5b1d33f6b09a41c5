/* Preloaded into tritonserver (LD_PRELOAD): gives glibc's free heap pages back to the OS every
 * OMNI_RELEASE_FREE_MEMORY_S seconds, as every Python stub does for itself
 * (omni_backend/glibc_heaps.py). glibc returns only the free space at the top of a heap; freed
 * chunks between live ones stay resident. Under a varied load tritonserver's heap rose by about
 * 1 MB per 10 minutes, and malloc_trim gave all of it back (25.2 -> 20.6 MB), so the growth was
 * pages kept, not memory leaked.
 *
 * Built by omni_backend/glibc_heaps.py with the system C compiler. The library takes itself off
 * LD_PRELOAD at load, so the stubs tritonserver starts (which trim from Python) do not inherit it.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LIBRARY_NAME "libomni_release_free_memory.so"

static double interval_s;

static void *release_loop(void *unused) {
    (void)unused;
    /* the server's own threads handle its signals (SIGTERM drains it) */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    struct timespec pause = {(time_t)interval_s, (long)((interval_s - (time_t)interval_s) * 1e9)};
    for (;;) {
        struct timespec left = pause;
        while (nanosleep(&left, &left) != 0) {
        }
        malloc_trim(0);
    }
    return NULL;
}

/* LD_PRELOAD without this library (entries are separated by spaces or colons). */
static void leave_preload(void) {
    const char *given = getenv("LD_PRELOAD");
    if (given == NULL) {
        return;
    }
    size_t n = strlen(given);
    char *kept = malloc(n + 1);
    char *copy = strdup(given);
    if (kept == NULL || copy == NULL) {
        free(kept);
        free(copy);
        return;
    }
    kept[0] = '\0';
    char *save = NULL;
    for (char *entry = strtok_r(copy, " :", &save); entry != NULL; entry = strtok_r(NULL, " :", &save)) {
        size_t len = strlen(entry), name = strlen(LIBRARY_NAME);
        if (len >= name && strcmp(entry + len - name, LIBRARY_NAME) == 0) {
            continue;
        }
        if (kept[0] != '\0') {
            strcat(kept, ":");
        }
        strcat(kept, entry);
    }
    if (kept[0] == '\0') {
        unsetenv("LD_PRELOAD");
    } else {
        setenv("LD_PRELOAD", kept, 1);
    }
    free(kept);
    free(copy);
}

__attribute__((constructor)) static void start_releasing(void) {
    leave_preload();
    const char *raw = getenv("OMNI_RELEASE_FREE_MEMORY_S");
    interval_s = raw != NULL ? strtod(raw, NULL) : 20.0;
    if (!(interval_s > 0)) {
        return;     /* 0 turns it off */
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_t thread;
    if (pthread_create(&thread, &attr, release_loop, NULL) == 0) {
        pthread_setname_np(thread, "release-freemem");
    }
    pthread_attr_destroy(&attr);
}
