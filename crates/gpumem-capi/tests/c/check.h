/* The test programs' check: on failure, says which line and condition failed with gpumem's
 * last error, and returns 1 from the function (main) it stands in. */
#ifndef GPUMEM_TEST_CHECK_H
#define GPUMEM_TEST_CHECK_H

#include <stdio.h>

#include "gpumem.h"

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "check failed at line %d: %s (last error: %s)\n", __LINE__, #cond, \
              gpumem_last_error());                                                 \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

#endif
