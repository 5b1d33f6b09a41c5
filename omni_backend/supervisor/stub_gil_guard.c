/* Preloaded into every Python-backend stub (stub_gil_guard.py builds it and puts it in
 * tritonserver's LD_PRELOAD, which the stubs inherit): Python objects that the stub frees on a
 * thread without the GIL are freed later, by a thread of ours that holds it.
 *
 * Why: the 2.51 stub's message thread ends a finished BLS stream (`SendCleanupId`) by erasing its
 * response iterator from a map. When Python has already dropped the stream's responses, that
 * erase is the last reference: the responses' tensors are destroyed there, and each frees its
 * numpy array with no GIL held (python_backend b771f4f added the GIL there, first in 25.01).
 * Freed that way, the array's memory goes back to numpy's and Python's allocators while another
 * thread may be using them: a corrupted heap some time later (perf/JOURNAL.md).
 *
 * How: every `_Py_Dealloc` call made through the dynamic linker (the stub's own, numpy's, and on
 * a libpython built without -fno-semantic-interposition the interpreter's too) comes here. With
 * the GIL held it goes straight on. Without it, the object is given one reference back (it is
 * ours alone: its count had reached zero) and put on a list; a thread started at the first such
 * call takes the GIL and drops those references. That thread holds no other lock while it waits
 * for the GIL, so it cannot close a lock cycle with the stub's own threads.
 *
 * No Python headers: only the head of an object (its reference count first, as in every
 * non-free-threaded CPython) and four functions of libpython, looked up at the first call.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/types.h>

typedef struct object { ssize_t refcnt; void *type; } object;

static void (*real_dealloc)(object *);
static int (*gil_held)(void);
static int (*gil_ensure)(void);
static void (*gil_release)(int);
static pthread_once_t resolved = PTHREAD_ONCE_INIT;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static object **pending;
static size_t pending_len, pending_cap;
static int freer_started;

static atomic_ulong deferred_total, freed_total;

static void resolve(void)
{
  real_dealloc = (void (*)(object *))dlsym(RTLD_NEXT, "_Py_Dealloc");
  gil_held = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Check");
  gil_ensure = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
  gil_release = (void (*)(int))dlsym(RTLD_DEFAULT, "PyGILState_Release");
}

static void *free_pending(void *unused)
{
  (void)unused;
  for (;;) {
    pthread_mutex_lock(&mu);
    while (pending_len == 0)
      pthread_cond_wait(&wake, &mu);
    object **batch = pending;
    size_t n = pending_len;
    pending = NULL;
    pending_len = pending_cap = 0;
    pthread_mutex_unlock(&mu);

    int state = gil_ensure();
    for (size_t i = 0; i < n; i++)
      if (--batch[i]->refcnt == 0)
        real_dealloc(batch[i]);
    gil_release(state);
    atomic_fetch_add(&freed_total, n);
    free(batch);
  }
  return NULL;
}

/* A forked child (a stub's worker process) has no freeing thread: it starts its own when it needs
 * one, and the list and lock are its own from the fork on (no thread of the parent can hold the
 * lock across the fork). */
static void before_fork(void) { pthread_mutex_lock(&mu); }
static void after_fork_in_parent(void) { pthread_mutex_unlock(&mu); }
static void after_fork_in_child(void)
{
  freer_started = 0;
  pthread_cond_init(&wake, NULL);
  pthread_mutex_unlock(&mu);
}

__attribute__((constructor)) static void watch_forks(void)
{
  pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
}

/* Keeps `op` (one reference of ours) for the freeing thread; 0 where that cannot be done. */
static int defer(object *op)
{
  int kept = 0;
  pthread_mutex_lock(&mu);
  if (!freer_started) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    freer_started = pthread_create(&thread, &attr, free_pending, NULL) == 0;
    pthread_attr_destroy(&attr);
  }
  if (freer_started && pending_len == pending_cap) {
    size_t cap = pending_cap ? 2 * pending_cap : 64;
    object **grown = realloc(pending, cap * sizeof *grown);
    if (grown) {
      pending = grown;
      pending_cap = cap;
    }
  }
  if (freer_started && pending_len < pending_cap) {
    op->refcnt = 1;
    pending[pending_len++] = op;
    pthread_cond_signal(&wake);
    kept = 1;
  }
  pthread_mutex_unlock(&mu);
  return kept;
}

void _Py_Dealloc(object *op)
{
  pthread_once(&resolved, resolve);
  if (gil_held && gil_ensure && gil_release && !gil_held() && defer(op)) {
    atomic_fetch_add(&deferred_total, 1);
    return;
  }
  real_dealloc(op);
}

/* For tests and reports: objects handed to the freeing thread, and those it has freed. */
unsigned long omni_gil_guard_deferred(void) { return atomic_load(&deferred_total); }
unsigned long omni_gil_guard_freed(void) { return atomic_load(&freed_total); }
