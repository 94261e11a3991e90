/* fxt_check.h -- the checks and the pause the C integration tests share (header-only).
 *
 * CHECK(call): the call must return FX_OK, else the test fails with the call's text, the error's
 * name and its detail. Include after <cmocka.h> and after a project header that declares
 * fx_errname / fx_err_detail (fx_err.h, reached through the header under test).
 * fxt_nap_ms(ms): sleep ms milliseconds, resumed after a signal. Only as the tests' README allows
 * a sleep (an observation window, the shape of a fault, a pacing), never as synchronisation.
 */
#ifndef FXT_CHECK_H
#define FXT_CHECK_H

#include <errno.h>
#include <time.h>

#define CHECK(call)                                                                              \
    do {                                                                                         \
        fx_err chk_e_ = (call);                                                                  \
        if (chk_e_ != FX_OK)                                                                     \
            fail_msg("%s: %s (%s)", #call, fx_errname(chk_e_), fx_err_detail());                 \
    } while (0)

static inline void fxt_nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

#endif
