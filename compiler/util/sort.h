/* sort.h - ascending order of a run of doubles: the timings the cost
 * model, the calibration and the report take medians of. */
#ifndef CLEAVE_SORT_H
#define CLEAVE_SORT_H

#include <stddef.h>

void sort_doubles(double *v, size_t n);

#endif
