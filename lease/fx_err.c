#include "fx_err.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    const char *text;
} fx_err_tbl[] = {
    {"FX_OK", "success"},
    {"FX_EINVAL", "invalid argument"},
    {"FX_ENOMEM", "out of memory"},
    {"FX_ETIMEDOUT", "deadline exceeded"},
    {"FX_EUNAVAIL", "no endpoint reachable"},
    {"FX_EPROTO", "malformed response"},
    {"FX_ENOTFOUND", "not found"},
    {"FX_ELEASE_EXPIRED", "lease expired or not found"},
    {"FX_ETXN_TOO_MANY_OPS", "too many operations in one transaction"},
    {"FX_ETOO_LARGE", "request too large"},
    {"FX_ECOMPACTED", "required revision has been compacted"},
    {"FX_EFUTURE_REV", "required revision is a future revision"},
    {"FX_EAUTH", "authentication failed"},
    {"FX_EPERM", "permission denied"},
    {"FX_ENOSPACE", "backend out of space or message over the size limit"},
    {"FX_EEXISTS", "already exists"},
    {"FX_EKEY_BEING_WRITTEN", "key being written"},
    {"FX_ECLOSED", "closed"},
    {"FX_ECANCELED", "cancelled"},
    {"FX_ESERVER", "server error"},
    {"FX_EFULL", "channel full"},
    {"FX_ELEASE_LOST", "closed because lease lost"},
    {"FX_EDUPLICATE_KEY", "duplicate key in one transaction"},
};

_Static_assert(sizeof fx_err_tbl / sizeof fx_err_tbl[0] == FX__COUNT,
               "fx_err_tbl must have one entry per fx_err code");

static _Thread_local char fx_detail[512];
static _Thread_local bool fx_held;

const char *fx_strerror(fx_err e)
{
    if ((unsigned)e >= FX__COUNT) return "unknown error";
    return fx_err_tbl[e].text;
}

const char *fx_errname(fx_err e)
{
    if ((unsigned)e >= FX__COUNT) return "FX_E?";
    return fx_err_tbl[e].name;
}

const char *fx_err_detail(void) { return fx_detail; }

fx_err fx_seterr(fx_err e, const char *fmt, ...)
{
    if (fx_held) return e;
    char buf[sizeof fx_detail]; /* the arguments may point into fx_detail */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) buf[0] = '\0';
    memcpy(fx_detail, buf, strlen(buf) + 1);
    return e;
}

fx_err fx_err_wrap(fx_err e, const char *fmt, ...)
{
    if (fx_held) return e;
    char buf[sizeof fx_detail];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    size_t used = n < 0 ? 0 : strlen(buf);
    size_t old = strlen(fx_detail);
    if (old > sizeof buf - 1 - used) old = sizeof buf - 1 - used;
    memcpy(buf + used, fx_detail, old);
    buf[used + old] = '\0';
    memcpy(fx_detail, buf, used + old + 1);
    return e;
}

void fx_clearerr(void)
{
    if (!fx_held) fx_detail[0] = '\0';
}

bool fx_err_hold(void)
{
    bool prev = fx_held;
    fx_held = true;
    return prev;
}

void fx_err_release(bool prev) { fx_held = prev; }
