#include "fx_err.h"

#include <stdio.h>

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
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fx_detail, sizeof fx_detail, fmt, ap);
    va_end(ap);
    return e;
}

void fx_clearerr(void) { fx_detail[0] = '\0'; }
