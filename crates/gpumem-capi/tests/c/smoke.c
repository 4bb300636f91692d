/* A C program using gpumem through its header, as a C user would: allocations on two
 * streams, a wrong-size free, statistics, a limit and its OOM, a snapshot. Run by
 * tests/c_program.rs with GPUMEM_DEVICE=sim; prints "ok" and exits 0 when every check holds. */
#include "gpumem.h"
#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  void *a = NULL, *b = NULL, *none = (void *)1;
  CHECK(argc == 2);
  CHECK(gpumem_alloc(1 << 20, 0, NULL, &a) == GPUMEM_OK && a != NULL);
  CHECK(gpumem_alloc(3000, 0, (void *)0x1234, &b) == GPUMEM_OK && b != NULL && b != a);
  CHECK(gpumem_alloc(0, 0, NULL, &none) == GPUMEM_OK && none == NULL);
  CHECK(gpumem_free(b, 2999, 0) == GPUMEM_SIZE_MISMATCH);
  CHECK(strstr(gpumem_last_error(), "3000 bytes") != NULL);
  CHECK(gpumem_free(b, 3000, 0) == GPUMEM_OK);
  CHECK(gpumem_free(b, GPUMEM_ANY_SIZE, 0) == GPUMEM_UNKNOWN_POINTER);
  CHECK(gpumem_free(NULL, 0, 0) == GPUMEM_OK);

  size_t need = gpumem_memory_stats(0, NULL, 0);
  CHECK(need > 1);
  char *stats = malloc(need);
  CHECK(gpumem_memory_stats(0, stats, need) == need);
  CHECK(strstr(stats, "\"allocated_bytes.all.current\":1048576") != NULL);
  free(stats);

  CHECK(gpumem_set_limits(0, NULL, "8MiB") == GPUMEM_OK);
  void *big = NULL;
  CHECK(gpumem_alloc(64 << 20, 0, NULL, &big) == GPUMEM_OUT_OF_MEMORY && big == NULL);
  char oom[4096];
  CHECK(gpumem_last_oom(0, oom, sizeof oom) > 1 && strstr(oom, "out of memory") != NULL);
  CHECK(gpumem_set_limits(0, NULL, "lots") == GPUMEM_INVALID_ARGUMENT);
  CHECK(gpumem_set_limits(0, NULL, "none") == GPUMEM_OK);
  /* An empty string is refused (NULL leaves a limit alone; publishing takes NULL for the
   * directory the watching tools read). */
  CHECK(gpumem_set_limits(0, "", NULL) == GPUMEM_INVALID_ARGUMENT);
  CHECK(gpumem_publish("") == GPUMEM_INVALID_ARGUMENT && strstr(gpumem_last_error(), "NULL"));

  CHECK(gpumem_set_history(0, 1000) == GPUMEM_OK);
  CHECK(gpumem_alloc(4096, 0, NULL, &b) == GPUMEM_OK);
  CHECK(gpumem_snapshot(0, argv[1]) == GPUMEM_OK);
  CHECK(gpumem_free(b, 4096, 0) == GPUMEM_OK && gpumem_free(a, 1 << 20, 0) == GPUMEM_OK);
  uint64_t released = 0;
  CHECK(gpumem_empty_cache(0, &released) == GPUMEM_OK && released > 0);
  puts("ok");
  return 0;
}
