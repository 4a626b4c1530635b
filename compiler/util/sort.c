/* sort.c - sort.h. */
#include "sort.h"

#include <stdlib.h>

static int ascending(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void sort_doubles(double *v, size_t n) { qsort(v, n, sizeof *v, ascending); }
