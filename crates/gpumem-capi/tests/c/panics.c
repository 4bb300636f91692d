/* A panic inside gpumem, provoked with the test-only gpumem_test_inject_panic (feature
 * fault-injection), reaches C as an error code and gpumem_last_error, never as an abort: at
 * the start of an allocation, a free, a query, a configuration change, a snapshot and a
 * publication the pool goes on working; inside the pool's locked state (a free on device 7)
 * that pool refuses every later call with the reason while device 0's works. Prints "ok". */
#define GPUMEM_FAULT_INJECTION 1
#include "gpumem.h"

#include <stdio.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

static int failures = 0;

static void check(int condition, const char* what) {
  if (!condition) {
    printf("failed: %s (last error: %s)\n", what, gpumem_last_error());
    failures++;
  }
}

static int names(const char* entry, const char* text) {
  return strstr(gpumem_last_error(), entry) != NULL && strstr(gpumem_last_error(), text) != NULL;
}

static void works(int device) {
  void* p = NULL;
  check(gpumem_alloc(MIB, device, NULL, &p) == GPUMEM_OK && p != NULL, "allocation works");
  check(gpumem_free(p, MIB, device) == GPUMEM_OK, "free works");
}

int main(int argc, char** argv) {
  const char* snapshot = argc > 1 ? argv[1] : "snapshot.pickle";
  char buffer[256];
  void* p = NULL;
  void* q = NULL;

  check(gpumem_test_inject_panic("gpumem_alloc", 0) == GPUMEM_OK, "arm gpumem_alloc");
  check(gpumem_alloc(MIB, 0, NULL, &p) == GPUMEM_INTERNAL, "gpumem_alloc fails");
  check(p == NULL, "no address after the panic");
  check(names("internal error in gpumem_alloc: panicked: injected panic", "stay usable"),
        "gpumem_alloc's panic is the last error");
  works(0);

  check(gpumem_alloc(MIB, 0, NULL, &p) == GPUMEM_OK, "allocate for the free");
  check(gpumem_test_inject_panic("gpumem_free", 0) == GPUMEM_OK, "arm gpumem_free");
  check(gpumem_free(p, MIB, 0) == GPUMEM_INTERNAL, "gpumem_free fails");
  check(names("internal error in gpumem_free", "injected panic"), "gpumem_free's panic");
  check(gpumem_free(p, MIB, 0) == GPUMEM_OK, "the free did nothing; freeing again works");

  check(gpumem_test_inject_panic("gpumem_memory_stats", 0) == GPUMEM_OK, "arm stats");
  check(gpumem_memory_stats(0, buffer, sizeof buffer) == 0, "gpumem_memory_stats fails");
  check(names("internal error in gpumem_memory_stats", "injected panic"), "stats' panic");
  check(gpumem_memory_stats(0, NULL, 0) > 0, "statistics work after");

  check(gpumem_test_inject_panic("gpumem_configure", 0) == GPUMEM_OK, "arm configure");
  check(gpumem_configure(NULL, NULL, "1GiB", -1) == GPUMEM_INTERNAL, "configure fails");
  check(names("internal error in gpumem_configure", "injected panic"), "configure's panic");

  check(gpumem_test_inject_panic("gpumem_snapshot", 0) == GPUMEM_OK, "arm snapshot");
  check(gpumem_snapshot(0, snapshot) == GPUMEM_INTERNAL, "snapshot fails");
  check(names("internal error in gpumem_snapshot", "injected panic"), "snapshot's panic");
  check(fopen(snapshot, "rb") == NULL, "no snapshot written");

  check(gpumem_test_inject_panic("gpumem_publish", 0) == GPUMEM_OK, "arm publish");
  check(gpumem_publish(NULL) == GPUMEM_INTERNAL, "publish fails");
  check(names("internal error in gpumem_publish", "injected panic"), "publish's panic");
  works(0);

  /* Inside the pool's locked state: device 7's pool is unusable from then on. */
  check(gpumem_alloc(MIB, 7, NULL, &q) == GPUMEM_OK, "allocate on device 7");
  check(gpumem_test_inject_panic("gpumem_free", 1) == GPUMEM_OK, "arm inside the pool");
  check(gpumem_free(q, MIB, 7) == GPUMEM_INTERNAL, "the free fails");
  check(names("internal error in gpumem_free", "pool of device 7 was changing its state"),
        "the panic says device 7 is unusable");
  check(gpumem_alloc(MIB, 7, NULL, &p) == GPUMEM_UNUSABLE, "device 7 refuses");
  check(names("the gpumem pool of device 7 is unusable after an internal error in gpumem_free",
              "restart the process"),
        "the refusal names the panic");
  check(gpumem_memory_stats(7, buffer, sizeof buffer) == 0, "device 7's statistics refused");
  works(0);

  if (failures > 0) return 1;
  puts("ok");
  return 0;
}
