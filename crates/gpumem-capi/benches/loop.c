/* The C side of benches/alloc_free.rs: argv[1] alloc+free pairs of 4096 bytes through
 * gpumem_alloc/gpumem_free on device 0; prints the nanoseconds the loop took. */
#include "gpumem.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000;
  void *p = NULL;
  /* Warm the pool: the first allocation makes it and its segment. */
  if (gpumem_alloc(4096, 0, NULL, &p) != GPUMEM_OK || gpumem_free(p, 4096, 0) != GPUMEM_OK) {
    fprintf(stderr, "%s\n", gpumem_last_error());
    return 1;
  }
  struct timespec start, end;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (long i = 0; i < n; i++) {
    gpumem_alloc(4096, 0, NULL, &p);
    gpumem_free(p, 4096, 0);
  }
  clock_gettime(CLOCK_MONOTONIC, &end);
  printf("%lld\n", (long long)(end.tv_sec - start.tv_sec) * 1000000000LL + (end.tv_nsec - start.tv_nsec));
  return 0;
}
