/* fxt_soft.h -- checks a cmocka test makes while one of its threads still runs (header-only).
 *
 * A failing cmocka assert longjmps out of the test function at once: a thread that still uses the
 * frame (its argument, a barrier, a gate it waits on) is left running on memory that is gone, or
 * blocked forever. Between pthread_create and pthread_join, check with FXT_SOFT_CHECK instead: it
 * records the first failure (file, line, expression) and goes on, so the test still releases and
 * joins its threads; FXT_SOFT_END then fails the test with that first failure. Include after
 * <cmocka.h>.
 */
#ifndef FXT_SOFT_H
#define FXT_SOFT_H

#include <stdio.h>

typedef struct fxt_soft {
    const char *file; /* NULL: no failure so far */
    int line;
    char what[200];
} fxt_soft;

#define FXT_SOFT_CHECK(s, cond)                                                                  \
    do {                                                                                         \
        if (!(cond) && !(s).file) {                                                              \
            (s).file = __FILE__;                                                                 \
            (s).line = __LINE__;                                                                 \
            snprintf((s).what, sizeof (s).what, "%s", #cond);                                    \
        }                                                                                        \
    } while (0)

/* After every thread was joined: fail with the first recorded failure, if any. */
#define FXT_SOFT_END(s)                                                                          \
    do {                                                                                         \
        if ((s).file)                                                                            \
            fail_msg("%s:%d: check failed: %s (seen while a thread ran; reported after joining "  \
                     "it)", (s).file, (s).line, (s).what);                                       \
    } while (0)

#endif
