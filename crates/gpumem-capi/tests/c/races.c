/* Calls racing each other, and calls made as a thread exits, as a multi-threaded C or C++
 * host makes them: a policy change while other threads allocate loses no allocation; two
 * threads changing the two limits of one device at once both take effect; a change to one
 * device is checked against that device's limits; a failing call from a thread-exit
 * destructor returns its code (it aborted the process). Run by tests/c_program.rs with
 * GPUMEM_DEVICE=sim; prints "ok" and exits 0 when every check holds. */
#define _POSIX_C_SOURCE 200809L /* pthread barriers under -std=c11 */

#include "gpumem.h"
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static atomic_int stop;

static void *change_policies(void *unused) {
  (void)unused;
  const char *policies[] = {"torch", "gpumem"};
  for (int i = 0; !atomic_load(&stop); i++) {
    gpumem_configure(policies[i & 1], NULL, NULL, -1); /* GPUMEM_BUSY while one is live */
  }
  return NULL;
}

/* Device 1's status text holds "soft = …, hard = …". */
static int limits_are(const char *soft, const char *hard) {
  char status[1024], want[128];
  gpumem_pool_status(1, status, sizeof status);
  snprintf(want, sizeof want, "soft = %s, hard = %s", soft, hard);
  return strstr(status, want) != NULL;
}

static pthread_barrier_t both;

static void *set_soft(void *unused) {
  (void)unused;
  pthread_barrier_wait(&both);
  return (void *)(long)gpumem_set_limits(1, "1GiB", NULL);
}

static void *set_hard(void *unused) {
  (void)unused;
  pthread_barrier_wait(&both);
  return (void *)(long)gpumem_set_limits(1, NULL, "4GiB");
}

static pthread_key_t cached_block;

/* A thread-local cache released at thread exit, after the thread's own storage may be gone. */
static void release(void *block) {
  gpumem_free((char *)block + 1, GPUMEM_ANY_SIZE, 0); /* fails: not a block's start */
  gpumem_free(block, GPUMEM_ANY_SIZE, 0);
  (void)gpumem_last_error();
}

static void *cache_and_exit(void *unused) {
  (void)unused;
  void *block = NULL;
  if (gpumem_alloc(4096, 0, NULL, &block) != GPUMEM_OK) return (void *)1;
  gpumem_free((void *)1, 0, 0); /* this thread has had an error */
  pthread_setspecific(cached_block, block);
  return NULL;
}

int main(void) {
  pthread_t changer;
  CHECK(pthread_create(&changer, NULL, change_policies, NULL) == 0);
  long lost = 0;
  for (int i = 0; i < 100000; i++) {
    void *p = NULL;
    if (gpumem_alloc(4096, 0, NULL, &p) != GPUMEM_OK) continue;
    if (gpumem_free(p, 4096, 0) != GPUMEM_OK) lost++;
  }
  atomic_store(&stop, 1);
  pthread_join(changer, NULL);
  CHECK(lost == 0);

  CHECK(pthread_barrier_init(&both, NULL, 2) == 0);
  for (int round = 0; round < 2000; round++) {
    CHECK(gpumem_set_limits(1, "none", "none") == GPUMEM_OK);
    pthread_t soft, hard;
    void *soft_status, *hard_status;
    pthread_create(&soft, NULL, set_soft, NULL);
    pthread_create(&hard, NULL, set_hard, NULL);
    pthread_join(soft, &soft_status);
    pthread_join(hard, &hard_status);
    CHECK(soft_status == (void *)GPUMEM_OK && hard_status == (void *)GPUMEM_OK);
    CHECK(limits_are("1024.00 MiB", "4.00 GiB"));
  }

  /* Process-wide hard limit 1 GiB; device 1 raised to 4 GiB takes a 2 GiB soft limit. */
  CHECK(gpumem_configure(NULL, NULL, "1GiB", -1) == GPUMEM_OK);
  CHECK(gpumem_set_limits(1, NULL, "4GiB") == GPUMEM_OK);
  CHECK(gpumem_set_limits(1, "2GiB", NULL) == GPUMEM_OK);
  CHECK(limits_are("2.00 GiB", "4.00 GiB"));
  CHECK(gpumem_set_limits(1, "", NULL) == GPUMEM_INVALID_ARGUMENT);

  CHECK(pthread_key_create(&cached_block, release) == 0);
  pthread_t exiting;
  void *exited;
  CHECK(pthread_create(&exiting, NULL, cache_and_exit, NULL) == 0);
  CHECK(pthread_join(exiting, &exited) == 0 && exited == NULL);
  printf("ok\n");
  return 0;
}
