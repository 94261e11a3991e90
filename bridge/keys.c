/* keys.c -- Fluxon MQ key layout (contract in keys.h). Pure: no allocation, no I/O. */
#include "keys.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

const char *fx_mq_role_name(fx_mq_role r)
{
    switch (r) {
    case FX_MQ_ROLE_PRODUCER: return "producer";
    case FX_MQ_ROLE_CONSUMER: return "consumer";
    }
    return "?";
}

/* ---- validation ------------------------------------------------------------------------------ */

fx_err fx_mq_root_validate(const char *root)
{
    if (!root) return fx_seterr(FX_EINVAL, "mq root: NULL");
    size_t n = strnlen(root, FX_MQ_ROOT_MAX + 1);
    if (n > FX_MQ_ROOT_MAX)
        return fx_seterr(FX_EINVAL, "mq root: longer than %d bytes", FX_MQ_ROOT_MAX);
    if (n < 2) return fx_seterr(FX_EINVAL, "mq root '%s': must be '/' plus at least one byte", root);
    if (root[0] != '/') return fx_seterr(FX_EINVAL, "mq root '%s': must start with '/'", root);
    if (root[n - 1] == '/') return fx_seterr(FX_EINVAL, "mq root '%s': must not end with '/'", root);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)root[i];
        if (c <= 0x20 || c >= 0x7f)
            return fx_seterr(FX_EINVAL, "mq root: byte 0x%02x at %zu is not printable ASCII", c, i);
        if (c == '/' && i + 1 < n && root[i + 1] == '/')
            return fx_seterr(FX_EINVAL, "mq root '%s': empty segment ('//')", root);
    }
    return FX_OK;
}

static bool name_ok(const char *s, size_t n)
{
    if (n == 0 || n > FX_MQ_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c == 0x7f || c == '/') return false;
    }
    return true;
}

fx_err fx_mq_name_validate(const char *name)
{
    if (!name) return fx_seterr(FX_EINVAL, "mq channel name: NULL");
    size_t n = strnlen(name, FX_MQ_NAME_MAX + 1);
    if (!name_ok(name, n))
        return fx_seterr(FX_EINVAL,
                         "mq channel name: must be 1..%d bytes without '/', space or control chars",
                         FX_MQ_NAME_MAX);
    return FX_OK;
}

fx_err fx_mq_keys_init(fx_mq_keys *k, const char *root)
{
    if (!k) return fx_seterr(FX_EINVAL, "mq keys: NULL context");
    memset(k, 0, sizeof *k);
    if (!root) root = FX_MQ_DEFAULT_ROOT;
    fx_err e = fx_mq_root_validate(root);
    if (e) return e;
    size_t n = strlen(root);
    memcpy(k->root, root, n + 1);
    k->root_len = n;
    return FX_OK;
}

/* ---- building -------------------------------------------------------------------------------- */

/* Prepare out (cleared) and check the context (k may be NULL only when use_root is false). */
static fx_err pre(const fx_mq_keys *k, bool use_root, fx_mq_key *out)
{
    if (!out) return fx_seterr(FX_EINVAL, "mq key: NULL output");
    out->len = 0;
    out->s[0] = '\0';
    if (use_root && (!k || k->root_len < 2 || k->root_len > FX_MQ_ROOT_MAX ||
                     k->root[k->root_len] != '\0'))
        return fx_seterr(FX_EINVAL, "mq key: context not initialised");
    return FX_OK;
}

static fx_err need_id(int64_t v, const char *what)
{
    if (v < 0) return fx_seterr(FX_EINVAL, "mq key: %s %" PRId64 " is negative", what, v);
    return FX_OK;
}

static fx_err need_role(fx_mq_role r)
{
    if (r != FX_MQ_ROLE_PRODUCER && r != FX_MQ_ROLE_CONSUMER)
        return fx_seterr(FX_EINVAL, "mq key: invalid role %d", (int)r);
    return FX_OK;
}

/* out = (root if k) + formatted suffix. */
static fx_err kfmt(const fx_mq_keys *k, fx_mq_key *out, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static fx_err kfmt(const fx_mq_keys *k, fx_mq_key *out, const char *fmt, ...)
{
    size_t off = 0;
    if (k) {
        memcpy(out->s, k->root, k->root_len);
        off = k->root_len;
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out->s + off, sizeof out->s - off, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof out->s - off) {
        out->s[0] = '\0';
        out->len = 0;
        return fx_seterr(FX_EINVAL, "mq key: longer than %d bytes", FX_MQ_KEY_CAP - 1);
    }
    out->len = off + (size_t)n;
    return FX_OK;
}

#define ID "%" PRId64
#define MSGID "%020" PRId64

/* Shorthands: validate the context, then each id, then format. */
#define BUILD0(k, out, ...)                                                                        \
    do {                                                                                           \
        fx_err e_ = pre((k), true, (out));                                                         \
        if (e_) return e_;                                                                         \
        return kfmt((k), (out), __VA_ARGS__);                                                      \
    } while (0)
#define BUILD1(k, out, a, an, ...)                                                                 \
    do {                                                                                           \
        fx_err e_ = pre((k), true, (out));                                                         \
        if (!e_) e_ = need_id((a), (an));                                                          \
        if (e_) return e_;                                                                         \
        return kfmt((k), (out), __VA_ARGS__);                                                      \
    } while (0)
#define BUILD2(k, out, a, an, b, bn, ...)                                                          \
    do {                                                                                           \
        fx_err e_ = pre((k), true, (out));                                                         \
        if (!e_) e_ = need_id((a), (an));                                                          \
        if (!e_) e_ = need_id((b), (bn));                                                          \
        if (e_) return e_;                                                                         \
        return kfmt((k), (out), __VA_ARGS__);                                                      \
    } while (0)

fx_err fx_mq_key_chan_meta(const fx_mq_keys *k, int64_t chan, fx_mq_key *out)
{
    BUILD1(k, out, chan, "chan", "/channels/meta/" ID, chan);
}
fx_err fx_mq_key_producer_member(const fx_mq_keys *k, int64_t chan, int64_t pidx, fx_mq_key *out)
{
    BUILD2(k, out, chan, "chan", pidx, "pidx", "/channels/" ID "/producer/producer_" ID, chan, pidx);
}
fx_err fx_mq_key_producer_weight(const fx_mq_keys *k, int64_t chan, int64_t pidx, fx_mq_key *out)
{
    BUILD2(k, out, chan, "chan", pidx, "pidx", "/channels/" ID "/producer_weight/" ID, chan, pidx);
}
fx_err fx_mq_key_consumer_member(const fx_mq_keys *k, int64_t chan, int64_t cidx, fx_mq_key *out)
{
    BUILD2(k, out, chan, "chan", cidx, "cidx", "/channels/" ID "/consumer/consumer_" ID, chan, cidx);
}
fx_err fx_mq_key_produce_offset(const fx_mq_keys *k, int64_t chan, int64_t pidx, fx_mq_key *out)
{
    BUILD2(k, out, chan, "chan", pidx, "pidx",
           "/channels/" ID "/producer_offset_of_all_producer/" ID, chan, pidx);
}
fx_err fx_mq_key_consume_offset(const fx_mq_keys *k, int64_t chan, int64_t pidx, fx_mq_key *out)
{
    BUILD2(k, out, chan, "chan", pidx, "pidx",
           "/channels/" ID "/consumer_offset_of_all_producer/" ID, chan, pidx);
}
fx_err fx_mq_prefix_chan(const fx_mq_keys *k, int64_t chan, fx_mq_key *out)
{
    BUILD1(k, out, chan, "chan", "/channels/" ID "/", chan);
}
fx_err fx_mq_prefix_producer_members(const fx_mq_keys *k, int64_t chan, fx_mq_key *out)
{
    BUILD1(k, out, chan, "chan", "/channels/" ID "/producer/", chan);
}
fx_err fx_mq_prefix_consumer_members(const fx_mq_keys *k, int64_t chan, fx_mq_key *out)
{
    BUILD1(k, out, chan, "chan", "/channels/" ID "/consumer/", chan);
}
fx_err fx_mq_prefix_producer_weights(const fx_mq_keys *k, int64_t chan, fx_mq_key *out)
{
    BUILD1(k, out, chan, "chan", "/channels/" ID "/producer_weight/", chan);
}
fx_err fx_mq_prefix_produce_offsets(const fx_mq_keys *k, int64_t chan, fx_mq_key *out)
{
    BUILD1(k, out, chan, "chan", "/channels/" ID "/producer_offset_of_all_producer/", chan);
}
fx_err fx_mq_prefix_consume_offsets(const fx_mq_keys *k, int64_t chan, fx_mq_key *out)
{
    BUILD1(k, out, chan, "chan", "/channels/" ID "/consumer_offset_of_all_producer/", chan);
}

fx_err fx_mq_key_mpmc_meta(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out)
{
    BUILD1(k, out, mpmc, "mpmc", "/mpmc_channels/" ID "/meta", mpmc);
}
fx_err fx_mq_key_mpmc_next_channel_id(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out)
{
    BUILD1(k, out, mpmc, "mpmc", "/mpmc_channels/" ID "/next_channel_id", mpmc);
}
fx_err fx_mq_key_mpmc_mpsc_channels(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out)
{
    BUILD1(k, out, mpmc, "mpmc", "/mpmc_channels/" ID "/mpsc_channels", mpmc);
}
fx_err fx_mq_key_mpmc_create_lock(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out)
{
    BUILD1(k, out, mpmc, "mpmc", "/mpmc_channels/" ID "/create_lock", mpmc);
}
fx_err fx_mq_key_mpmc_role(const fx_mq_keys *k, fx_mq_role role, int64_t mpmc, int64_t member,
                           fx_mq_key *out)
{
    fx_err e = pre(k, true, out);
    if (!e) e = need_role(role);
    if (e) return e;
    BUILD2(k, out, mpmc, "mpmc", member, "member", "/mpmc_channels/%s/" ID "/" ID,
           fx_mq_role_name(role), mpmc, member);
}
fx_err fx_mq_key_mpmc_ready(const fx_mq_keys *k, int64_t mpmc, int64_t mpsc, fx_mq_key *out)
{
    BUILD2(k, out, mpmc, "mpmc", mpsc, "mpsc", "/mpmc_channels/ready/" ID "/" ID, mpmc, mpsc);
}
fx_err fx_mq_prefix_mpmc(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out)
{
    BUILD1(k, out, mpmc, "mpmc", "/mpmc_channels/" ID "/", mpmc);
}
fx_err fx_mq_prefix_mpmc_role(const fx_mq_keys *k, fx_mq_role role, int64_t mpmc, fx_mq_key *out)
{
    fx_err e = pre(k, true, out);
    if (!e) e = need_role(role);
    if (e) return e;
    BUILD1(k, out, mpmc, "mpmc", "/mpmc_channels/%s/" ID "/", fx_mq_role_name(role), mpmc);
}
fx_err fx_mq_prefix_mpmc_ready(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out)
{
    BUILD1(k, out, mpmc, "mpmc", "/mpmc_channels/ready/" ID "/", mpmc);
}

fx_err fx_mq_key_alloc_chan_ids(const fx_mq_keys *k, fx_mq_key *out)
{
    BUILD0(k, out, "/dist_id_allocator/channels");
}
fx_err fx_mq_key_alloc_producer_idx(const fx_mq_keys *k, int64_t chan, fx_mq_key *out)
{
    BUILD1(k, out, chan, "chan", "/dist_id_allocator/channels/" ID, chan);
}
fx_err fx_mq_key_alloc_consumer_idx(const fx_mq_keys *k, int64_t chan, fx_mq_key *out)
{
    BUILD1(k, out, chan, "chan", "/dist_id_allocator/channels/" ID "/consumers", chan);
}
fx_err fx_mq_prefix_alloc_chan(const fx_mq_keys *k, int64_t chan, fx_mq_key *out)
{
    BUILD1(k, out, chan, "chan", "/dist_id_allocator/channels/" ID "/", chan);
}
fx_err fx_mq_key_alloc_mpmc_ids(const fx_mq_keys *k, fx_mq_key *out)
{
    BUILD0(k, out, "/dist_id_allocator/mpmc_channels");
}
fx_err fx_mq_key_alloc_mpmc_member_ids(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out)
{
    BUILD1(k, out, mpmc, "mpmc", "/dist_id_allocator/mpmc_channels/" ID, mpmc);
}
fx_err fx_mq_key_cluster_lease_chan(const fx_mq_keys *k, int64_t chan, fx_mq_key *out)
{
    BUILD1(k, out, chan, "chan", "/cluster_lease/channels/" ID, chan);
}
fx_err fx_mq_key_cluster_lease_id_alloc(const fx_mq_keys *k, int64_t chan, fx_mq_key *out)
{
    BUILD1(k, out, chan, "chan", "/cluster_lease/id_allocator/channels/" ID, chan);
}

static fx_err unique_key(const fx_mq_keys *k, const char *dir, const char *name, fx_mq_key *out)
{
    fx_err e = pre(k, true, out);
    if (!e) e = fx_mq_name_validate(name);
    if (e) return e;
    return kfmt(k, out, "/%s/%s", dir, name);
}
fx_err fx_mq_key_unique(const fx_mq_keys *k, const char *name, fx_mq_key *out)
{
    return unique_key(k, "mq_unique_keys", name, out);
}
fx_err fx_mq_key_unique_lock(const fx_mq_keys *k, const char *name, fx_mq_key *out)
{
    return unique_key(k, "mq_unique_locks", name, out);
}
fx_err fx_mq_prefix_unique(const fx_mq_keys *k, fx_mq_key *out)
{
    BUILD0(k, out, "/mq_unique_keys/");
}

/* Payload keys: no root. */
#define PBUILD(out, ...)                                                                           \
    do {                                                                                           \
        fx_err e_ = pre(NULL, false, (out));                                                       \
        if (e_) return e_;                                                                         \
        return kfmt(NULL, (out), __VA_ARGS__);                                                     \
    } while (0)

static fx_err need_ids(int n, const int64_t *v, const char *const *names)
{
    for (int i = 0; i < n; i++) {
        fx_err e = need_id(v[i], names[i]);
        if (e) return e;
    }
    return FX_OK;
}

fx_err fx_mq_payload_key(int64_t mpmc, int64_t chan, int64_t pidx, int64_t msgid, fx_mq_key *out)
{
    fx_err e = pre(NULL, false, out);
    if (!e) e = need_ids(4, (const int64_t[]){mpmc, chan, pidx, msgid},
                         (const char *const[]){"mpmc", "chan", "pidx", "msgid"});
    if (e) return e;
    PBUILD(out, "mpmc/" ID "/mpsc_" ID "/producer/" ID "/msg_" MSGID, mpmc, chan, pidx, msgid);
}
fx_err fx_mq_payload_prefix_mpmc(int64_t mpmc, fx_mq_key *out)
{
    fx_err e = pre(NULL, false, out);
    if (!e) e = need_id(mpmc, "mpmc");
    if (e) return e;
    PBUILD(out, "mpmc/" ID "/", mpmc);
}
fx_err fx_mq_payload_prefix_mpsc(int64_t mpmc, int64_t chan, fx_mq_key *out)
{
    fx_err e = pre(NULL, false, out);
    if (!e) e = need_ids(2, (const int64_t[]){mpmc, chan}, (const char *const[]){"mpmc", "chan"});
    if (e) return e;
    PBUILD(out, "mpmc/" ID "/mpsc_" ID "/", mpmc, chan);
}
fx_err fx_mq_payload_prefix_producer(int64_t mpmc, int64_t chan, int64_t pidx, fx_mq_key *out)
{
    fx_err e = pre(NULL, false, out);
    if (!e) e = need_ids(3, (const int64_t[]){mpmc, chan, pidx},
                         (const char *const[]){"mpmc", "chan", "pidx"});
    if (e) return e;
    PBUILD(out, "mpmc/" ID "/mpsc_" ID "/producer/" ID "/msg_", mpmc, chan, pidx);
}
fx_err fx_mq_payload_range(int64_t mpmc, int64_t chan, int64_t pidx, int64_t from,
                           int64_t to_excl, fx_mq_key *start, fx_mq_key *end)
{
    if (!start || !end) return fx_seterr(FX_EINVAL, "mq key: NULL output");
    start->len = end->len = 0;
    start->s[0] = end->s[0] = '\0';
    if (from < 0 || to_excl < from)
        return fx_seterr(FX_EINVAL, "mq key: invalid payload range [%" PRId64 ", %" PRId64 ")",
                         from, to_excl);
    fx_err e = fx_mq_payload_key(mpmc, chan, pidx, from, start);
    if (!e) e = fx_mq_payload_key(mpmc, chan, pidx, to_excl, end);
    if (e) {
        start->len = end->len = 0;
        start->s[0] = end->s[0] = '\0';
    }
    return e;
}

fx_err fx_mq_mpsc_payload_key(int64_t chan, int64_t pidx, int64_t msgid, fx_mq_key *out)
{
    fx_err e = pre(NULL, false, out);
    if (!e) e = need_ids(3, (const int64_t[]){chan, pidx, msgid},
                         (const char *const[]){"chan", "pidx", "msgid"});
    if (e) return e;
    PBUILD(out, "mpscchan_" ID "_producer_" ID "_msg_" MSGID, chan, pidx, msgid);
}
fx_err fx_mq_mpsc_payload_prefix_chan(int64_t chan, fx_mq_key *out)
{
    fx_err e = pre(NULL, false, out);
    if (!e) e = need_id(chan, "chan");
    if (e) return e;
    PBUILD(out, "mpscchan_" ID "_", chan);
}
fx_err fx_mq_mpsc_payload_prefix_producer(int64_t chan, int64_t pidx, fx_mq_key *out)
{
    fx_err e = pre(NULL, false, out);
    if (!e) e = need_ids(2, (const int64_t[]){chan, pidx}, (const char *const[]){"chan", "pidx"});
    if (e) return e;
    PBUILD(out, "mpscchan_" ID "_producer_" ID "_msg_", chan, pidx);
}

/* ---- parsing --------------------------------------------------------------------------------- */

typedef struct cur {
    const char *p;
    size_t n, i;
} cur;

static bool lit(cur *c, const char *s)
{
    size_t l = strlen(s);
    if (c->n - c->i < l || memcmp(c->p + c->i, s, l) != 0) return false;
    c->i += l;
    return true;
}

static bool root(cur *c, const fx_mq_keys *k)
{
    if (!k || k->root_len < 2 || k->root_len > FX_MQ_ROOT_MAX) return false;
    if (c->n - c->i < k->root_len || memcmp(c->p + c->i, k->root, k->root_len) != 0) return false;
    c->i += k->root_len;
    return true;
}

static bool isdig(char ch) { return ch >= '0' && ch <= '9'; }

/* Canonical decimal: "0" or [1-9][0-9]*, value <= INT64_MAX, maximal run of digits. */
static bool id(cur *c, int64_t *out)
{
    size_t s = c->i, e = s;
    while (e < c->n && isdig(c->p[e])) e++;
    size_t nd = e - s;
    if (nd == 0 || nd > 19) return false;
    if (nd > 1 && c->p[s] == '0') return false;
    uint64_t v = 0;
    for (size_t i = s; i < e; i++) v = v * 10u + (uint64_t)(c->p[i] - '0'); /* <= 19 digits: no wrap */
    if (v > (uint64_t)INT64_MAX) return false;
    *out = (int64_t)v;
    c->i = e;
    return true;
}

/* Exactly FX_MQ_MSGID_WIDTH digits, value <= INT64_MAX. */
static bool padded(cur *c, int64_t *out)
{
    if (c->n - c->i < FX_MQ_MSGID_WIDTH) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < FX_MQ_MSGID_WIDTH; i++) {
        char ch = c->p[c->i + i];
        if (!isdig(ch)) return false;
        unsigned d = (unsigned)(ch - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10u) return false;
        v = v * 10u + d;
    }
    c->i += FX_MQ_MSGID_WIDTH;
    *out = (int64_t)v;
    return true;
}

static bool end(const cur *c) { return c->i == c->n; }

static fx_err start(cur *c, fx_slice key, const char *what)
{
    if (!key.data && key.len) return fx_seterr(FX_EINVAL, "mq %s key: NULL data", what);
    if (key.len >= FX_MQ_KEY_CAP)
        return fx_seterr(FX_EPROTO, "mq %s key: longer than %d bytes", what, FX_MQ_KEY_CAP - 1);
    c->p = key.data ? key.data : "";
    c->n = key.len;
    c->i = 0;
    return FX_OK;
}

static fx_err bad(const char *what, const cur *c)
{
    /* Show at most 80 bytes of the key; the detail must stay printable. */
    char shown[81];
    size_t n = c->n < 80 ? c->n : 80, j = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)c->p[i];
        shown[j++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    shown[j] = '\0';
    return fx_seterr(FX_EPROTO, "mq %s key: malformed at byte %zu: '%s%s'", what, c->i, shown,
                     c->n > 80 ? "..." : "");
}

static void set(int64_t *dst, int64_t v)
{
    if (dst) *dst = v;
}

fx_err fx_mq_parse_chan_meta_key(const fx_mq_keys *k, fx_slice key, int64_t *chan)
{
    cur c = {0};
    int64_t a = 0;
    fx_err e = start(&c, key, "channel meta");
    if (e) return e;
    if (!(root(&c, k) && lit(&c, "/channels/meta/") && id(&c, &a) && end(&c)))
        return bad("channel meta", &c);
    set(chan, a);
    return FX_OK;
}

/* R/channels/{chan}/<mid>{id} */
static fx_err parse_chan2(const fx_mq_keys *k, fx_slice key, const char *mid, const char *what,
                          int64_t *chan, int64_t *x)
{
    cur c = {0};
    int64_t a = 0, b = 0;
    fx_err e = start(&c, key, what);
    if (e) return e;
    if (!(root(&c, k) && lit(&c, "/channels/") && id(&c, &a) && lit(&c, mid) && id(&c, &b) &&
          end(&c)))
        return bad(what, &c);
    set(chan, a);
    set(x, b);
    return FX_OK;
}

fx_err fx_mq_parse_producer_member_key(const fx_mq_keys *k, fx_slice key, int64_t *chan,
                                       int64_t *pidx)
{
    return parse_chan2(k, key, "/producer/producer_", "producer member", chan, pidx);
}
fx_err fx_mq_parse_consumer_member_key(const fx_mq_keys *k, fx_slice key, int64_t *chan,
                                       int64_t *cidx)
{
    return parse_chan2(k, key, "/consumer/consumer_", "consumer member", chan, cidx);
}
fx_err fx_mq_parse_producer_weight_key(const fx_mq_keys *k, fx_slice key, int64_t *chan,
                                       int64_t *pidx)
{
    return parse_chan2(k, key, "/producer_weight/", "producer weight", chan, pidx);
}
fx_err fx_mq_parse_produce_offset_key(const fx_mq_keys *k, fx_slice key, int64_t *chan,
                                      int64_t *pidx)
{
    return parse_chan2(k, key, "/producer_offset_of_all_producer/", "produce offset", chan, pidx);
}
fx_err fx_mq_parse_consume_offset_key(const fx_mq_keys *k, fx_slice key, int64_t *chan,
                                      int64_t *pidx)
{
    return parse_chan2(k, key, "/consumer_offset_of_all_producer/", "consume offset", chan, pidx);
}

fx_err fx_mq_parse_mpmc_meta_key(const fx_mq_keys *k, fx_slice key, int64_t *mpmc)
{
    cur c = {0};
    int64_t a = 0;
    fx_err e = start(&c, key, "mpmc meta");
    if (e) return e;
    if (!(root(&c, k) && lit(&c, "/mpmc_channels/") && id(&c, &a) && lit(&c, "/meta") && end(&c)))
        return bad("mpmc meta", &c);
    set(mpmc, a);
    return FX_OK;
}

fx_err fx_mq_parse_ready_key(const fx_mq_keys *k, fx_slice key, int64_t *mpmc, int64_t *mpsc)
{
    cur c = {0};
    int64_t a = 0, b = 0;
    fx_err e = start(&c, key, "ready");
    if (e) return e;
    if (!(root(&c, k) && lit(&c, "/mpmc_channels/ready/") && id(&c, &a) && lit(&c, "/") &&
          id(&c, &b) && end(&c)))
        return bad("ready", &c);
    set(mpmc, a);
    set(mpsc, b);
    return FX_OK;
}

fx_err fx_mq_parse_role_key(const fx_mq_keys *k, fx_slice key, fx_mq_role *role, int64_t *mpmc,
                            int64_t *member)
{
    cur c = {0};
    int64_t a = 0, b = 0;
    fx_mq_role r = FX_MQ_ROLE_PRODUCER;
    fx_err e = start(&c, key, "role");
    if (e) return e;
    bool ok = root(&c, k) && lit(&c, "/mpmc_channels/");
    if (ok) {
        if (lit(&c, "producer/"))
            r = FX_MQ_ROLE_PRODUCER;
        else if (lit(&c, "consumer/"))
            r = FX_MQ_ROLE_CONSUMER;
        else
            ok = false;
    }
    if (!(ok && id(&c, &a) && lit(&c, "/") && id(&c, &b) && end(&c))) return bad("role", &c);
    if (role) *role = r;
    set(mpmc, a);
    set(member, b);
    return FX_OK;
}

fx_err fx_mq_parse_unique_key(const fx_mq_keys *k, fx_slice key, char *name_out, size_t name_cap)
{
    cur c = {0};
    if (!name_out || name_cap <= FX_MQ_NAME_MAX)
        return fx_seterr(FX_EINVAL, "mq unique key: name buffer must hold %d bytes",
                         FX_MQ_NAME_MAX + 1);
    fx_err e = start(&c, key, "unique");
    if (e) return e;
    if (!(root(&c, k) && lit(&c, "/mq_unique_keys/"))) return bad("unique", &c);
    size_t n = c.n - c.i;
    if (!name_ok(c.p + c.i, n)) return bad("unique", &c);
    memcpy(name_out, c.p + c.i, n);
    name_out[n] = '\0';
    return FX_OK;
}

fx_err fx_mq_parse_payload_key(fx_slice key, int64_t *mpmc, int64_t *chan, int64_t *pidx,
                               int64_t *msgid)
{
    cur c = {0};
    int64_t a = 0, b = 0, p = 0, m = 0;
    fx_err e = start(&c, key, "payload");
    if (e) return e;
    if (!(lit(&c, "mpmc/") && id(&c, &a) && lit(&c, "/mpsc_") && id(&c, &b) &&
          lit(&c, "/producer/") && id(&c, &p) && lit(&c, "/msg_") && padded(&c, &m) && end(&c)))
        return bad("payload", &c);
    set(mpmc, a);
    set(chan, b);
    set(pidx, p);
    set(msgid, m);
    return FX_OK;
}

fx_err fx_mq_parse_mpsc_payload_key(fx_slice key, int64_t *chan, int64_t *pidx, int64_t *msgid)
{
    cur c = {0};
    int64_t b = 0, p = 0, m = 0;
    fx_err e = start(&c, key, "mpsc payload");
    if (e) return e;
    if (!(lit(&c, "mpscchan_") && id(&c, &b) && lit(&c, "_producer_") && id(&c, &p) &&
          lit(&c, "_msg_") && padded(&c, &m) && end(&c)))
        return bad("mpsc payload", &c);
    set(chan, b);
    set(pidx, p);
    set(msgid, m);
    return FX_OK;
}

fx_err fx_mq_parse_id_after(fx_slice key, fx_slice prefix, int64_t *out)
{
    cur c = {0};
    int64_t v = 0;
    fx_err e = start(&c, key, "prefixed");
    if (e) return e;
    if (!prefix.data && prefix.len) return fx_seterr(FX_EINVAL, "mq key: NULL prefix data");
    if (c.n < prefix.len || (prefix.len && memcmp(c.p, prefix.data, prefix.len) != 0))
        return bad("prefixed", &c);
    c.i = prefix.len;
    if (!(id(&c, &v) && end(&c))) return bad("prefixed", &c);
    set(out, v);
    return FX_OK;
}
