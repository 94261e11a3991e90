/* fxt_slow.h -- the slow-build factor of the test suite, header-only (unit tests link no support
 * object).
 *
 * One integer factor, FXT_SLOW in the environment (tests/run.sh --slow N sets it; the Makefile
 * passes 1 for make test, 3 for make check, 5 for make tsan and make valgrind, times SLOW for a
 * loaded machine), multiplies every time bound a test asserts and every deadline it waits with.
 * Without FXT_SLOW (a program run directly), FXT_SANITIZED=1 or FXT_VALGRIND=1 mean 3, else 1.
 * The e2e library reads the same variable (tests/e2e/lib/stack.mjs, SLOW).
 *
 * A bound that is a performance target belongs in a benchmark; what a test asserts is the
 * property ("the stop interrupts the wait", "the callback comes within one cadence"), and the
 * factor keeps a sanitizer, valgrind or a busy machine from failing it.
 */
#ifndef FXT_SLOW_H
#define FXT_SLOW_H

#include <stdint.h>
#include <stdlib.h>

static inline int fxt_slow(void)
{
    int v = 0; /* read each time (no shared cache: callers may be threads) */
    const char *s = getenv("FXT_SLOW");
    if (s && *s) {
        char *end;
        long l = strtol(s, &end, 10);
        if (*end == '\0' && l >= 1 && l <= 99) v = (int)l;
    }
    if (v == 0) {
        const char *san = getenv("FXT_SANITIZED"), *vg = getenv("FXT_VALGRIND");
        v = ((san && *san && *san != '0') || (vg && *vg && *vg != '0')) ? 3 : 1;
    }
    return v;
}

/* A time bound or deadline in milliseconds, stretched by the slow-build factor. */
#define FXT_MS(ms) ((int64_t)(ms) * fxt_slow())

#endif
