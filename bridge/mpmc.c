/* mpmc.c -- Fluxon MQ MPMC channels: name mapping, creator/attach, member lease and role keys,
 * producer LRU rotation over ready sub-MPSCs, consumer claim/create, close order.
 * Contracts: fluxon_mq.h (public), mq_int.h (the MPSC layer and the client root).
 * Protocol: Fluxon MQ's MPMC design (docs/ARCHITECTURE.md "Keys and objects", "Leases"), with
 * the reference implementation's defects fixed where noted.
 *
 * Decisions (beyond the reference):
 *  - resolve() keeps no lease handle. It creates the MPMC (one mpmc id per creation; id-allocator
 *    cluster lease with long_lease_ttl_s, payload lease from the KV store, metadata lease granted
 *    last so its TTL starts as late as possible), publishes the name mapping and returns. The
 *    MPMC then lives one TTL (>= min_ttl_s >= 2 s) on its own; every open() -- the creator's
 *    first open and every later attach alike -- registers all three shared leases with a probe
 *    (fixed: in the reference implementation only the creator kept them alive; here any member
 *    keeps the channel alive). A caller that resolves and
 *    opens later than one TTL gets FX_ELEASE_EXPIRED ("mpmc meta stale") from open and resolves
 *    again: a mapping whose meta is gone or whose leases are expired is replaced (CAS on the old
 *    value), so the retry heals. A losing creator leaves its MPMC unregistered to expire.
 *  - Liveness of a mapping in resolve: meta present and decodable (so the metadata lease is
 *    alive), id-allocator lease TimeToLive > 0, payload lease keepalive OK. A transport error is
 *    returned as is (never a reason to replace a mapping).
 *  - Lease loss: member, metadata and payload handles have an on_expired callback that only sets
 *    a flag and wakes waiters (no I/O on the manager thread). The next call on the endpoint runs
 *    the endpoint's own close and returns FX_ELEASE_LOST; later calls return FX_ECLOSED. A
 *    sub-endpoint that reports FX_ELEASE_LOST is handled the same way (consumer); a producer
 *    first asks the backends (TimeToLive / KV keepalive, only on this rare path) whether one of
 *    the member's own leases is gone (then the endpoint closes: FX_ELEASE_LOST), else it drops
 *    that sub-producer and re-binds it on its next turn.
 *  - Fencing of deliveries: a consumer whose member lease etcd has not confirmed for its
 *    TTL (fx_lease_confirmed_until_ms over; etcd unreachable) hands out nothing (fx_mpmc_get:
 *    FX_EUNAVAIL; fx_mpmc_consumer_fenced for messages already got): etcd may have expired it and
 *    another member may be draining the sub-MPSC. The lease manager then either renews it or
 *    reports it expired (the endpoint closes). So a bridge cut off from etcd does not read on from
 *    its lost sub-MPSC the moment etcd answers again, before the keepalive says "expired".
 *  - Every member also keeps alive the global-long (id-allocator) lease of every sub-MPSC it
 *    knows (keeper_sync: at open, when a producer's list grows, on ready-watch events), so a
 *    sub-MPSC whose binders all left stays bindable after long_lease_ttl_s while any member
 *    lives. Consumers sync only at open.
 *  - No create lock (a lock held across the ~20 round trips of a creation would make 1,000 claims
 *    take minutes to open). A consumer creates and binds its sub-MPSC in parallel with others; only
 *    the read-check-publish step (view, consumer count, CAS of list+ready) is serialised among the
 *    threads of one process (client publish_mu), so they do not lose CASes to each other; across
 *    processes the CAS decides and the loser re-reads. A creation that turns out not to be needed
 *    (an unready sub-MPSC appeared, or no more consumers than sub-MPSCs) is rolled back strictly
 *    (below).
 *  - Reclaim (fx_mpmc_reclaim, and every consumer's close for its own sub-MPSC):
 *    sub-MPSCs follow the consumers in use. Protocol: read in one txn (revision R) the list, the
 *    ready key of S, the consumer role count, S's meta and every key under R/channels/{S}/
 *    (memberships, weights, offsets). Keep S unless: S is listed, unready, has no consumer
 *    membership, no backlog (each producer's produce offset < its consume offset), and the list
 *    has more entries than max(1, active consumers) (the one left is the store-and-forward
 *    sub-MPSC). Then ONE txn: compare list == the value read, ready(S) absent, mod_revision < R+1
 *    on S's meta and on every key under S's prefix; on success put the list without S (its
 *    lease kept), delete S's meta, channel keys, counters and cluster-lease keys; afterwards
 *    revoke S's global-long lease (best effort) and drop this client's hold on it. Races:
 *     - a producer binding S (its first put there): the membership txn compares that S's meta
 *       exists (mpsc.c member_txn) and puts keys under S's prefix. Landing after R and before
 *       the reclaim txn, it makes the reclaim's compare fail (S kept; the reclaim decides again);
 *       landing after the reclaim txn, it fails for want of the meta (FX_ENOTFOUND) and the
 *       put routes elsewhere. Every put txn compares the meta too. So a bind and a reclaim never
 *       both win: nothing is acknowledged into an unlisted sub-MPSC.
 *     - a producer that put into S after R changed an offset: the compare fails, S is kept (its
 *       backlog then keeps it); a producer that puts after the txn finds its membership key gone
 *       (its put txn compares it), its chunk fails with nothing stored (a payload written to a
 *       split plane is deleted again) and it reroutes: its sub-producer is dropped, the list
 *       re-read; nothing acknowledged is lost.
 *     - a consumer claiming S: its ready put or membership before the txn fails the compare;
 *       after it, its bind finds no meta, it deletes its ready key and claims or creates another.
 *     - two reclaimers (of S, or of S and T): the list CAS lets one win; the other re-reads
 *       (a few attempts) and decides again. Publishers race the same way (the list CAS).
 *     - an ambiguous txn error: either nothing or everything applied (one txn); the next
 *       reclaim or the next read settles it.
 *    In one process reclaims and publishes take publish_mu, so they do not lose CASes to each
 *    other.
 *  - A publish txn that fails ambiguously (timeout) is verified by re-reading the list; if that
 *    is impossible, the sub-MPSC is closed but its keys are not rolled back (a rollback of a
 *    channel that did get published would be worse). When it was not published, its keys are
 *    unlisted (no reclaim sees them) but bound to its own global-long lease, not renewed once
 *    its creator let go (the publish txn moves the meta to the metadata lease): they go with
 *    that lease (`retention`) instead of living as long as the channel.
 *  - A rollback of an unpublished sub-MPSC is strict: delete, read back, up to 3 times; when
 *    keys are still there (or the read-back fails) the open / put reports that error.
 *  - Member ids: one CAS per open (no range cache).
 *
 * Lifecycle: lifecycle.h's fx_life (m->lf, under mu). A lease loss is recorded by the expiry
 * callback and armed only when it makes the endpoint close itself (member_fail_lost): the
 * FX_ELEASE_LOST of a close the user asked first is not reported.
 *
 * Locking: each endpoint has one mutex `mu` (state, flags, producer routing tables) never held
 * across I/O, and a condvar `cv` (close, lease loss, ready-set changes, a reserved sub-MPSC
 * released). Producer puts run concurrently: each reserves the sub-MPSC it writes (`busy`, under
 * `mu`), so puts in flight at once go to distinct sub-MPSCs and one sub-producer never sees two
 * puts; routing (candidates, creating the first sub-MPSC) is serialised by `cand_mu`, which
 * close never takes. Lease handles are released outside `mu`
 * (fx_lease_release waits for a running callback, and callbacks take `mu`).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_log.h"
#include "fx_time.h"
#include "mq_int.h"
#include "plane.h"

#define MPMC_PUBLISH_ATTEMPTS 10
#define MPMC_RESOLVE_ATTEMPTS 8
#define MPMC_CREATE_FIRST_ATTEMPTS 3
#define MPMC_ROLLBACK_ATTEMPTS 3
#define MPMC_LIST_REFRESH_MS 1000
#define MPMC_FULL_POLL_MIN_MS 5
#define MPMC_FULL_POLL_MAX_MS 100
#define MPMC_BUSY_WAIT_MS 10000 /* longest wait for a sub-MPSC another put reserved */
#define MPMC_MIN_CLOSE_STEP_MS 100

/* ---- small helpers ---------------------------------------------------------------------------- */

static fx_slice ks(const fx_mq_key *k) { return fx_mq_key_slice(k); }

static fx_op op_put(fx_slice key, fx_slice val, int64_t lease)
{
    fx_op o = {.type = FX_OP_PUT};
    o.u.put.key = key;
    o.u.put.value = val;
    o.u.put.lease = lease;
    return o;
}

static fx_op op_del(fx_slice key, fx_slice end)
{
    fx_op o = {.type = FX_OP_DELETE};
    o.u.del.key = key;
    o.u.del.range_end = end;
    return o;
}

static fx_op op_range(fx_slice key, fx_slice end)
{
    fx_op o = {.type = FX_OP_RANGE};
    o.u.range.key = key;
    o.u.range.range_end = end;
    return o;
}

static fx_cmp cmp_absent(fx_slice key)
{
    return (fx_cmp){.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL, .key = key, .num = 0};
}

static fx_cmp cmp_value(fx_slice key, fx_slice val)
{
    return (fx_cmp){.target = FX_CMP_VALUE, .result = FX_CMP_EQUAL, .key = key, .value = val};
}

/* Deadline of one step of a best-effort close pass. */
static int step_ms(int64_t deadline)
{
    int64_t l = fx_ms_left(deadline);
    return l < MPMC_MIN_CLOSE_STEP_MS ? MPMC_MIN_CLOSE_STEP_MS : (int)l;
}

static bool ids_has(const int64_t *ids, size_t n, int64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static fx_err bytes_copy(fx_bytes *dst, const fx_bytes *src)
{
    dst->data = malloc(src->len + 1);
    if (!dst->data) return fx_seterr(FX_ENOMEM, "mpmc: out of memory");
    if (src->len) memcpy(dst->data, src->data, src->len);
    dst->data[src->len] = 0;
    dst->len = src->len;
    return FX_OK;
}

/* ---- the MPMC view: mpsc_channels list + ready set, read at one revision ---------------------- */

typedef struct mpmc_view {
    bool list_present;
    fx_bytes list_raw; /* exact value (CAS snapshot) */
    int64_t *list;
    size_t n_list;
    int64_t *ready; /* sub-MPSC ids that have a ready key */
    size_t n_ready;
} mpmc_view;

static void view_free(mpmc_view *v)
{
    fx_bytes_free(&v->list_raw);
    free(v->list);
    free(v->ready);
    memset(v, 0, sizeof *v);
}

static fx_err view_from(const fx_mq_keys *keys, int64_t mpmc, const fx_range_resp *lr,
                        const fx_range_resp *rr, mpmc_view *v)
{
    memset(v, 0, sizeof *v);
    fx_err e = FX_OK;
    if (lr && lr->n_kvs > 0) {
        v->list_present = true;
        const fx_bytes *val = &lr->kvs[0].value;
        if ((e = bytes_copy(&v->list_raw, val))) goto fail;
        if ((e = fx_mq_mpsc_list_decode(val->data, val->len, &v->list, &v->n_list))) goto fail;
    }
    if (rr && rr->n_kvs > 0) {
        v->ready = calloc(rr->n_kvs, sizeof *v->ready);
        if (!v->ready) {
            e = fx_seterr(FX_ENOMEM, "mpmc: out of memory");
            goto fail;
        }
        for (size_t i = 0; i < rr->n_kvs; i++) {
            int64_t m = -1, id = -1;
            fx_slice k = {rr->kvs[i].key.data, rr->kvs[i].key.len};
            if (fx_mq_parse_ready_key(keys, k, &m, &id) != FX_OK || m != mpmc) {
                FX_WRN("mpmc %" PRId64 ": ignoring malformed ready key '%.*s'", mpmc, (int)k.len,
                       (const char *)k.data);
                continue;
            }
            v->ready[v->n_ready++] = id;
        }
    }
    return FX_OK;
fail:
    view_free(v);
    return e;
}

/* Read mpsc_channels and the ready prefix in one txn (one revision). */
static fx_err read_view(fx_mq_client *c, int64_t mpmc, mpmc_view *v)
{
    memset(v, 0, sizeof *v);
    fx_mq_key lk, rp;
    fx_err e = fx_mq_key_mpmc_mpsc_channels(&c->keys, mpmc, &lk);
    if (!e) e = fx_mq_prefix_mpmc_ready(&c->keys, mpmc, &rp);
    if (e) return e;
    uint8_t rend[FX_MQ_KEY_CAP];
    size_t rl = fx_prefix_end(ks(&rp), rend);
    fx_op ops[2] = {op_range(ks(&lk), (fx_slice){NULL, 0}), op_range(ks(&rp), (fx_slice){rend, rl})};
    fx_txn_req t = {.success = ops, .n_success = 2};
    fx_txn_resp r = {0};
    e = fx_etcd_txn(c->etcd, &t, &r, c->op_timeout_ms);
    if (!e && (!r.succeeded || r.n_responses != 2 || r.responses[0].type != FX_OP_RANGE ||
               r.responses[1].type != FX_OP_RANGE))
        e = fx_seterr(FX_EPROTO, "mpmc %" PRId64 ": unexpected view txn response", mpmc);
    if (!e) e = view_from(&c->keys, mpmc, &r.responses[0].u.range, &r.responses[1].u.range, v);
    fx_txn_resp_free(&r);
    return e;
}

static bool view_ready(const mpmc_view *v, int64_t id) { return ids_has(v->ready, v->n_ready, id); }

/* ---- rollback of an unpublished sub-MPSC ------------------------------------------------------- */

/* Keys of an unpublished sub-MPSC still present (one txn of count-only ranges over the five
 * targets of the rollback delete, so one revision). */
static fx_err rollback_left(fx_mq_client *c, const fx_op *dels, int64_t *left)
{
    fx_op rq[5];
    for (int i = 0; i < 5; i++) {
        rq[i] = op_range(dels[i].u.del.key, dels[i].u.del.range_end);
        rq[i].u.range.count_only = true;
    }
    fx_txn_req t = {.success = rq, .n_success = 5};
    fx_txn_resp r = {0};
    fx_err e = fx_etcd_txn(c->etcd, &t, &r, c->op_timeout_ms);
    if (!e && (!r.succeeded || r.n_responses != 5))
        e = fx_seterr(FX_EPROTO, "rollback read-back: %zu responses, want 5", r.n_responses);
    *left = 0;
    for (size_t i = 0; !e && i < r.n_responses; i++) {
        if (r.responses[i].type != FX_OP_RANGE) {
            e = fx_seterr(FX_EPROTO, "rollback read-back: response %zu is not a range", i);
            break;
        }
        *left += r.responses[i].u.range.count;
    }
    fx_txn_resp_free(&r);
    return e;
}

/* Strict rollback (Fluxon MQ's _rollback_unpublished_channel): close the sub-consumer, then delete
 * every channel-scoped key and read them back, up to MPMC_ROLLBACK_ATTEMPTS times. FX_OK only once
 * a read-back found none left; otherwise an error (FX_EEXISTS: keys still present; or the error
 * of the read-back) whose detail names the sub-MPSC. The caller reports it instead of its own
 * error: an unpublished channel that outlives its creator's open must not go unnoticed.
 * long_lease: the sub-MPSC's own global-long lease (0: read from its cluster-lease key); revoked
 * once the rollback is verified, so an ambiguous create leaks no lease (one left would live
 * `retention`). */
static fx_err rollback_unpublished(fx_mq_client *c, int64_t mpmc, int64_t chan,
                                   fx_mpsc_consumer *sub, int64_t long_lease)
{
    if (sub) {
        fx_err e = fx_mpsc_consumer_close(sub);
        if (e && e != FX_ECLOSED)
            FX_WRN("mpmc %" PRId64 ": rollback of sub-MPSC %" PRId64 ": consumer close: %s (%s)",
                   mpmc, chan, fx_errname(e), fx_err_detail());
        fx_mpsc_consumer_free(sub);
    }
    fx_mq_key meta, cl, cll, pc, pa;
    fx_err e = fx_mq_key_chan_meta(&c->keys, chan, &meta);
    if (!e) e = fx_mq_key_cluster_lease_chan(&c->keys, chan, &cl);
    if (!e) e = fx_mq_key_cluster_lease_id_alloc(&c->keys, chan, &cll);
    if (!e) e = fx_mq_prefix_chan(&c->keys, chan, &pc);
    if (!e) e = fx_mq_prefix_alloc_chan(&c->keys, chan, &pa);
    if (e)
        return fx_seterr(e, "mpmc %" PRId64 ": rollback of unpublished sub-MPSC %" PRId64 ": %s",
                         mpmc, chan, fx_err_detail());
    if (long_lease <= 0) { /* best effort: absent when the create never landed */
        fx_kv lkv = {0};
        if (fx_etcd_get(c->etcd, ks(&cll), &lkv, c->op_timeout_ms) == FX_OK &&
            fx_mq_lease_id_decode(lkv.value.data, lkv.value.len, &long_lease) != FX_OK)
            long_lease = 0;
        fx_kv_free(&lkv);
    }
    uint8_t pce[FX_MQ_KEY_CAP], pae[FX_MQ_KEY_CAP];
    size_t pcl = fx_prefix_end(ks(&pc), pce), pal = fx_prefix_end(ks(&pa), pae);
    fx_slice none = {NULL, 0};
    fx_op ops[5] = {op_del(ks(&meta), none), op_del(ks(&cl), none), op_del(ks(&cll), none),
                    op_del(ks(&pc), (fx_slice){pce, pcl}), op_del(ks(&pa), (fx_slice){pae, pal})};
    fx_txn_req t = {.success = ops, .n_success = 5};
    /* The last failed delete and read-back (code and text), for the message below. */
    fx_err del_e = FX_OK, ver_e = FX_OK;
    char del_txt[512] = "", ver_txt[512] = "";
    int64_t left = -1;
    for (int i = 0; i < MPMC_ROLLBACK_ATTEMPTS; i++) {
        fx_txn_resp r = {0};
        e = fx_etcd_txn(c->etcd, &t, &r, c->op_timeout_ms);
        fx_txn_resp_free(&r);
        if (e) { /* maybe applied anyway: the read-back decides */
            del_e = e;
            snprintf(del_txt, sizeof del_txt, "%s", fx_err_detail());
        }
        fx_err ve = rollback_left(c, ops, &left);
        if (!ve && left == 0) {
            FX_INF("mpmc %" PRId64 ": rolled back unpublished sub-MPSC %" PRId64 " (verified)",
                   mpmc, chan);
            if (long_lease > 0) {
                fx_err re = fx_etcd_lease_revoke(c->etcd, long_lease, c->op_timeout_ms);
                if (re && re != FX_ENOTFOUND)
                    FX_WRN("mpmc %" PRId64 ": rolled back sub-MPSC %" PRId64 ": revoke of its "
                           "lease %" PRId64 ": %s (it expires after retention)", mpmc, chan,
                           long_lease, fx_errname(re));
            }
            return FX_OK;
        }
        if (ve) {
            ver_e = ve;
            snprintf(ver_txt, sizeof ver_txt, "%s", fx_err_detail());
            left = -1;
        }
    }
    char msg[1200]; /* (fx_seterr keeps 511 bytes) */
    fx_err r;
    if (left > 0) {
        r = FX_EEXISTS;
        snprintf(msg, sizeof msg, "mpmc %" PRId64 ": rollback of unpublished sub-MPSC %" PRId64
                 " failed: %" PRId64 " key(s) still present after %d delete attempts (last "
                 "delete: %s)", mpmc, chan, left, MPMC_ROLLBACK_ATTEMPTS,
                 del_e ? del_txt : "ok");
    } else {
        r = ver_e ? ver_e : FX_EPROTO;
        snprintf(msg, sizeof msg, "mpmc %" PRId64 ": rollback of unpublished sub-MPSC %" PRId64
                 " could not be verified after %d attempts: %s", mpmc, chan,
                 MPMC_ROLLBACK_ATTEMPTS, ver_txt);
    }
    FX_ERR("%s; its keys go with its own lease (not renewed once unbound; at most retention)",
           msg);
    return fx_seterr(r, "%s", msg);
}

/* rollback_unpublished after `cause` failed (the calling thread's detail is the cause's text;
 * FX_OK: a publish lost without an error): the cause with its text once the rollback is verified;
 * else the rollback's error, whose detail names both: "<rollback failure> (after: <cause>)". */
static fx_err rollback_after(fx_mq_client *c, int64_t mpmc, int64_t chan, fx_mpsc_consumer *sub,
                             int64_t long_lease, fx_err cause)
{
    /* Two texts in one message: the rollback's own calls record theirs in the detail. */
    char cause_txt[512];
    snprintf(cause_txt, sizeof cause_txt, "%s", cause ? fx_err_detail() : "a lost publish");
    fx_err re = rollback_unpublished(c, mpmc, chan, sub, long_lease);
    if (re) return fx_seterr(re, "%s (after: %s)", fx_err_detail(), cause_txt);
    return cause ? fx_seterr(cause, "%s", cause_txt) : FX_OK;
}

/* ---- resolve: name -> MPMC id ----------------------------------------------------------------- */

/* Create an MPMC: meta + next_channel_id under a fresh metadata lease. */
static fx_err mpmc_create(fx_mq_client *c, const fx_mq_chan_cfg *cfg, int64_t *out)
{
    fx_err e = fx__mq_cfg_validate(c, cfg);
    if (e) return e;
    fx_mq_key ck;
    if ((e = fx_mq_key_alloc_mpmc_ids(&c->keys, &ck))) return e;
    int64_t id = 0, il = 0, pl = 0, ml = 0;
    int64_t ret = cfg->retention_s ? cfg->retention_s : cfg->ttl_s;
    if ((e = fx__mq_alloc_ids(c, &ck, 0, 1, &id))) return e; /* one id per creation */
    /* Every data lease gets the retention: the channel outlives its last member that long. */
    if ((e = fx__mq_grant(c, ret, &il))) return e;
    if ((e = fx_kv_allocate_lease(c->kv, ret, &pl, c->op_timeout_ms))) return e;
    if ((e = fx__mq_grant(c, ret, &ml))) return e; /* last: its TTL starts now */
    fx_mq_mpmc_meta m = {.capacity = cfg->capacity, .ttl_seconds = cfg->ttl_s,
                         .created_at = (double)fx_wall_ns() / 1e9, .metadata_lease_id = ml,
                         .payload_lease_id = pl, .id_allocator_cluster_lease_id = il,
                         .retention_seconds = ret};
    char *json = NULL;
    if ((e = fx_mq_mpmc_meta_encode(&m, &json))) return e;
    fx_mq_key mk, nk;
    e = fx_mq_key_mpmc_meta(&c->keys, id, &mk);
    if (!e) e = fx_mq_key_mpmc_next_channel_id(&c->keys, id, &nk);
    if (e) {
        free(json);
        return e;
    }
    fx_cmp cmp[2] = {cmp_absent(ks(&mk)), cmp_absent(ks(&nk))};
    fx_op ops[2] = {op_put(ks(&mk), FX_SLICE_STR(json), ml),
                    op_put(ks(&nk), FX_SLICE_STR(FX_MQ_NEXT_CHANNEL_ID_VALUE), ml)};
    fx_txn_req t = {.cmp = cmp, .n_cmp = 2, .success = ops, .n_success = 2};
    fx_txn_resp r = {0};
    e = fx_etcd_txn(c->etcd, &t, &r, c->op_timeout_ms);
    bool won = !e && r.succeeded;
    fx_txn_resp_free(&r);
    free(json);
    if (e) return e;
    if (!won) return fx_seterr(FX_EEXISTS, "mpmc %" PRId64 ": meta already exists", id);
    *out = id;
    return FX_OK;
}

/* Write the MPMC meta of `id` if its key is still at mod revision mod_rev (CAS), keeping the
 * key's lease. *won false: the meta changed meanwhile (the caller reads it again). */
static fx_err meta_cas_put(fx_mq_client *c, int64_t id, const fx_mq_mpmc_meta *nm, int64_t mod_rev,
                           int64_t lease, bool *won)
{
    *won = false;
    fx_mq_key mk;
    fx_err e = fx_mq_key_mpmc_meta(&c->keys, id, &mk);
    if (e) return e;
    char *json = NULL;
    if ((e = fx_mq_mpmc_meta_encode(nm, &json))) return e;
    fx_cmp cmp = {.target = FX_CMP_MOD, .result = FX_CMP_EQUAL, .key = ks(&mk), .num = mod_rev};
    fx_op put = op_put(ks(&mk), FX_SLICE_STR(json), lease);
    fx_txn_req t = {.cmp = &cmp, .n_cmp = 1, .success = &put, .n_success = 1};
    fx_txn_resp r = {0};
    e = fx_etcd_txn(c->etcd, &t, &r, c->op_timeout_ms);
    *won = !e && r.succeeded;
    fx_txn_resp_free(&r);
    free(json);
    return e;
}

/* TTL of the channel's data leases (metadata, payload): its retention; a channel created before
 * retention existed has no other record than ttl_seconds (the TTL they were granted with). */
static int64_t meta_data_ttl(const fx_mq_mpmc_meta *mt)
{
    return mt->retention_seconds ? mt->retention_seconds : mt->ttl_seconds;
}

/* TTL of the id-allocator cluster lease and of the sub-MPSCs' global-long leases. Legacy channels
 * granted those with the client's long TTL: register with the smaller of the two (renewing a
 * lease more often than needed is harmless; less often would let it expire). */
static int64_t meta_long_ttl(const fx_mq_client *c, const fx_mq_mpmc_meta *mt)
{
    int64_t d = meta_data_ttl(mt);
    if (mt->retention_seconds && !mt->retention_legacy) return d;
    return d < c->long_ttl_s ? d : c->long_ttl_s;
}

/* The state of a mapped MPMC, read once. */
typedef struct mpmc_state {
    bool alive;        /* false only when provably gone */
    const char *why;   /* why it is gone (static string) */
    fx_mq_mpmc_meta meta;
    int64_t mod_rev;   /* of the meta key */
    int64_t meta_lease;
} mpmc_state;

/* Is the MPMC `id` alive? st->alive false only when it is provably gone: its meta is absent (the
 * metadata lease expired: no member kept it alive for its retention) or its payload lease expired
 * (its messages are gone with it). An error for "cannot tell" (transport error, timeout, an
 * undecodable meta): never a reason to replace a channel. */
static fx_err mpmc_check(fx_mq_client *c, const char *name, int64_t id, mpmc_state *st)
{
    memset(st, 0, sizeof *st);
    fx_mq_key mk;
    fx_err e = fx_mq_key_mpmc_meta(&c->keys, id, &mk);
    if (e) return e;
    fx_kv kv = {0};
    e = fx_etcd_get(c->etcd, ks(&mk), &kv, c->op_timeout_ms);
    if (e == FX_ENOTFOUND) {
        st->why = "its meta expired";
        return FX_OK;
    }
    if (e) return e;
    e = fx_mq_mpmc_meta_decode(kv.value.data, kv.value.len, &st->meta);
    st->mod_rev = kv.mod_revision;
    st->meta_lease = kv.lease;
    fx_kv_free(&kv);
    if (e)
        return fx_seterr(FX_EPROTO, "channel '%s': mpmc %" PRId64 ": undecodable meta at %s (%s): "
                         "not replacing a channel that may hold messages; repair or delete the key",
                         name, id, mk.s, fx_err_detail());
    e = fx_kv_keepalive_lease(c->kv, st->meta.payload_lease_id, NULL, c->op_timeout_ms);
    if (e == FX_ELEASE_EXPIRED) {
        st->why = "its payload lease expired";
        return FX_OK;
    }
    if (e) return e;
    st->alive = true;
    return FX_OK;
}

static void fmt_secs(char *buf, size_t cap, int64_t s)
{
    if (s > 0 && s % 86400 == 0)
        snprintf(buf, cap, "%" PRId64 "d", s / 86400);
    else if (s > 0 && s % 3600 == 0)
        snprintf(buf, cap, "%" PRId64 "h", s / 3600);
    else
        snprintf(buf, cap, "%" PRId64 "s", s);
}

/* Reconcile cfg with the meta of a live channel (see fx_mpmc_resolve). FX_EEXISTS when the meta
 * changed under us (the caller reads it again). */
static fx_err reconcile(fx_mq_client *c, const char *name, const fx_mq_chan_cfg *cfg, int64_t id,
                        const mpmc_state *st)
{
    const fx_mq_mpmc_meta *mt = &st->meta;
    fx_mq_mpmc_meta nm = *mt;
    char what[512] = "", a[32], b[32];
    size_t wl = 0;
    if (!mt->retention_seconds) {
        nm.retention_seconds = mt->ttl_seconds;
        nm.retention_legacy = true;
        fmt_secs(a, sizeof a, nm.retention_seconds);
        wl += (size_t)snprintf(what + wl, sizeof what - wl,
                               "created before retention existed: recorded retention %s (the TTL "
                               "its data leases were granted with; they cannot change it)", a);
    }
    if (cfg && cfg->retention_s && cfg->retention_s != nm.retention_seconds) {
        fmt_secs(a, sizeof a, cfg->retention_s);
        fmt_secs(b, sizeof b, nm.retention_seconds);
        if (!nm.retention_legacy)
            return fx_seterr(FX_EINVAL, "channel '%s': retention %s differs from the channel's "
                             "retention %s (its data leases keep the TTL they were created with): "
                             "set retention to %s for this channel", name, a, b, b);
        FX_WRN("channel '%s' (mpmc %" PRId64 "): retention %s does not apply to a channel created "
               "before retention existed: its data leases keep their TTL of %s (a running bridge "
               "keeps them alive)", name, id, a, b);
    }
    if (cfg && cfg->ttl_s && cfg->ttl_s != mt->ttl_seconds) {
        nm.ttl_seconds = cfg->ttl_s;
        wl += (size_t)snprintf(what + wl, wl < sizeof what ? sizeof what - wl : 0,
                               "%sttl_seconds %" PRId64 " -> %" PRId64
                               " (member leases granted from now on)", wl ? "; " : "",
                               mt->ttl_seconds, cfg->ttl_s);
    }
    if (!wl) return FX_OK;
    bool won = false;
    fx_err e = meta_cas_put(c, id, &nm, st->mod_rev, st->meta_lease, &won);
    if (e) return e;
    if (!won) return fx_seterr(FX_EEXISTS, "channel '%s': meta changed during reconcile", name);
    FX_INF("channel '%s' (mpmc %" PRId64 "): %s", name, id, what);
    return FX_OK;
}

static fx_err resolve_locked(fx_mq_client *c, const char *name, const fx_mq_chan_cfg *cfg,
                             int64_t *out)
{
    fx_mq_key uk;
    fx_err e = fx_mq_key_unique(&c->keys, name, &uk);
    if (e) return e;
    for (int attempt = 0; attempt < MPMC_RESOLVE_ATTEMPTS; attempt++) {
        fx_kv kv = {0};
        e = fx_etcd_get(c->etcd, ks(&uk), &kv, c->op_timeout_ms);
        if (e && e != FX_ENOTFOUND) return e;
        bool present = e == FX_OK;
        int64_t old = -1;
        if (present) {
            if (fx_mq_id_decode(kv.value.data, kv.value.len, &old) != FX_OK) {
                FX_ERR("channel '%s': malformed mapping value (no channel can be found from it): "
                       "replacing it", name);
                old = -1;
            } else {
                mpmc_state st;
                e = mpmc_check(c, name, old, &st);
                if (!e && st.alive) {
                    e = reconcile(c, name, cfg, old, &st);
                    fx_kv_free(&kv);
                    if (e == FX_EEXISTS) continue; /* the meta changed: read again */
                    if (e) return e;
                    *out = old;
                    return FX_OK;
                }
                if (e) {
                    fx_kv_free(&kv);
                    return e;
                }
                char rb[32];
                fmt_secs(rb, sizeof rb, st.meta.retention_seconds
                                            ? st.meta.retention_seconds
                                            : (cfg && cfg->retention_s ? cfg->retention_s
                                                                       : (cfg ? cfg->ttl_s : 0)));
                FX_ERR("channel '%s': mpmc %" PRId64 " is gone (%s: either no bridge kept it "
                       "alive for longer than its retention of %s, or a store lost its keys: an "
                       "evicting or flushed Redis, etcd restored from an old snapshot); its "
                       "messages are gone: replacing the mapping with a new channel",
                       name, old, st.why, rb);
            }
        }
        int64_t id = 0;
        e = mpmc_create(c, cfg, &id);
        if (e) {
            fx_kv_free(&kv);
            return e;
        }
        char dec[FX_MQ_DEC_BUF];
        size_t dl = fx_mq_dec_format(id, dec);
        fx_cmp cmp = present ? cmp_value(ks(&uk), (fx_slice){kv.value.data, kv.value.len})
                             : cmp_absent(ks(&uk));
        fx_op put = op_put(ks(&uk), (fx_slice){dec, dl}, 0);
        fx_op get = op_range(ks(&uk), (fx_slice){NULL, 0});
        fx_txn_req t = {.cmp = &cmp, .n_cmp = 1, .success = &put, .n_success = 1, .failure = &get,
                        .n_failure = 1};
        fx_txn_resp r = {0};
        e = fx_etcd_txn(c->etcd, &t, &r, c->op_timeout_ms);
        fx_kv_free(&kv);
        if (e) {
            fx_txn_resp_free(&r);
            return e;
        }
        if (r.succeeded) {
            fx_txn_resp_free(&r);
            FX_INF("channel '%s': created mpmc %" PRId64, name, id);
            *out = id;
            return FX_OK;
        }
        /* Lost: the MPMC just created is left to expire (nothing registered its leases). */
        int64_t winner = -1;
        bool have = !present && r.n_responses == 1 && r.responses[0].type == FX_OP_RANGE &&
                    r.responses[0].u.range.n_kvs == 1 &&
                    fx_mq_id_decode(r.responses[0].u.range.kvs[0].value.data,
                                    r.responses[0].u.range.kvs[0].value.len, &winner) == FX_OK;
        fx_txn_resp_free(&r);
        FX_DBG("channel '%s': lost the mapping race; mpmc %" PRId64 " left to expire", name, id);
        if (have) {
            *out = winner;
            return FX_OK;
        }
        /* A replacement race: re-read and validate whatever is there now. */
    }
    return fx_seterr(FX_ETIMEDOUT, "channel '%s': mapping still contended after %d attempts", name,
                     MPMC_RESOLVE_ATTEMPTS);
}

fx_err fx_mpmc_resolve(fx_mq_client *c, const char *name, const fx_mq_chan_cfg *cfg,
                       int64_t *out_mpmc)
{
    if (!c || !name || !out_mpmc) return fx_seterr(FX_EINVAL, "mpmc resolve: NULL argument");
    fx_err e = fx_mq_name_validate(name);
    if (e) return e;
    if ((e = fx__mq_new_op_enter(c))) return e;
    e = resolve_locked(c, name, cfg, out_mpmc);
    fx__mq_op_leave(c);
    return e;
}

/* ---- the member part shared by producers and consumers (the reference's MPMCChannel) ---------- */

typedef struct mpmc_member {
    fx_mq_client *c;
    fx__mq_endpoint ep; /* ep.close / ep.self: the endpoint's public close */
    fx_mq_role role;
    int64_t mpmc;
    fx_mq_mpmc_meta meta;
    int64_t member;       /* -1 until allocated */
    int64_t member_lease; /* 0 until granted */
    char member_dec[FX_MQ_DEC_BUF];
    size_t member_dec_len;
    fx__mpsc_parent parent;
    fx_mq_key role_key;
    bool role_put;
    bool registered;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    fx_lease *h_meta, *h_payload, *h_idalloc, *h_member;
    fx_life lf; /* lifecycle (lifecycle.h): constructing until member_construct_end; fault =
                 * a lease the endpoint depends on expired (fault_lease), armed when it made
                 * the endpoint close itself; closers = threads inside close() */

    /* Keeper of the sub-MPSCs' own global-long (id-allocator) leases: see keeper_sync. Shared
     * by every member of this MPMC in this client (taken on first sync, given back at close). */
    pthread_mutex_t kmu; /* keeper (the pointer) */
    struct mpmc_keeper *keeper;
} mpmc_member;

/* The keeper of one MPMC in one client: one hold per sub-MPSC, whatever the number of members
 * (a hold per consumer would cost one read and one probe per listed sub-MPSC per open: a
 * million calls and handles for a thousand claims). Listed in the
 * client root (c->keepers, under c->mu) while refs > 0. */
typedef struct mpmc_keeper {
    int64_t mpmc;
    int refs;             /* under c->mu */
    struct mpmc_keeper *next;
    pthread_mutex_t mu;   /* holds */
    struct long_hold *holds;
    size_t n_holds, cap_holds;
} mpmc_keeper;

typedef struct long_hold {
    int64_t chan;
    fx_lease *h; /* NULL: that lease is gone (not retried) */
} long_hold;

static const char *role_name(const mpmc_member *m) { return fx_mq_role_name(m->role); }

/* Open and constructed (mu held). */
static bool member_open_locked(const mpmc_member *m)
{
    return m->lf.state == FX_LIFE_OPEN && !m->lf.constructing;
}

static fx_err member_init(mpmc_member *m, fx_mq_client *c, int64_t mpmc, fx_mq_role role,
                          fx_err (*close_fn)(void *), void *self)
{
    m->c = c;
    m->mpmc = mpmc;
    m->role = role;
    m->member = -1;
    m->ep.close = close_fn;
    m->ep.self = self;
    fx_life_init(&m->lf, true);
    if (pthread_mutex_init(&m->mu, NULL) != 0) return fx_seterr(FX_ENOMEM, "mpmc: mutex init");
    if (pthread_mutex_init(&m->kmu, NULL) != 0) {
        pthread_mutex_destroy(&m->mu);
        return fx_seterr(FX_ENOMEM, "mpmc: mutex init");
    }
    if (fx_cond_init_monotonic(&m->cv) != 0) {
        pthread_mutex_destroy(&m->kmu);
        pthread_mutex_destroy(&m->mu);
        return fx_seterr(FX_ENOMEM, "mpmc: condvar init");
    }
    return FX_OK;
}

static void keeper_release(mpmc_member *m);

static void member_destroy(mpmc_member *m)
{
    keeper_release(m);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->kmu);
    pthread_mutex_destroy(&m->mu);
}

/* The member's keeper (shared: see mpmc_keeper), taken on first use. NULL: out of memory. */
static mpmc_keeper *keeper_of(mpmc_member *m)
{
    pthread_mutex_lock(&m->kmu);
    mpmc_keeper *k = m->keeper;
    if (!k) {
        fx_mq_client *c = m->c;
        pthread_mutex_lock(&c->mu);
        for (k = c->keepers; k && k->mpmc != m->mpmc; k = k->next) {}
        if (!k && (k = calloc(1, sizeof *k)) != NULL) {
            if (pthread_mutex_init(&k->mu, NULL) != 0) {
                free(k);
                k = NULL;
            } else {
                k->mpmc = m->mpmc;
                k->next = c->keepers;
                c->keepers = k;
            }
        }
        if (k) k->refs++;
        pthread_mutex_unlock(&c->mu);
        m->keeper = k;
    }
    pthread_mutex_unlock(&m->kmu);
    return k;
}

static bool keeper_knows(mpmc_keeper *k, int64_t chan)
{
    pthread_mutex_lock(&k->mu);
    bool r = false;
    for (size_t i = 0; i < k->n_holds && !r; i++) r = k->holds[i].chan == chan;
    pthread_mutex_unlock(&k->mu);
    return r;
}

/* Every member keeps the global-long lease of every sub-MPSC it knows alive (registered with a
 * probe, released at close), not only of those it binds: a sub-MPSC whose binders all left must
 * still be bindable by a later member after long_lease_ttl_s (the channel lives
 * while any member lives). The holds are shared by the members of the MPMC in this client
 * (mpmc_keeper): a sub-MPSC already held costs nothing. Best effort: a read or registration
 * failure is retried on the next sync; a lease found gone is remembered and not retried. Runs
 * with no lock held. */
/* Add a hold (h may be NULL: a lease found gone, remembered) unless chan is held already. */
static void keeper_put(mpmc_keeper *k, int64_t chan, fx_lease *h)
{
    pthread_mutex_lock(&k->mu);
    bool dup = false;
    for (size_t j = 0; j < k->n_holds && !dup; j++) dup = k->holds[j].chan == chan;
    bool added = false;
    if (!dup && k->n_holds < FX_MQ_MAX_MPSC_CHANNELS) {
        size_t need = k->n_holds + 1;
        if (need > k->cap_holds) {
            size_t nc = k->cap_holds ? k->cap_holds * 2 : 8;
            long_hold *na = realloc(k->holds, nc * sizeof *na);
            if (na) {
                k->holds = na;
                k->cap_holds = nc;
            }
        }
        if (need <= k->cap_holds) {
            k->holds[k->n_holds++] = (long_hold){.chan = chan, .h = h};
            added = true;
        }
    }
    pthread_mutex_unlock(&k->mu);
    if (!added) fx_lease_release(h);
}

static void keeper_sync(mpmc_member *m, const int64_t *ids, size_t n)
{
    fx_mq_client *c = m->c;
    mpmc_keeper *k = keeper_of(m);
    if (!k) return;
    for (size_t i = 0; i < n; i++) {
        if (keeper_knows(k, ids[i])) continue;
        fx_mq_key mk;
        if (fx_mq_key_chan_meta(&c->keys, ids[i], &mk) != FX_OK) continue;
        fx_kv kv = {0};
        fx_err e = fx_etcd_get(c->etcd, ks(&mk), &kv, c->op_timeout_ms);
        fx_lease *h = NULL;
        if (e == FX_OK) {
            fx_mq_chan_meta cm;
            e = fx_mq_chan_meta_decode(kv.value.data, kv.value.len, &cm);
            fx_kv_free(&kv);
            if (e == FX_OK)
                e = fx__mq_hold(c, false, m->parent.long_ttl_s, cm.global_long_lease_id, false,
                                NULL, NULL, &h);
            if (e == FX_EPROTO) e = FX_ENOTFOUND;
        }
        if (e == FX_ENOTFOUND || e == FX_ELEASE_EXPIRED) {
            FX_WRN("mpmc %" PRId64 ": sub-MPSC %" PRId64 ": meta or id-allocator lease gone (%s)",
                   m->mpmc, ids[i], fx_err_detail());
        } else if (e) {
            FX_DBG("mpmc %" PRId64 ": sub-MPSC %" PRId64 ": long lease not held yet: %s", m->mpmc,
                   ids[i], fx_errname(e));
            continue;
        }
        pthread_mutex_lock(&m->mu);
        bool closing = m->lf.state >= FX_LIFE_CLOSING;
        pthread_mutex_unlock(&m->mu);
        keeper_put(k, ids[i], h);
        if (closing) return;
    }
}

/* A sub-MPSC this member has just created (its long lease granted moments ago): into the keeper
 * without a read or a probe. Best effort, as keeper_sync. */
static void keeper_add_new(mpmc_member *m, int64_t chan, int64_t long_lease)
{
    mpmc_keeper *k = keeper_of(m);
    if (!k || keeper_knows(k, chan)) return;
    fx_lease *h = NULL;
    if (fx__mq_hold(m->c, false, m->parent.long_ttl_s, long_lease, true, NULL, NULL, &h)) return;
    keeper_put(k, chan, h);
}

/* Give the member's keeper back; the last member of the MPMC in this client releases the holds.
 * Idempotent. */
static void keeper_release(mpmc_member *m)
{
    pthread_mutex_lock(&m->kmu);
    mpmc_keeper *k = m->keeper;
    m->keeper = NULL;
    pthread_mutex_unlock(&m->kmu);
    if (!k) return;
    fx_mq_client *c = m->c;
    pthread_mutex_lock(&c->mu);
    bool last = --k->refs == 0;
    if (last) {
        mpmc_keeper **pp = &c->keepers;
        while (*pp && *pp != k) pp = &(*pp)->next;
        if (*pp) *pp = k->next;
    }
    pthread_mutex_unlock(&c->mu);
    if (!last) return;
    for (size_t i = 0; i < k->n_holds; i++) fx_lease_release(k->holds[i].h);
    free(k->holds);
    pthread_mutex_destroy(&k->mu);
    free(k);
}

static void on_lease_expired(void *arg, fx_lease *h, int64_t lease_id)
{
    (void)h;
    mpmc_member *m = arg;
    pthread_mutex_lock(&m->mu);
    fx_life_lease_lost(&m->lf, lease_id);
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    FX_WRN("mpmc %" PRId64 " %s %" PRId64 ": lease %" PRId64 " expired: closing the endpoint",
           m->mpmc, role_name(m), m->member, lease_id);
}

/* The error of a call on an endpoint that is not open. mu held. */
static fx_err closed_err_locked(mpmc_member *m)
{
    if (fx_life_gate(&m->lf) == FX_ELEASE_LOST)
        return fx_seterr(FX_ELEASE_LOST, "mpmc %" PRId64 " %s %" PRId64 ": closed: lease %" PRId64
                         " lost", m->mpmc, role_name(m), m->member, m->lf.fault_lease);
    return fx_seterr(FX_ECLOSED, "mpmc %" PRId64 " %s %" PRId64 ": closed", m->mpmc, role_name(m),
                     m->member);
}

/* Close because of a lost lease (unless already closing), then report as closed_err_locked. */
static fx_err member_fail_lost(mpmc_member *m, int64_t lease)
{
    pthread_mutex_lock(&m->mu);
    if (member_open_locked(m)) {
        fx_life_lease_lost(&m->lf, lease);
        fx_life_fault_arm(&m->lf); /* the loss closes the endpoint: reported once */
        pthread_mutex_unlock(&m->mu);
        m->ep.close(m->ep.self);
        pthread_mutex_lock(&m->mu);
    }
    fx_err e = closed_err_locked(m);
    pthread_mutex_unlock(&m->mu);
    return e;
}

/* Entry check of every data-path call: closed -> FX_ECLOSED (FX_ELEASE_LOST once after a lease
 * loss); a lease lost while open -> close now. No RPC. */
static fx_err member_gate(mpmc_member *m)
{
    pthread_mutex_lock(&m->mu);
    if (member_open_locked(m) && !m->lf.fault) { /* flags set by the manager before the callbacks */
        fx_lease *hs[3] = {m->h_member, m->h_meta, m->h_payload};
        for (int i = 0; i < 3; i++)
            if (hs[i] && fx_lease_is_expired(hs[i])) {
                fx_life_lease_lost(&m->lf, fx_lease_id(hs[i]));
                break;
            }
    }
    if (member_open_locked(m) && m->lf.fault) {
        int64_t l = m->lf.fault_lease;
        pthread_mutex_unlock(&m->mu);
        return member_fail_lost(m, l);
    }
    fx_err e = member_open_locked(m) ? FX_OK : closed_err_locked(m);
    pthread_mutex_unlock(&m->mu);
    return e;
}

/* Did one of the member's own leases (member, metadata, payload) expire? */
static bool member_leases_expired(mpmc_member *m, int64_t *which)
{
    pthread_mutex_lock(&m->mu);
    bool r = m->lf.fault != FX_OK;
    *which = m->lf.fault_lease;
    fx_lease *hs[3] = {m->h_member, m->h_meta, m->h_payload};
    for (int i = 0; i < 3 && !r; i++)
        if (hs[i] && fx_lease_is_expired(hs[i])) {
            r = true;
            *which = fx_lease_id(hs[i]);
        }
    pthread_mutex_unlock(&m->mu);
    return r;
}

/* Ask the backends whether the member, metadata or payload lease is gone (rare paths only: a
 * sub-endpoint reported a lost lease that the LeaseManager has not reported yet). */
static bool member_probe_leases(mpmc_member *m, int64_t *which)
{
    fx_mq_client *c = m->c;
    int64_t ids[2] = {m->member_lease, m->meta.metadata_lease_id};
    for (int i = 0; i < 2; i++) {
        int64_t ttl = 0;
        if (ids[i] > 0 &&
            fx_etcd_lease_timetolive(c->etcd, ids[i], &ttl, NULL, c->op_timeout_ms) == FX_OK &&
            ttl <= 0) {
            *which = ids[i];
            return true;
        }
    }
    if (m->meta.payload_lease_id > 0 &&
        fx_kv_keepalive_lease(c->kv, m->meta.payload_lease_id, NULL, c->op_timeout_ms) ==
            FX_ELEASE_EXPIRED) {
        *which = m->meta.payload_lease_id;
        return true;
    }
    return false;
}

/* During construction: FX_ECLOSED when close was asked, FX_ELEASE_LOST when a lease expired. */
static fx_err member_construct_check(mpmc_member *m)
{
    pthread_mutex_lock(&m->mu);
    fx_err e = FX_OK;
    if (m->lf.close_req)
        e = fx_seterr(FX_ECLOSED, "mpmc %" PRId64 ": closed during open", m->mpmc);
    else if (m->lf.fault)
        e = fx_seterr(FX_ELEASE_LOST, "mpmc %" PRId64 ": lease %" PRId64 " lost during open",
                      m->mpmc, m->lf.fault_lease);
    pthread_mutex_unlock(&m->mu);
    return e;
}

/* Wait up to ms, woken early by close, lease loss or cv broadcasts. Returns true when the
 * endpoint must stop (close asked / not open any more / lease lost). */
static bool member_wait(mpmc_member *m, int64_t ms)
{
    pthread_mutex_lock(&m->mu);
    bool stop = m->lf.stop; /* close asked, lease lost, or closing */
    if (!stop && ms > 0) {
        struct timespec ts = fx_deadline_ts(fx_now_ms() + ms);
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
        stop = m->lf.stop;
    }
    pthread_mutex_unlock(&m->mu);
    return stop;
}

/* The id-allocator cluster lease expired while the channel's meta and payloads live on (a legacy
 * channel: that lease had its own, independent TTL). Every member registers it, so no member of
 * the channel is alive: grant a fresh one and CAS it into the meta (the meta keeps its lease);
 * concurrent attachers converge (a lost CAS re-reads). Never a reason to replace the channel. */
static fx_err member_renew_idalloc(mpmc_member *m, int64_t ttl, fx_lease **out)
{
    fx_mq_client *c = m->c;
    fx_mq_key mk;
    fx_err e = fx_mq_key_mpmc_meta(&c->keys, m->mpmc, &mk);
    if (e) return e;
    int64_t old = m->meta.id_allocator_cluster_lease_id;
    for (int attempt = 0; attempt < 3; attempt++) {
        fx_kv kv = {0};
        if ((e = fx_etcd_get(c->etcd, ks(&mk), &kv, c->op_timeout_ms))) return e;
        fx_mq_mpmc_meta cur;
        e = fx_mq_mpmc_meta_decode(kv.value.data, kv.value.len, &cur);
        if (e) {
            fx_kv_free(&kv);
            return e;
        }
        bool granted = false;
        if (cur.id_allocator_cluster_lease_id == old) {
            int64_t nl = 0;
            if ((e = fx__mq_grant(c, ttl, &nl))) {
                fx_kv_free(&kv);
                return e;
            }
            cur.id_allocator_cluster_lease_id = nl;
            bool won = false;
            e = meta_cas_put(c, m->mpmc, &cur, kv.mod_revision, kv.lease, &won);
            fx_kv_free(&kv);
            if (!e && !won) { /* lost the CAS: the fresh lease guards nothing: revoke it */
                fx_err re = fx_etcd_lease_revoke(c->etcd, nl, c->op_timeout_ms);
                if (re && re != FX_ENOTFOUND)
                    FX_DBG("mpmc %" PRId64 ": revoke of unused lease %" PRId64 ": %s", m->mpmc,
                           nl, fx_errname(re));
                continue;
            }
            if (e) return e;
            granted = true;
            FX_WRN("mpmc %" PRId64 ": id-allocator lease %" PRId64 " had expired; renewed as %" PRId64,
                   m->mpmc, old, nl);
        } else {
            fx_kv_free(&kv);
        }
        m->meta.id_allocator_cluster_lease_id = cur.id_allocator_cluster_lease_id;
        e = fx__mq_hold(c, false, ttl, cur.id_allocator_cluster_lease_id, granted, NULL, NULL, out);
        if (e != FX_ELEASE_EXPIRED) return e;
        old = cur.id_allocator_cluster_lease_id;
    }
    return fx_seterr(FX_ELEASE_EXPIRED, "mpmc %" PRId64 ": id-allocator lease could not be renewed",
                     m->mpmc);
}

/* Attach: read and validate meta, register every shared lease (probe), allocate the member id,
 * grant and register the member lease (late), put the role key. */
static fx_err member_attach(mpmc_member *m)
{
    fx_mq_client *c = m->c;
    fx_mq_key mk;
    fx_err e = fx_mq_key_mpmc_meta(&c->keys, m->mpmc, &mk);
    if (e) return e;
    fx_kv kv = {0};
    e = fx_etcd_get(c->etcd, ks(&mk), &kv, c->op_timeout_ms);
    if (e == FX_ENOTFOUND)
        return fx_seterr(FX_ENOTFOUND, "mpmc %" PRId64 ": no meta (not created or expired)",
                         m->mpmc);
    if (e) return e;
    e = fx_mq_mpmc_meta_decode(kv.value.data, kv.value.len, &m->meta);
    fx_kv_free(&kv);
    if (e) return e;
    const fx_mq_mpmc_meta *mt = &m->meta;

    int64_t data_ttl = meta_data_ttl(mt), long_ttl = meta_long_ttl(c, mt);
    fx_lease *h = NULL;
    /* The shared leases: probed unless another member in this client keeps them alive. */
    e = fx__mq_hold_shared(c, false, data_ttl, mt->metadata_lease_id, on_lease_expired, m, &h);
    if (!e) {
        pthread_mutex_lock(&m->mu);
        m->h_meta = h;
        pthread_mutex_unlock(&m->mu);
        e = fx__mq_hold_shared(c, true, data_ttl, mt->payload_lease_id, on_lease_expired, m, &h);
    }
    if (e == FX_ELEASE_EXPIRED) {
        return fx_seterr(FX_ELEASE_EXPIRED, "mpmc %" PRId64 ": mpmc meta stale (%s)", m->mpmc,
                         fx_err_detail());
    }
    if (e) return e;
    pthread_mutex_lock(&m->mu);
    m->h_payload = h;
    pthread_mutex_unlock(&m->mu);
    e = fx__mq_hold_shared(c, false, long_ttl, mt->id_allocator_cluster_lease_id, NULL, NULL, &h);
    if (e == FX_ELEASE_EXPIRED) e = member_renew_idalloc(m, long_ttl, &h);
    if (e) return e;
    pthread_mutex_lock(&m->mu);
    m->h_idalloc = h;
    pthread_mutex_unlock(&m->mu);
    if ((e = member_construct_check(m))) return e;

    fx_mq_key ak;
    if ((e = fx_mq_key_alloc_mpmc_member_ids(&c->keys, m->mpmc, &ak))) return e;
    /* The member-id counter lives under the id-allocator cluster lease (every member holds it),
     * so the channel leaves no counter behind once its last member is gone. */
    if ((e = fx__mq_alloc_ids(c, &ak, mt->id_allocator_cluster_lease_id, 1, &m->member)))
        return e;
    m->member_dec_len = fx_mq_dec_format(m->member, m->member_dec);
    if ((e = member_construct_check(m))) return e;

    /* Member lease: granted late, registered without a probe. */
    int64_t ml = 0;
    if ((e = fx__mq_grant(c, mt->ttl_seconds, &ml))) return e;
    m->member_lease = ml;
    e = fx__mq_hold(c, false, mt->ttl_seconds, ml, true, on_lease_expired, m, &h);
    if (e) return e;
    pthread_mutex_lock(&m->mu);
    m->h_member = h;
    pthread_mutex_unlock(&m->mu);

    if ((e = fx_mq_key_mpmc_role(&c->keys, m->role, m->mpmc, m->member, &m->role_key))) return e;
    fx_put_req pr = {.key = ks(&m->role_key), .value = FX_SLICE_STR(FX_MQ_ROLE_KEY_VALUE),
                     .lease = ml};
    m->role_put = true; /* may be written even if the call fails: the close pass deletes it */
    if ((e = fx_etcd_put(c->etcd, &pr, NULL, c->op_timeout_ms))) return e;

    m->parent = (fx__mpsc_parent){.mpmc = m->mpmc, .global_lease = mt->metadata_lease_id,
                                  .member_lease = ml, .payload_lease = mt->payload_lease_id,
                                  .member = m->member, .ttl_s = mt->ttl_seconds,
                                  .data_ttl_s = data_ttl, .long_ttl_s = long_ttl};
    FX_DBG("mpmc %" PRId64 ": %s member %" PRId64 " attached (member lease %" PRId64 ")", m->mpmc,
           role_name(m), m->member, ml);
    return FX_OK;
}

/* The common tail of a close pass: role key delete, release the lease handles. `unconfirmed`:
 * the pass could not confirm the delete of a key this member owns (membership, ready key). Then,
 * or when the role key delete fails, the member revokes its own member lease (it is this member's
 * alone: revoking deletes exactly its keys), now or, if etcd does not answer, as soon as it does
 * (the client's revoker), so a successor does not wait a whole TTL for them. */
static void member_close_tail(mpmc_member *m, int64_t deadline, bool have_op, bool unconfirmed)
{
    fx_mq_client *c = m->c;
    if (m->role_put && have_op) {
        fx_del_req d = {.key = ks(&m->role_key)};
        fx_err e = fx_etcd_delete(c->etcd, &d, NULL, step_ms(deadline));
        if (e) {
            FX_WRN("mpmc %" PRId64 " %s %" PRId64 ": role key delete failed: %s (%s)", m->mpmc,
                   role_name(m), m->member, fx_errname(e), fx_err_detail());
            unconfirmed = true;
        }
    }
    pthread_mutex_lock(&m->mu);
    fx_lease *hs[4] = {m->h_member, m->h_meta, m->h_payload, m->h_idalloc};
    m->h_member = m->h_meta = m->h_payload = m->h_idalloc = NULL;
    bool lost = m->lf.fault != FX_OK;
    pthread_mutex_unlock(&m->mu);
    for (int i = 0; i < 4; i++) fx_lease_release(hs[i]);
    keeper_release(m);
    if (unconfirmed && have_op && m->member_lease > 0 && !lost) {
        int left = step_ms(deadline);
        bool now = fx__mq_revoke_member_lease(c, m->member_lease, m->meta.ttl_seconds,
                                              left < MPMC_MIN_CLOSE_STEP_MS ? MPMC_MIN_CLOSE_STEP_MS
                                                                            : left);
        FX_WRN("mpmc %" PRId64 " %s %" PRId64 ": owned keys not confirmed deleted: member lease %"
               PRId64 " %s", m->mpmc, role_name(m), m->member, m->member_lease,
               now ? "revoked" : "will be revoked as soon as etcd answers");
    }
}

/* Close protocol of every endpoint (fx_life_close_begin): idempotent, concurrent-safe; waits
 * for a running construction (interrupted through close_req). pass() does the work once. */
static fx_err member_close(mpmc_member *m, fx_err (*pass)(void *self), void *self)
{
    pthread_mutex_lock(&m->mu);
    fx_err r = FX_OK;
    if (fx_life_close_begin(&m->lf, &m->mu, &m->cv, &r) == FX_LIFE_CLOSE_RUN) {
        pthread_mutex_unlock(&m->mu);
        r = pass(self);
        bool held = fx_err_hold();
        pthread_mutex_lock(&m->mu);
        fx_life_close_done(&m->lf, &m->cv, r);
        pthread_mutex_unlock(&m->mu);
        /* Concurrent closers (the client's included) may return now; then unregister. */
        if (m->registered) fx__mq_unregister(m->c, &m->ep);
        pthread_mutex_lock(&m->mu);
        fx_life_close_leave(&m->lf, &m->cv);
        pthread_mutex_unlock(&m->mu);
        fx_err_release(held);
        return r;
    }
    int64_t id = m->mpmc; /* m may be freed once this closer has left */
    fx_life_close_leave(&m->lf, &m->cv);
    pthread_mutex_unlock(&m->mu);
    return r ? fx_seterr(r, "mpmc %" PRId64 ": close failed earlier", id) : FX_OK;
}

/* Before freeing: closed, and every close() caller has left. */
static void member_wait_users(mpmc_member *m)
{
    pthread_mutex_lock(&m->mu);
    fx_life_wait_closed(&m->lf, &m->mu, &m->cv);
    pthread_mutex_unlock(&m->mu);
}

/* End of construction: FX_OK keeps the endpoint open; an error (or a close/lease loss that
 * arrived meanwhile) makes the caller close and free it. */
static fx_err member_construct_end(mpmc_member *m, fx_err e)
{
    pthread_mutex_lock(&m->mu);
    if (!e && m->lf.close_req) e = fx_seterr(FX_ECLOSED, "mpmc %" PRId64 ": closed during open", m->mpmc);
    if (!e && m->lf.fault)
        e = fx_seterr(FX_ELEASE_LOST, "mpmc %" PRId64 ": lease %" PRId64 " lost during open",
                      m->mpmc, m->lf.fault_lease);
    fx_life_constructed(&m->lf, &m->cv);
    pthread_mutex_unlock(&m->mu);
    return e;
}

/* ---- consumer ----------------------------------------------------------------------------------- */

struct fx_mpmc_consumer {
    mpmc_member m;
    fx_mpsc_consumer *sub; /* set once during open; freed by free() */
    int64_t chan;
    fx_mq_key ready_key;
    bool ready_put;
    int64_t *seen; /* the list this consumer published into (open: keeper_sync without a read) */
    size_t n_seen;
    bool have_seen;
};

static fx_err ready_key_delete(mpmc_member *m, const fx_mq_key *rk, int timeout_ms)
{
    fx_cmp cmp = cmp_value(ks(rk), (fx_slice){m->member_dec, m->member_dec_len});
    fx_op del = op_del(ks(rk), (fx_slice){NULL, 0});
    fx_txn_req t = {.cmp = &cmp, .n_cmp = 1, .success = &del, .n_success = 1};
    return fx_etcd_txn(m->c->etcd, &t, NULL, timeout_ms);
}

/* Claim sub-MPSC `chan` (txn create(ready)==0), then bind the sub-consumer. FX_EEXISTS when
 * somebody else holds the ready key. */
static fx_err consumer_claim_one(fx_mpmc_consumer *cs, int64_t chan)
{
    mpmc_member *m = &cs->m;
    fx_mq_client *c = m->c;
    fx_mq_key rk;
    fx_err e = fx_mq_key_mpmc_ready(&c->keys, m->mpmc, chan, &rk);
    if (e) return e;
    fx_cmp cmp = cmp_absent(ks(&rk));
    fx_op put = op_put(ks(&rk), (fx_slice){m->member_dec, m->member_dec_len}, m->member_lease);
    fx_txn_req t = {.cmp = &cmp, .n_cmp = 1, .success = &put, .n_success = 1};
    fx_txn_resp r = {0};
    e = fx_etcd_txn(c->etcd, &t, &r, c->op_timeout_ms);
    bool won = !e && r.succeeded;
    fx_txn_resp_free(&r);
    if (e) {
        /* Ambiguous: the ready key may be ours. It is under the member lease; try to delete. */
        bool held = fx_err_hold();
        ready_key_delete(m, &rk, c->op_timeout_ms);
        fx_err_release(held);
        return e;
    }
    if (!won) return fx_seterr(FX_EEXISTS, "sub-MPSC %" PRId64 " already claimed", chan);
    fx_mpsc_consumer *sub = NULL;
    e = fx__mpsc_consumer_open_sub(c, chan, &m->parent, &sub);
    if (e) {
        bool held = fx_err_hold();
        fx_err de = ready_key_delete(m, &rk, c->op_timeout_ms);
        if (de)
            FX_WRN("mpmc %" PRId64 ": ready key of sub-MPSC %" PRId64 " not deleted after a failed "
                   "bind (%s); it expires with the member lease", m->mpmc, chan, fx_errname(de));
        fx_err_release(held);
        return e;
    }
    cs->sub = sub;
    cs->chan = chan;
    cs->ready_key = rk;
    cs->ready_put = true;
    FX_INF("mpmc %" PRId64 ": consumer %" PRId64 " claimed sub-MPSC %" PRId64, m->mpmc, m->member,
           chan);
    return FX_OK;
}

/* Claim the first claimable unready sub-MPSC of the view (list order). FX_ENOTFOUND: none. */
static fx_err consumer_claim_unready(fx_mpmc_consumer *cs, const mpmc_view *v)
{
    for (size_t i = 0; i < v->n_list; i++) {
        if (view_ready(v, v->list[i])) continue;
        fx_err e = member_construct_check(&cs->m);
        if (e) return e;
        e = consumer_claim_one(cs, v->list[i]);
        if (e == FX_EEXISTS || e == FX_ENOTFOUND) continue; /* claimed, or reclaimed meanwhile */
        return e;
    }
    return FX_ENOTFOUND;
}

/* The MPMC in brief, in one read txn (one revision): the mpsc_channels list (as a view without
 * ready ids), how many ready keys and how many consumer role keys exist. Counting instead of
 * reading every ready key keeps the serialised publish step small with 1,000 sub-MPSCs; the full
 * ready set is read only when the counts say an unready sub-MPSC exists. */
static fx_err read_brief(mpmc_member *m, mpmc_view *v, int64_t *n_ready, int64_t *active)
{
    fx_mq_client *c = m->c;
    memset(v, 0, sizeof *v);
    fx_mq_key lk, rp, cp;
    fx_err e = fx_mq_key_mpmc_mpsc_channels(&c->keys, m->mpmc, &lk);
    if (!e) e = fx_mq_prefix_mpmc_ready(&c->keys, m->mpmc, &rp);
    if (!e) e = fx_mq_prefix_mpmc_role(&c->keys, FX_MQ_ROLE_CONSUMER, m->mpmc, &cp);
    if (e) return e;
    uint8_t rend[FX_MQ_KEY_CAP], cend[FX_MQ_KEY_CAP];
    size_t rl = fx_prefix_end(ks(&rp), rend), cl = fx_prefix_end(ks(&cp), cend);
    fx_op ops[3] = {op_range(ks(&lk), (fx_slice){NULL, 0}), op_range(ks(&rp), (fx_slice){rend, rl}),
                    op_range(ks(&cp), (fx_slice){cend, cl})};
    ops[1].u.range.count_only = ops[2].u.range.count_only = true;
    fx_txn_req t = {.success = ops, .n_success = 3};
    fx_txn_resp r = {0};
    e = fx_etcd_txn(c->etcd, &t, &r, c->op_timeout_ms);
    if (!e && (!r.succeeded || r.n_responses != 3 || r.responses[0].type != FX_OP_RANGE ||
               r.responses[1].type != FX_OP_RANGE || r.responses[2].type != FX_OP_RANGE))
        e = fx_seterr(FX_EPROTO, "mpmc %" PRId64 ": unexpected brief txn response", m->mpmc);
    if (!e) e = view_from(&c->keys, m->mpmc, &r.responses[0].u.range, NULL, v);
    if (!e) {
        *n_ready = r.responses[1].u.range.count;
        *active = r.responses[2].u.range.count;
    }
    fx_txn_resp_free(&r);
    return e;
}

/* The publish cache (fx_mq_client.pub_*, under publish_mu). */
static void pub_store(fx_mq_client *c, int64_t mpmc, const fx_range_resp *lr, int64_t n_ready,
                      int64_t active)
{
    fx_bytes_free(&c->pub_list);
    c->pub_valid = false;
    if (lr && lr->n_kvs > 0 && bytes_copy(&c->pub_list, &lr->kvs[0].value) != FX_OK) return;
    c->pub_mpmc = mpmc;
    c->pub_ready = n_ready;
    c->pub_active = active;
    c->pub_valid = true;
}

static fx_err pub_view(fx_mq_client *c, int64_t mpmc, mpmc_view *v)
{
    memset(v, 0, sizeof *v);
    if (!c->pub_list.data) return FX_OK;
    fx_range_resp lr = {0};
    fx_kv kv = {.value = c->pub_list};
    lr.kvs = &kv;
    lr.n_kvs = 1;
    return view_from(&c->keys, mpmc, &lr, NULL, v);
}

/* Publish `chan` with the CAS: list == snapshot (create==0 when absent) && create(ready)==0 ->
 * list+[chan] (metadata lease), ready = member (member lease). Both branches also read the brief
 * (success: the ready and consumer counts; failure: the list too) into the publish cache. */
/* The publish txn: CAS list + ready key; it also moves the new sub-MPSC's meta (meta_js) from
 * its own global-long lease to the global lease (fx__mpsc_create_sub). */
static fx_err consumer_publish(fx_mpmc_consumer *cs, const mpmc_view *v, int64_t chan,
                               const fx_mq_chan_meta *meta, const char *meta_js, bool *won)
{
    mpmc_member *m = &cs->m;
    fx_mq_client *c = m->c;
    *won = false;
    fx_mq_key lk, rk, mk;
    fx_err e = fx_mq_key_mpmc_mpsc_channels(&c->keys, m->mpmc, &lk);
    if (!e) e = fx_mq_key_mpmc_ready(&c->keys, m->mpmc, chan, &rk);
    if (!e) e = fx_mq_key_chan_meta(&c->keys, chan, &mk);
    if (e) return e;
    int64_t *ids = malloc((v->n_list + 1) * sizeof *ids);
    if (!ids) return fx_seterr(FX_ENOMEM, "mpmc: out of memory");
    if (v->n_list) memcpy(ids, v->list, v->n_list * sizeof *ids);
    ids[v->n_list] = chan;
    char *json = NULL;
    e = fx_mq_mpsc_list_encode(ids, v->n_list + 1, &json);
    free(ids);
    if (e) return e;
    fx_cmp cmp[2] = {v->list_present ? cmp_value(ks(&lk), (fx_slice){v->list_raw.data,
                                                                     v->list_raw.len})
                                     : cmp_absent(ks(&lk)),
                     cmp_absent(ks(&rk))};
    fx_mq_key rp, cp;
    if ((e = fx_mq_prefix_mpmc_ready(&c->keys, m->mpmc, &rp)) ||
        (e = fx_mq_prefix_mpmc_role(&c->keys, FX_MQ_ROLE_CONSUMER, m->mpmc, &cp))) {
        free(json);
        return e;
    }
    uint8_t rend[FX_MQ_KEY_CAP], cend[FX_MQ_KEY_CAP];
    fx_slice rps = {rend, fx_prefix_end(ks(&rp), rend)}, cps = {cend, fx_prefix_end(ks(&cp), cend)};
    fx_op ops[5] = {op_put(ks(&lk), FX_SLICE_STR(json), m->meta.metadata_lease_id),
                    op_put(ks(&rk), (fx_slice){m->member_dec, m->member_dec_len}, m->member_lease),
                    op_range(ks(&rp), rps), op_range(ks(&cp), cps),
                    op_put(ks(&mk), FX_SLICE_STR(meta_js), meta->global_lease_id)};
    ops[2].u.range.count_only = ops[3].u.range.count_only = true;
    fx_op fops[3] = {op_range(ks(&lk), (fx_slice){NULL, 0}), ops[2], ops[3]};
    fx_txn_req t = {.cmp = cmp, .n_cmp = 2, .success = ops, .n_success = 5, .failure = fops,
                    .n_failure = 3};
    fx_txn_resp r = {0};
    e = fx_etcd_txn(c->etcd, &t, &r, c->op_timeout_ms);
    *won = !e && r.succeeded;
    c->pub_valid = false;
    if (!e && r.succeeded && r.n_responses == 5 && r.responses[2].type == FX_OP_RANGE &&
        r.responses[3].type == FX_OP_RANGE) {
        fx_kv kv = {.value = {(uint8_t *)json, strlen(json)}};
        fx_range_resp lr = {.kvs = &kv, .n_kvs = 1};
        pub_store(c, m->mpmc, &lr, r.responses[2].u.range.count, r.responses[3].u.range.count);
    } else if (!e && !r.succeeded && r.n_responses == 3 && r.responses[0].type == FX_OP_RANGE &&
               r.responses[1].type == FX_OP_RANGE && r.responses[2].type == FX_OP_RANGE) {
        pub_store(c, m->mpmc, &r.responses[0].u.range, r.responses[1].u.range.count,
                  r.responses[2].u.range.count);
    }
    fx_txn_resp_free(&r);
    free(json);
    cs->ready_key = rk;
    if (e) {
        /* Ambiguous: verify by re-reading (a few attempts). */
        bool held = fx_err_hold();
        for (int i = 0; i < 3; i++) {
            mpmc_view nv;
            if (read_view(c, m->mpmc, &nv) != FX_OK) continue;
            bool in = ids_has(nv.list, nv.n_list, chan);
            view_free(&nv);
            if (in) {
                *won = true;
                cs->ready_put = true;
            }
            fx_err_release(held);
            return FX_OK; /* else definitely not published: *won false */
        }
        fx_err_release(held);
        return e;
    }
    if (*won) cs->ready_put = true;
    return FX_OK;
}

static void reclaim_drain(fx_mq_client *c, int timeout_ms);

/* Create a sub-MPSC for this consumer and bind it, then publish it. The creation and the bind
 * take no lock (the claim workers of a process and other bridges create in parallel); only the
 * short read-check-publish step is taken in turn by the threads of this process (client
 * publish_mu), across processes the CAS on the list decides. Each attempt reads the view: an
 * unready sub-MPSC appeared -> claim it and roll ours back; active consumers <= listed sub-MPSCs ->
 * roll back, FX_EEXISTS; else the CAS publish. */
static fx_err consumer_create(fx_mpmc_consumer *cs)
{
    mpmc_member *m = &cs->m;
    fx_mq_client *c = m->c;
    fx_mq_chan_cfg cfg = {.capacity = m->meta.capacity, .ttl_s = m->meta.ttl_seconds, .weight = 1};
    int64_t chan = -1;
    fx_mq_chan_meta meta;
    fx_err e = fx__mpsc_create_sub(c, &cfg, &m->parent, &chan, &meta);
    if (e) {
        if (chan < 0) return e;
        /* the create txn may have landed */
        return rollback_after(c, m->mpmc, chan, NULL, meta.global_long_lease_id, e);
    }
    fx__mpsc_parent np = m->parent;
    np.fresh_meta = &meta;
    fx_mpsc_consumer *sub = NULL;
    if ((e = fx__mpsc_consumer_open_sub(c, chan, &np, &sub))) {
        return rollback_after(c, m->mpmc, chan, NULL, meta.global_long_lease_id, e);
    }
    char *meta_js = NULL; /* re-put by the publish txn under the global lease */
    if ((e = fx_mq_chan_meta_encode(&meta, &meta_js))) {
        return rollback_after(c, m->mpmc, chan, sub, meta.global_long_lease_id, e);
    }
    bool published = false;
    pthread_mutex_lock(&c->publish_mu);
    bool fresh = false; /* the cached brief comes from a read or a txn of this call */
    for (int attempt = 0; attempt < MPMC_PUBLISH_ATTEMPTS; attempt++) {
        if ((e = member_construct_check(m))) break;
        mpmc_view v;
        if (!c->pub_valid || c->pub_mpmc != m->mpmc) {
            int64_t nr = 0, na = 0;
            if ((e = read_brief(m, &v, &nr, &na))) break;
            fx_kv kv = {.value = v.list_raw};
            fx_range_resp lr = {.kvs = &kv, .n_kvs = v.list_present ? 1 : 0};
            pub_store(c, m->mpmc, &lr, nr, na);
            view_free(&v);
            if (!c->pub_valid) {
                e = fx_seterr(FX_ENOMEM, "mpmc: out of memory");
                break;
            }
            fresh = true;
        }
        if ((e = pub_view(c, m->mpmc, &v))) break;
        int64_t n_ready = c->pub_ready, active = c->pub_active;
        if (n_ready < (int64_t)v.n_list) { /* an unready one exists: claim it, drop ours */
            view_free(&v);
            c->pub_valid = false;
            if ((e = read_view(c, m->mpmc, &v))) break;
            e = consumer_claim_unready(cs, &v);
            if (e != FX_ENOTFOUND) { /* claimed another one (FX_OK) or failed */
                view_free(&v);
                break;
            }
            view_free(&v);
            /* none claimable (a drain consumer holds them): publish ours, on a fresh brief */
            int64_t nr = 0, na = 0;
            if ((e = read_brief(m, &v, &nr, &na))) break;
            fx_kv kv = {.value = v.list_raw};
            fx_range_resp lr = {.kvs = &kv, .n_kvs = v.list_present ? 1 : 0};
            pub_store(c, m->mpmc, &lr, nr, na);
            view_free(&v);
            if (!c->pub_valid || (e = pub_view(c, m->mpmc, &v))) {
                if (!e) e = fx_seterr(FX_ENOMEM, "mpmc: out of memory");
                break;
            }
            fresh = true;
            active = c->pub_active;
        }
        if (active <= (int64_t)v.n_list) {
            view_free(&v);
            if (!fresh) { /* the cached counts may be old: confirm with a read */
                c->pub_valid = false;
                continue;
            }
            e = fx_seterr(FX_EEXISTS, "mpmc %" PRId64 ": not enough active consumers (%" PRId64
                          " active, %zu sub-MPSCs)", m->mpmc, active, v.n_list);
            break;
        }
        e = consumer_publish(cs, &v, chan, &meta, meta_js, &published);
        if (published && !e && (cs->seen = malloc((v.n_list + 1) * sizeof *cs->seen))) {
            if (v.n_list) memcpy(cs->seen, v.list, v.n_list * sizeof *cs->seen);
            cs->seen[v.n_list] = chan;
            cs->n_seen = v.n_list + 1;
            cs->have_seen = true;
        }
        view_free(&v);
        if (e) {
            /* Unknown whether it was published: close the sub-consumer, keep its keys. */
            pthread_mutex_unlock(&c->publish_mu);
            bool held = fx_err_hold();
            fx_mpsc_consumer_close(sub);
            fx_mpsc_consumer_free(sub);
            fx_err_release(held);
            FX_WRN("mpmc %" PRId64 ": publish of sub-MPSC %" PRId64 " failed ambiguously (%s)",
                   m->mpmc, chan, fx_err_detail());
            return e;
        }
        if (published) break;
        fresh = true; /* a lost CAS brought the current brief into the cache */
        if (attempt + 1 == MPMC_PUBLISH_ATTEMPTS)
            e = fx_seterr(FX_EEXISTS, "mpmc %" PRId64 ": publish still contended after %d "
                          "attempts", m->mpmc, MPMC_PUBLISH_ATTEMPTS);
    }
    pthread_mutex_unlock(&c->publish_mu);
    reclaim_drain(c, c->op_timeout_ms);
    if (!published && e == FX_OK && !cs->sub) /* attempts used up without a decision */
        e = fx_seterr(FX_EEXISTS, "mpmc %" PRId64 ": no sub-MPSC published or claimed after %d "
                      "attempts", m->mpmc, MPMC_PUBLISH_ATTEMPTS);
    free(meta_js);
    if (published) {
        cs->sub = sub;
        cs->chan = chan;
        keeper_add_new(m, chan, meta.global_long_lease_id);
        FX_INF("mpmc %" PRId64 ": consumer %" PRId64 " created sub-MPSC %" PRId64, m->mpmc,
               m->member, chan);
        return FX_OK;
    }
    return rollback_after(c, m->mpmc, chan, sub, meta.global_long_lease_id, e);
}

/* Claim an unready sub-MPSC, else (when there are more active consumers than sub-MPSCs) create,
 * bind and publish one. */
static fx_err consumer_claim(fx_mpmc_consumer *cs)
{
    mpmc_member *m = &cs->m;
    mpmc_view v;
    int64_t n_ready = 0, active = 0;
    fx_err e = read_brief(m, &v, &n_ready, &active);
    if (e) return e;
    size_t nl = v.n_list;
    view_free(&v);
    if (n_ready < (int64_t)nl) { /* an unready sub-MPSC exists: try to claim one */
        if ((e = read_view(m->c, m->mpmc, &v))) return e;
        e = consumer_claim_unready(cs, &v);
        view_free(&v);
        if (e != FX_ENOTFOUND) return e;
        /* Lost every unready one to consumers that opened meanwhile: their role keys were
         * written before their claim, so the first count is stale. Count again. */
        if ((e = read_brief(m, &v, &n_ready, &active))) return e;
        nl = v.n_list;
        view_free(&v);
    }
    if (active <= (int64_t)nl)
        return fx_seterr(FX_EEXISTS, "mpmc %" PRId64 ": not enough active consumers (%" PRId64
                         " active, %zu sub-MPSCs, none unready)", m->mpmc, active, nl);
    return consumer_create(cs);
}

/* ---- reclaim of unneeded sub-MPSCs (protocol: the header comment) ------------------------ */

#define MPMC_RECLAIM_ATTEMPTS 5

/* Drop this client's keeper hold of chan (its lease is being revoked). */
static void keeper_forget(fx_mq_client *c, int64_t mpmc, int64_t chan)
{
    fx_lease *h = NULL;
    pthread_mutex_lock(&c->mu);
    mpmc_keeper *k = c->keepers;
    while (k && k->mpmc != mpmc) k = k->next;
    if (k) {
        pthread_mutex_lock(&k->mu);
        for (size_t i = 0; i < k->n_holds; i++)
            if (k->holds[i].chan == chan) {
                h = k->holds[i].h;
                k->holds[i] = k->holds[--k->n_holds];
                break;
            }
        pthread_mutex_unlock(&k->mu);
    }
    pthread_mutex_unlock(&c->mu);
    fx_lease_release(h);
}

/* Backlog and consumer memberships of a channel from the keys under its prefix. */
static void chan_state(const fx_mq_keys *keys, int64_t chan, const fx_range_resp *r,
                       int64_t *backlog, int64_t *consumers)
{
    *backlog = 0;
    *consumers = 0;
    for (size_t i = 0; i < r->n_kvs; i++) {
        fx_slice k = {r->kvs[i].key.data, r->kvs[i].key.len};
        int64_t ch = -1, idx = -1;
        if (fx_mq_parse_consumer_member_key(keys, k, &ch, &idx) == FX_OK && ch == chan)
            (*consumers)++;
    }
    for (size_t i = 0; i < r->n_kvs; i++) {
        fx_slice k = {r->kvs[i].key.data, r->kvs[i].key.len};
        int64_t ch = -1, pidx = -1, prod = 0, cons = FX_MQ_CONSUME_OFFSET_BEGIN;
        if (fx_mq_parse_produce_offset_key(keys, k, &ch, &pidx) != FX_OK || ch != chan) continue;
        if (fx_mq_produce_offset_decode(r->kvs[i].value.data, r->kvs[i].value.len, &prod)) {
            *backlog += 1; /* unreadable: keep the channel */
            continue;
        }
        for (size_t j = 0; j < r->n_kvs; j++) {
            fx_slice k2 = {r->kvs[j].key.data, r->kvs[j].key.len};
            int64_t ch2 = -1, p2 = -1;
            if (fx_mq_parse_consume_offset_key(keys, k2, &ch2, &p2) == FX_OK && ch2 == chan &&
                p2 == pidx &&
                fx_mq_consume_offset_decode(r->kvs[j].value.data, r->kvs[j].value.len, &cons)) {
                *backlog += 1; /* unreadable: keep the channel */
                cons = FX_MQ_CONSUME_OFFSET_BEGIN;
            }
        }
        if (prod >= cons) *backlog += prod - cons + 1;
    }
}

#define MPMC_RECLAIM_BATCH 16 /* sub-MPSCs decided in one read and removed in one txn */
#define MPMC_RECLAIM_QUEUE 256

/* Keys of one reclaim candidate. */
typedef struct rc_keys {
    fx_mq_key rk, pc, mk, cl, cll, pa;
    char ak[FX_MQ_KEY_CAP]; /* its attempt record (bridge/attempts.h) */
    size_t akl;
    uint8_t pce[FX_MQ_KEY_CAP], pae[FX_MQ_KEY_CAP];
    fx_slice pcend, paend;
} rc_keys;

/* One reclaim decision + txn for up to MPMC_RECLAIM_BATCH sub-MPSCs of one MPMC (called with
 * publish_mu held). removed[i]: chans[i] was removed; long_leases[i]: its global-long lease, to
 * revoke (0: none). *again: the txn lost a compare, decide again. */
static fx_err reclaim_once(fx_mq_client *c, int64_t mpmc, const int64_t *chans, size_t k,
                           int timeout_ms, bool *removed, int64_t *long_leases, bool *again)
{
    *again = false;
    for (size_t i = 0; i < k; i++) {
        removed[i] = false;
        long_leases[i] = 0;
    }
    fx_mq_key lk, cp;
    fx_err e = fx_mq_key_mpmc_mpsc_channels(&c->keys, mpmc, &lk);
    if (!e) e = fx_mq_prefix_mpmc_role(&c->keys, FX_MQ_ROLE_CONSUMER, mpmc, &cp);
    if (e) return e;
    rc_keys *rk = calloc(k, sizeof *rk);
    fx_op *rd = calloc(2 + 3 * k, sizeof *rd);
    fx_cmp *cmp = calloc(1 + 3 * k, sizeof *cmp);
    fx_op *ops = calloc(1 + 6 * k, sizeof *ops);
    bool *elig = calloc(k, sizeof *elig);
    if (!rk || !rd || !cmp || !ops || !elig) {
        e = fx_seterr(FX_ENOMEM, "mpmc reclaim: out of memory");
        goto done;
    }
    uint8_t cpe[FX_MQ_KEY_CAP];
    fx_slice cpend = {cpe, fx_prefix_end(ks(&cp), cpe)}, none = {NULL, 0};
    rd[0] = op_range(ks(&lk), none);
    rd[1] = op_range(ks(&cp), cpend);
    rd[1].u.range.count_only = true;
    for (size_t i = 0; i < k; i++) {
        rc_keys *x = &rk[i];
        e = fx_mq_key_mpmc_ready(&c->keys, mpmc, chans[i], &x->rk);
        if (!e) e = fx_mq_prefix_chan(&c->keys, chans[i], &x->pc);
        if (!e) e = fx_mq_key_chan_meta(&c->keys, chans[i], &x->mk);
        if (!e) e = fx_mq_key_cluster_lease_chan(&c->keys, chans[i], &x->cl);
        if (!e) e = fx_mq_key_cluster_lease_id_alloc(&c->keys, chans[i], &x->cll);
        if (!e) e = fx_mq_prefix_alloc_chan(&c->keys, chans[i], &x->pa);
        if (e) goto done;
        int al = snprintf(x->ak, sizeof x->ak, "%s/attempts/%" PRId64, fx_mq_client_root(c),
                          chans[i]);
        if (al < 0 || (size_t)al >= sizeof x->ak) {
            e = fx_seterr(FX_EINVAL, "mpmc reclaim: attempts key too long");
            goto done;
        }
        x->akl = (size_t)al;
        x->pcend = (fx_slice){x->pce, fx_prefix_end(ks(&x->pc), x->pce)};
        x->paend = (fx_slice){x->pae, fx_prefix_end(ks(&x->pa), x->pae)};
        rd[2 + 3 * i] = op_range(ks(&x->rk), none);
        rd[2 + 3 * i].u.range.count_only = true;
        rd[3 + 3 * i] = op_range(ks(&x->pc), x->pcend);
        rd[4 + 3 * i] = op_range(ks(&x->mk), none);
    }
    fx_txn_req rt = {.success = rd, .n_success = 2 + 3 * k};
    fx_txn_resp r = {0};
    if ((e = fx_etcd_txn(c->etcd, &rt, &r, timeout_ms))) {
        fx_txn_resp_free(&r);
        goto done;
    }
    bool ok = r.succeeded && r.n_responses == 2 + 3 * k;
    for (size_t i = 0; ok && i < r.n_responses; i++) ok = r.responses[i].type == FX_OP_RANGE;
    if (!ok) {
        fx_txn_resp_free(&r);
        e = fx_seterr(FX_EPROTO, "mpmc %" PRId64 ": unexpected reclaim read response", mpmc);
        goto done;
    }
    const fx_range_resp *lr = &r.responses[0].u.range;
    int64_t rev = r.revision, active = r.responses[1].u.range.count;
    int64_t *ids = NULL;
    size_t n = 0;
    char *json = NULL;
    if (lr->n_kvs != 1 ||
        fx_mq_mpsc_list_decode(lr->kvs[0].value.data, lr->kvs[0].value.len, &ids, &n) != FX_OK)
        goto out;
    int64_t need = active > 1 ? active : 1;
    size_t take = 0;
    for (size_t i = 0; i < k && (int64_t)n - (int64_t)take > need; i++) {
        int64_t ready = r.responses[2 + 3 * i].u.range.count, backlog = 0, consumers = 0;
        chan_state(&c->keys, chans[i], &r.responses[3 + 3 * i].u.range, &backlog, &consumers);
        if (!ids_has(ids, n, chans[i]) || ready > 0 || consumers > 0 || backlog > 0) {
            FX_DBG("mpmc %" PRId64 ": sub-MPSC %" PRId64 " kept (ready %" PRId64 ", consumers %"
                   PRId64 ", backlog %" PRId64 ")", mpmc, chans[i], ready, consumers, backlog);
            continue;
        }
        bool dup = false;
        for (size_t j = 0; j < i && !dup; j++) dup = elig[j] && chans[j] == chans[i];
        if (dup) continue;
        elig[i] = true;
        take++;
        const fx_range_resp *mr = &r.responses[4 + 3 * i].u.range;
        fx_mq_chan_meta cm;
        if (mr->n_kvs == 1 &&
            fx_mq_chan_meta_decode(mr->kvs[0].value.data, mr->kvs[0].value.len, &cm) == FX_OK)
            long_leases[i] = cm.global_long_lease_id;
    }
    if (!take) goto out;
    size_t nk = 0;
    for (size_t i = 0; i < n; i++) {
        bool gone = false;
        for (size_t j = 0; j < k && !gone; j++) gone = elig[j] && chans[j] == ids[i];
        if (!gone) ids[nk++] = ids[i];
    }
    if ((e = fx_mq_mpsc_list_encode(ids, nk, &json))) goto out;
    size_t nc = 0, no = 0;
    cmp[nc++] = cmp_value(ks(&lk), (fx_slice){lr->kvs[0].value.data, lr->kvs[0].value.len});
    ops[no++] = op_put(ks(&lk), FX_SLICE_STR(json), lr->kvs[0].lease);
    for (size_t i = 0; i < k; i++) {
        if (!elig[i]) continue;
        rc_keys *x = &rk[i];
        cmp[nc++] = cmp_absent(ks(&x->rk));
        cmp[nc++] = (fx_cmp){.target = FX_CMP_MOD, .result = FX_CMP_LESS, .key = ks(&x->pc),
                             .range_end = x->pcend, .num = rev + 1};
        cmp[nc++] = (fx_cmp){.target = FX_CMP_MOD, .result = FX_CMP_LESS, .key = ks(&x->mk),
                             .num = rev + 1};
        ops[no++] = op_del(ks(&x->pc), x->pcend);
        ops[no++] = op_del(ks(&x->mk), none);
        ops[no++] = op_del(ks(&x->cl), none);
        ops[no++] = op_del(ks(&x->cll), none);
        ops[no++] = op_del(ks(&x->pa), x->paend);
        ops[no++] = op_del((fx_slice){x->ak, x->akl}, none); /* nothing of S is left */
    }
    fx_txn_req t = {.cmp = cmp, .n_cmp = nc, .success = ops, .n_success = no};
    fx_txn_resp w = {0};
    e = fx_etcd_txn(c->etcd, &t, &w, timeout_ms);
    bool won = !e && w.succeeded;
    fx_txn_resp_free(&w);
    if (e) goto out;
    if (!won) {
        *again = true;
        goto out;
    }
    c->pub_valid = false; /* the list changed (under publish_mu) */
    for (size_t i = 0; i < k; i++) {
        if (!elig[i]) continue;
        removed[i] = true;
        FX_INF("mpmc %" PRId64 ": reclaimed sub-MPSC %" PRId64 " (unready, empty; %zu left)",
               mpmc, chans[i], nk);
    }
out:
    for (size_t i = 0; i < k; i++)
        if (!removed[i]) long_leases[i] = 0;
    free(json);
    free(ids);
    fx_txn_resp_free(&r);
done:
    free(rk);
    free(rd);
    free(cmp);
    free(ops);
    free(elig);
    return e;
}

/* After a reclaim, outside publish_mu: this client's holds dropped, the leases revoked, and the
 * payloads a failed delete left below the consume offsets removed from the payload plane (split
 * and Redis planes: a commit deletes them after its offsets txn, and a delete that failed at a
 * consumer's close was never retried; they would live as long as the channel's payload lease,
 * which every member renews). One delete_range per reclaimed sub-MPSC, best effort. */
static void reclaim_after(fx_mq_client *c, int64_t mpmc, const int64_t *chans, size_t k,
                          const bool *removed, const int64_t *long_leases, int timeout_ms)
{
    for (size_t i = 0; i < k; i++) {
        if (!removed[i]) continue;
        keeper_forget(c, mpmc, chans[i]);
        fx_mq_key ps;
        if (!fx__plane_fused(c) && !fx_mq_payload_prefix_mpsc(mpmc, chans[i], &ps)) {
            uint8_t pe[FX_MQ_KEY_CAP];
            size_t el = fx_prefix_end(fx_mq_key_slice(&ps), pe);
            int64_t gone = 0;
            fx_err de = fx_kv_delete_range(c->kv, fx_mq_key_slice(&ps), (fx_slice){pe, el}, &gone,
                                           timeout_ms);
            if (de)
                FX_WRN("mpmc %" PRId64 ": reclaimed sub-MPSC %" PRId64 ": deleting its leftover "
                       "payloads failed: %s (%s)", mpmc, chans[i], fx_errname(de), fx_err_detail());
            else if (gone)
                FX_INF("mpmc %" PRId64 ": reclaimed sub-MPSC %" PRId64 ": %" PRId64 " leftover "
                       "payload key(s) deleted", mpmc, chans[i], gone);
        }
        if (long_leases[i] <= 0) continue;
        fx_err re = fx_etcd_lease_revoke(c->etcd, long_leases[i], timeout_ms);
        if (re && re != FX_ENOTFOUND)
            FX_DBG("mpmc %" PRId64 ": revoke of reclaimed sub-MPSC %" PRId64 "'s lease: %s", mpmc,
                   chans[i], fx_errname(re));
    }
}

static fx_err reclaim_batch(fx_mq_client *c, int64_t mpmc, const int64_t *chans, size_t k,
                            int timeout_ms, bool *removed)
{
    int64_t ll[MPMC_RECLAIM_BATCH];
    fx_err e = FX_OK;
    for (int i = 0; i < MPMC_RECLAIM_ATTEMPTS; i++) {
        bool again = false;
        if ((e = reclaim_once(c, mpmc, chans, k, timeout_ms, removed, ll, &again)) || !again)
            break;
    }
    pthread_mutex_unlock(&c->publish_mu);
    reclaim_after(c, mpmc, chans, k, removed, ll, timeout_ms);
    pthread_mutex_lock(&c->publish_mu);
    return e;
}

/* A closing consumer's reclaim of its own sub-MPSC, grouped and without waiting: it queues the
 * sub-MPSC; if publish_mu is free it takes it and decides every queued sub-MPSC (per MPMC, up to
 * MPMC_RECLAIM_BATCH in one read and one txn) until the queue is empty; if another thread holds
 * it, that thread (or the next closer) handles the queue: after releasing the lock, the holder
 * looks at the queue again and goes on when it is not empty, so nothing queued is left behind.
 * Consumers leaving together (a thousand names) thus cost one read and one txn per batch, and a
 * closing claim never waits for another's reclaim. */
static void reclaim_queued(fx_mq_client *c, int64_t mpmc, int64_t chan, int timeout_ms)
{
    pthread_mutex_lock(&c->mu);
    bool queued = c->n_rq < MPMC_RECLAIM_QUEUE;
    if (queued) {
        c->rq[c->n_rq][0] = mpmc;
        c->rq[c->n_rq][1] = chan;
        c->n_rq++;
    }
    pthread_mutex_unlock(&c->mu);
    bool rm[MPMC_RECLAIM_BATCH];
    if (!queued) { /* queue full: this one alone, waiting for the lock */
        pthread_mutex_lock(&c->publish_mu);
        fx_err e = reclaim_batch(c, mpmc, &chan, 1, timeout_ms, rm);
        pthread_mutex_unlock(&c->publish_mu);
        if (e) FX_DBG("mpmc %" PRId64 ": reclaim of sub-MPSC %" PRId64 ": %s", mpmc, chan,
                      fx_errname(e));
    }
    reclaim_drain(c, timeout_ms);
}

/* Handle the reclaim queue if publish_mu is free (see reclaim_queued); also called by a publisher
 * after it releases publish_mu, so a sub-MPSC queued while it held the lock is not left behind. */
static void reclaim_drain(fx_mq_client *c, int timeout_ms)
{
    bool rm[MPMC_RECLAIM_BATCH];
    for (;;) {
        pthread_mutex_lock(&c->mu);
        bool any = c->n_rq > 0;
        pthread_mutex_unlock(&c->mu);
        if (!any) return;
        if (pthread_mutex_trylock(&c->publish_mu) != 0) return; /* the holder handles it */
        for (;;) {
            int64_t batch[MPMC_RECLAIM_BATCH], bm = -1;
            size_t k = 0;
            pthread_mutex_lock(&c->mu);
            if (c->n_rq) bm = c->rq[0][0];
            for (size_t i = 0; i < c->n_rq && k < MPMC_RECLAIM_BATCH;) {
                if (c->rq[i][0] == bm) {
                    batch[k++] = c->rq[i][1];
                    c->rq[i][0] = c->rq[c->n_rq - 1][0];
                    c->rq[i][1] = c->rq[c->n_rq - 1][1];
                    c->n_rq--;
                } else {
                    i++;
                }
            }
            pthread_mutex_unlock(&c->mu);
            if (!k) break;
            fx_err e = reclaim_batch(c, bm, batch, k, timeout_ms, rm);
            if (e)
                FX_DBG("mpmc %" PRId64 ": reclaim of %zu sub-MPSC(s) at close: %s (%s)", bm, k,
                       fx_errname(e), fx_err_detail());
        }
        pthread_mutex_unlock(&c->publish_mu);
    }
}

fx_err fx_mpmc_reclaim(fx_mq_client *c, int64_t mpmc, int64_t chan, bool *removed)
{
    bool dummy;
    if (!removed) removed = &dummy;
    *removed = false;
    if (!c || mpmc < 0 || chan < 0) return fx_seterr(FX_EINVAL, "mpmc reclaim: bad arguments");
    fx_err e = fx__mq_op_enter(c);
    if (e) return e;
    pthread_mutex_lock(&c->publish_mu);
    e = reclaim_batch(c, mpmc, &chan, 1, c->op_timeout_ms, removed);
    pthread_mutex_unlock(&c->publish_mu);
    fx__mq_op_leave(c);
    return e;
}

/* Close pass: sub-consumer close (membership delete) -> ready key delete only if that delete was
 * confirmed -> role key delete -> release handles. */
static fx_err consumer_close_pass(void *self)
{
    fx_mpmc_consumer *cs = self;
    mpmc_member *m = &cs->m;
    fx_mq_client *c = m->c;
    int64_t deadline = fx_now_ms() + c->close_timeout_ms;
    bool have_op = fx__mq_op_enter(c) == FX_OK;
    fx_err first = FX_OK;
    bool held = false; /* from the first failure on: its detail is kept through the rest */
    bool confirmed = false, unconfirmed = false;
    if (cs->sub) {
        fx_err e = fx_mpsc_consumer_close(cs->sub);
        if (e && e != FX_ECLOSED && e != FX_ELEASE_LOST) {
            first = e;
            held = fx_err_hold();
        }
        confirmed = fx__mpsc_consumer_membership_deleted(cs->sub);
        unconfirmed = !confirmed; /* then the member lease is revoked (member_close_tail) */
    }
    bool released = confirmed; /* its sub-MPSC is free of this consumer */
    if (cs->ready_put) {
        if (!confirmed) {
            FX_WRN("mpmc %" PRId64 " consumer %" PRId64 ": membership delete of sub-MPSC %" PRId64
                   " not confirmed: ready key kept (the member lease is revoked instead)", m->mpmc,
                   m->member, cs->chan);
        } else if (have_op) {
            fx_err e = ready_key_delete(m, &cs->ready_key, step_ms(deadline));
            if (e) {
                FX_WRN("mpmc %" PRId64 " consumer %" PRId64 ": ready key delete failed: %s (%s)",
                       m->mpmc, m->member, fx_errname(e), fx_err_detail());
                unconfirmed = true;
                released = false;
            }
        } else {
            released = false;
        }
    }
    member_close_tail(m, deadline, have_op, unconfirmed);
    /* Its sub-MPSC, if no longer needed (best effort). After the role key delete, so that
     * consumers closing together do not count each other as active and keep every sub-MPSC. */
    if (released && have_op && cs->chan >= 0)
        reclaim_queued(c, m->mpmc, cs->chan, step_ms(deadline));
    if (have_op) fx__mq_op_leave(c);
    FX_DBG("mpmc %" PRId64 ": consumer %" PRId64 " closed", m->mpmc, m->member);
    if (first) fx_err_release(held);
    return first;
}

static fx_err consumer_close_cb(void *self)
{
    fx_mpmc_consumer *cs = self;
    return member_close(&cs->m, consumer_close_pass, cs);
}

fx_err fx_mpmc_consumer_close(fx_mpmc_consumer *c)
{
    if (!c) return fx_seterr(FX_EINVAL, "mpmc consumer close: NULL");
    return consumer_close_cb(c);
}

static void consumer_dealloc(fx_mpmc_consumer *cs)
{
    member_wait_users(&cs->m);
    if (cs->sub) fx_mpsc_consumer_free(cs->sub);
    free(cs->seen);
    member_destroy(&cs->m);
    free(cs);
}

void fx_mpmc_consumer_free(fx_mpmc_consumer *c)
{
    if (!c) return;
    fx_mpmc_consumer_close(c);
    consumer_dealloc(c);
}

/* Drain claim of sub-MPSC chan: bind its consumer directly, without a ready key (the consumer
 * membership txn refuses a second consumer atomically, so the binding is the lock). */
static fx_err consumer_bind_drain(fx_mpmc_consumer *cs, int64_t chan)
{
    mpmc_member *m = &cs->m;
    fx_mq_client *c = m->c;
    mpmc_view v;
    fx_err e = read_view(c, m->mpmc, &v);
    if (e) return e;
    bool listed = ids_has(v.list, v.n_list, chan), ready = view_ready(&v, chan);
    view_free(&v);
    if (!listed)
        return fx_seterr(FX_ENOTFOUND, "mpmc %" PRId64 ": no sub-MPSC %" PRId64, m->mpmc, chan);
    if (ready)
        return fx_seterr(FX_EEXISTS, "mpmc %" PRId64 ": sub-MPSC %" PRId64 " is claimed", m->mpmc,
                         chan);
    fx_mpsc_consumer *sub = NULL;
    if ((e = fx__mpsc_consumer_open_sub(c, chan, &m->parent, &sub))) return e;
    cs->sub = sub;
    cs->chan = chan;
    FX_INF("mpmc %" PRId64 ": consumer %" PRId64 " drains sub-MPSC %" PRId64, m->mpmc, m->member,
           chan);
    return FX_OK;
}

static fx_err consumer_open_impl(fx_mq_client *c, int64_t mpmc, int64_t drain,
                                 fx_mpmc_consumer **out)
{
    if (!c || !out || mpmc < 0) return fx_seterr(FX_EINVAL, "mpmc consumer open: bad arguments");
    *out = NULL;
    fx_mpmc_consumer *cs = calloc(1, sizeof *cs);
    if (!cs) return fx_seterr(FX_ENOMEM, "mpmc consumer: out of memory");
    cs->chan = -1;
    fx_err e = member_init(&cs->m, c, mpmc, FX_MQ_ROLE_CONSUMER, consumer_close_cb, cs);
    if (e) {
        free(cs);
        return e;
    }
    if ((e = fx__mq_new_op_enter(c))) {
        member_destroy(&cs->m);
        free(cs);
        return e;
    }
    if ((e = fx__mq_register(c, &cs->m.ep))) {
        fx__mq_op_leave(c);
        member_destroy(&cs->m);
        free(cs);
        return e;
    }
    cs->m.registered = true;
    e = member_attach(&cs->m);
    if (!e) e = member_construct_check(&cs->m);
    if (!e) e = drain >= 0 ? consumer_bind_drain(cs, drain) : consumer_claim(cs);
    if (!e && cs->have_seen) { /* the list it published into: no read needed */
        keeper_sync(&cs->m, cs->seen, cs->n_seen);
    } else if (!e) { /* keep every listed sub-MPSC's long lease alive too (best effort) */
        mpmc_view v;
        int64_t n_ready = 0, active = 0;
        if (read_brief(&cs->m, &v, &n_ready, &active) == FX_OK) {
            keeper_sync(&cs->m, v.list, v.n_list);
            view_free(&v);
        }
    }
    e = member_construct_end(&cs->m, e);
    fx__mq_op_leave(c);
    if (e) {
        bool held = fx_err_hold();
        fx_mpmc_consumer_close(cs);
        consumer_dealloc(cs);
        fx_err_release(held);
        return e;
    }
    *out = cs;
    return FX_OK;
}

fx_err fx_mpmc_consumer_open(fx_mq_client *c, int64_t mpmc, fx_mpmc_consumer **out)
{
    return consumer_open_impl(c, mpmc, -1, out);
}

fx_err fx_mpmc_consumer_open_drain(fx_mq_client *c, int64_t mpmc, int64_t chan,
                                   fx_mpmc_consumer **out)
{
    if (chan < 0) return fx_seterr(FX_EINVAL, "mpmc drain open: bad sub-MPSC id");
    return consumer_open_impl(c, mpmc, chan, out);
}

/* A sub-consumer call failed with closed/lease-lost: map it to the MPMC endpoint. */
static fx_err consumer_sub_failed(fx_mpmc_consumer *cs, fx_err e)
{
    mpmc_member *m = &cs->m;
    pthread_mutex_lock(&m->mu);
    bool open = member_open_locked(m);
    pthread_mutex_unlock(&m->mu);
    if (!open) return member_gate(m);
    if (e == FX_ELEASE_LOST || fx__mpsc_consumer_fault(cs->sub) == FX_ELEASE_LOST)
        return member_fail_lost(m, m->member_lease);
    /* The sub-consumer closed under us for another reason: close the endpoint too. */
    m->ep.close(m->ep.self);
    return member_gate(m);
}

/* Fencing: a consumer hands out nothing while its member lease is not confirmed by
 * etcd (fx_lease_confirmed_until_ms passed: etcd unreachable or slow for the lease's whole TTL).
 * etcd may have expired the lease meanwhile and another member may already be draining the
 * sub-MPSC from its committed offset; reading on would deliver the same messages twice from two
 * bridges. Transient (FX_EUNAVAIL): once the manager knows, the lease is either renewed (gets go
 * on) or expired (the next call closes the endpoint: FX_ELEASE_LOST). */
static bool consumer_unconfirmed(fx_mpmc_consumer *c, int64_t *over_ms)
{
    mpmc_member *m = &c->m;
    pthread_mutex_lock(&m->mu);
    int64_t until = m->h_member ? fx_lease_confirmed_until_ms(m->h_member) : INT64_MAX;
    pthread_mutex_unlock(&m->mu);
    int64_t now = fx_now_ms();
    *over_ms = now - until;
    return now >= until;
}

static fx_err consumer_fence(fx_mpmc_consumer *c)
{
    int64_t over = 0;
    if (!consumer_unconfirmed(c, &over)) return FX_OK;
    return fx_seterr(FX_EUNAVAIL, "mpmc %" PRId64 ": consumer member %" PRId64 ": member lease %" PRId64
                     " not confirmed by etcd for its TTL (%" PRId64 " s, %" PRId64 " ms over): "
                     "delivering nothing until it is renewed or known expired",
                     c->m.mpmc, c->m.member, c->m.member_lease, c->m.parent.ttl_s, over);
}

fx_err fx_mpmc_get(fx_mpmc_consumer *c, fx_mq_delivery *out, size_t max, size_t *n,
                   int timeout_ms)
{
    if (n) *n = 0;
    if (!c || !n || (max && !out)) return fx_seterr(FX_EINVAL, "mpmc get: bad arguments");
    fx_err e = member_gate(&c->m);
    if (e) return e;
    if ((e = consumer_fence(c))) return e;
    e = fx_mpsc_get(c->sub, out, max, n, timeout_ms);
    if (e == FX_ECLOSED || e == FX_ELEASE_LOST) return consumer_sub_failed(c, e);
    return e;
}

fx_err fx_mpmc_ack(fx_mpmc_consumer *c, const fx_mq_msg_id *ids, size_t n)
{
    if (!c || (n && !ids)) return fx_seterr(FX_EINVAL, "mpmc ack: bad arguments");
    fx_err e = member_gate(&c->m);
    if (e) return e;
    e = fx_mpsc_ack(c->sub, ids, n);
    if (e == FX_ECLOSED || e == FX_ELEASE_LOST) return consumer_sub_failed(c, e);
    return e;
}

fx_err fx_mpmc_flush(fx_mpmc_consumer *c, int timeout_ms)
{
    if (!c) return fx_seterr(FX_EINVAL, "mpmc flush: NULL");
    fx_err e = member_gate(&c->m);
    if (e) return e;
    e = fx_mpsc_flush(c->sub, timeout_ms);
    if (e == FX_ECLOSED || e == FX_ELEASE_LOST) return consumer_sub_failed(c, e);
    return e;
}

bool fx_mpmc_consumer_fenced(fx_mpmc_consumer *c)
{
    int64_t over = 0;
    return c && consumer_unconfirmed(c, &over);
}

int64_t fx_mpmc_consumer_member(const fx_mpmc_consumer *c) { return c ? c->m.member : -1; }
int64_t fx_mpmc_consumer_chan(const fx_mpmc_consumer *c) { return c ? c->chan : -1; }

fx_err fx__mpmc_consumer_fence(const fx_mpmc_consumer *c, fx_mq_key *key, int64_t *create_rev)
{
    if (!c || !c->sub) return fx_seterr(FX_EINVAL, "mpmc consumer: not bound");
    return fx__mpsc_consumer_fence(c->sub, key, create_rev);
}

void fx__mpmc_consumer_committed(const fx_mpmc_consumer *c, const int64_t *pidx, size_t n,
                                 int64_t *out)
{
    if (c && c->sub) {
        fx__mpsc_consumer_committed(c->sub, pidx, n, out);
        return;
    }
    for (size_t i = 0; i < n; i++) out[i] = FX_MQ_CONSUME_OFFSET_BEGIN;
}

void fx_mpmc_consumer_set_notify(fx_mpmc_consumer *c, void (*fn)(void *arg), void *arg)
{
    if (c && c->sub) fx__mpsc_consumer_set_notify(c->sub, fn, arg);
}

/* ---- producer ----------------------------------------------------------------------------------- */

typedef struct ready_ent {
    int64_t chan;
    uint64_t used; /* LRU clock value of the last use (or of becoming ready) */
} ready_ent;

typedef struct sub_prod {
    int64_t chan;
    fx_mpsc_producer *p;
} sub_prod;

struct fx_mpmc_producer {
    mpmc_member m;
    int64_t weight;
    pthread_mutex_t cand_mu; /* serialises routing (candidates, creating the first sub-MPSC) */
    fx_watch *watch;       /* ready prefix */
    bool watch_op;         /* holds a client op reference for the watch */
    /* under m.mu: */
    ready_ent *ready;
    size_t n_ready, cap_ready;
    uint64_t clock;
    int64_t *list; /* mpsc_channels as known locally (creation order) */
    size_t n_list, cap_list;
    int64_t list_read_ms;
    sub_prod *subs; /* cached sub-producers (closed by close, freed by free) */
    size_t n_subs, cap_subs;
    /* Sub-MPSCs reserved by a put in progress or held (fx_mpmc_put_hold) until released: no
     * other put routes to them, so batches in flight at once go to distinct sub-MPSCs and the
     * holder answers its batch before the next batch of that sub-MPSC is stored. */
    int64_t *busy;
    size_t n_busy, cap_busy;
    _Atomic uint64_t reroutes; /* fx__mpmc_producer_reroutes */
};

static bool grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap * 2 : 8;
    while (nc < need) nc *= 2;
    void *na = realloc(*arr, nc * elem);
    if (!na) return false;
    *arr = na;
    *cap = nc;
    return true;
}

/* Keep the global-long leases of every sub-MPSC in the local list alive (keeper_sync). */
static void producer_keep_list(fx_mpmc_producer *p)
{
    mpmc_member *m = &p->m;
    pthread_mutex_lock(&m->mu);
    size_t n = p->n_list;
    int64_t *ids = n ? malloc(n * sizeof *ids) : NULL;
    if (ids) memcpy(ids, p->list, n * sizeof *ids);
    pthread_mutex_unlock(&m->mu);
    if (ids) keeper_sync(m, ids, n);
    free(ids);
}

/* m.mu held. */
static long ready_find(const fx_mpmc_producer *p, int64_t chan)
{
    for (size_t i = 0; i < p->n_ready; i++)
        if (p->ready[i].chan == chan) return (long)i;
    return -1;
}

/* m.mu held. A newly ready channel counts as most recently used. */
static void ready_add(fx_mpmc_producer *p, int64_t chan)
{
    if (ready_find(p, chan) >= 0) return;
    if (!grow((void **)&p->ready, &p->cap_ready, p->n_ready + 1, sizeof *p->ready)) {
        FX_ERR("mpmc %" PRId64 ": out of memory tracking ready sub-MPSCs", p->m.mpmc);
        return;
    }
    p->ready[p->n_ready++] = (ready_ent){.chan = chan, .used = ++p->clock};
    if (!ids_has(p->list, p->n_list, chan) &&
        grow((void **)&p->list, &p->cap_list, p->n_list + 1, sizeof *p->list))
        p->list[p->n_list++] = chan;
}

static void ready_remove(fx_mpmc_producer *p, int64_t chan)
{
    long i = ready_find(p, chan);
    if (i < 0) return;
    p->ready[i] = p->ready[--p->n_ready];
}

static void ready_watch_cb(void *arg, const fx_watch_update *u)
{
    fx_mpmc_producer *p = arg;
    mpmc_member *m = &p->m;
    const fx_mq_keys *keys = &m->c->keys;
    pthread_mutex_lock(&m->mu);
    if (u->kind == FX_WATCH_SNAPSHOT) {
        int64_t *ids = u->n_kvs ? calloc(u->n_kvs, sizeof *ids) : NULL;
        if (u->n_kvs && !ids) {
            FX_ERR("mpmc %" PRId64 ": out of memory applying a ready snapshot", m->mpmc);
        } else {
            size_t n = 0;
            for (size_t i = 0; i < u->n_kvs; i++) {
                int64_t mp = -1, id = -1;
                fx_slice k = {u->kvs[i].key.data, u->kvs[i].key.len};
                if (fx_mq_parse_ready_key(keys, k, &mp, &id) == FX_OK && mp == m->mpmc)
                    ids[n++] = id;
            }
            for (size_t i = 0; i < p->n_ready;) { /* drop what is no longer ready */
                if (!ids_has(ids, n, p->ready[i].chan))
                    p->ready[i] = p->ready[--p->n_ready];
                else
                    i++;
            }
            if (n > 1) qsort(ids, n, sizeof *ids, cmp_i64); /* equal newcomers: ascending ids */
            for (size_t i = 0; i < n; i++) ready_add(p, ids[i]);
            free(ids);
        }
    } else {
        for (size_t i = 0; i < u->n_events; i++) {
            const fx_event *ev = &u->events[i];
            int64_t mp = -1, id = -1;
            fx_slice k = {ev->kv.key.data, ev->kv.key.len};
            if (fx_mq_parse_ready_key(keys, k, &mp, &id) != FX_OK || mp != m->mpmc) continue;
            if (ev->type == FX_EV_PUT)
                ready_add(p, id);
            else
                ready_remove(p, id);
        }
    }
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    producer_keep_list(p); /* on the watch thread: I/O only for sub-MPSCs not held yet */
}

/* Read mpsc_channels into the local list (also returns the raw value for a CAS). */
static fx_err producer_read_list(fx_mpmc_producer *p, bool *present, fx_bytes *raw)
{
    mpmc_member *m = &p->m;
    fx_mq_key lk;
    fx_err e = fx_mq_key_mpmc_mpsc_channels(&m->c->keys, m->mpmc, &lk);
    if (e) return e;
    fx_kv kv = {0};
    e = fx_etcd_get(m->c->etcd, ks(&lk), &kv, m->c->op_timeout_ms);
    if (e && e != FX_ENOTFOUND) return e;
    *present = e == FX_OK;
    e = FX_OK;
    int64_t *ids = NULL;
    size_t n = 0;
    if (*present) {
        e = fx_mq_mpsc_list_decode(kv.value.data, kv.value.len, &ids, &n);
        if (!e && raw) e = bytes_copy(raw, &kv.value);
        fx_kv_free(&kv);
        if (e) {
            free(ids);
            return e;
        }
    }
    pthread_mutex_lock(&m->mu);
    /* Keep the local order; drop what the list no longer has (reclaimed) unless the ready watch
     * knows it (published after this read was answered); add what is new. */
    size_t kept = 0;
    for (size_t i = 0; i < p->n_list; i++)
        if (!*present || ids_has(ids, n, p->list[i]) || ready_find(p, p->list[i]) >= 0)
            p->list[kept++] = p->list[i];
    p->n_list = kept;
    for (size_t i = 0; i < n; i++) {
        if (ids_has(p->list, p->n_list, ids[i])) continue;
        if (!grow((void **)&p->list, &p->cap_list, p->n_list + 1, sizeof *p->list)) {
            e = fx_seterr(FX_ENOMEM, "mpmc: out of memory");
            break;
        }
        p->list[p->n_list++] = ids[i];
    }
    p->list_read_ms = fx_now_ms();
    pthread_mutex_unlock(&m->mu);
    free(ids);
    return e;
}

/* The producer may create only the first sub-MPSC: CAS mpsc_channels absent (or "[]") -> [id].
 * It never writes a ready key. */
static fx_err producer_create_first(fx_mpmc_producer *p)
{
    mpmc_member *m = &p->m;
    fx_mq_client *c = m->c;
    fx_mq_key lk;
    fx_err e = fx_mq_key_mpmc_mpsc_channels(&c->keys, m->mpmc, &lk);
    if (e) return e;
    for (int attempt = 0; attempt < MPMC_CREATE_FIRST_ATTEMPTS; attempt++) {
        bool present = false;
        fx_bytes raw = {0};
        if ((e = producer_read_list(p, &present, &raw))) return e;
        pthread_mutex_lock(&m->mu);
        size_t nl = p->n_list;
        pthread_mutex_unlock(&m->mu);
        if (nl > 0) {
            fx_bytes_free(&raw);
            return FX_OK;
        }
        if ((e = member_gate(m))) { /* never create after close or a lease loss */
            fx_bytes_free(&raw);
            return e;
        }
        fx_mq_chan_cfg cfg = {.capacity = m->meta.capacity, .ttl_s = m->meta.ttl_seconds,
                              .weight = p->weight};
        int64_t chan = -1;
        if ((e = fx__mpsc_create(c, &cfg, &m->parent, &chan))) {
            fx_bytes_free(&raw);
            return e;
        }
        char *json = NULL;
        if ((e = fx_mq_mpsc_list_encode(&chan, 1, &json))) {
            fx_bytes_free(&raw);
            return rollback_after(c, m->mpmc, chan, NULL, 0, e);
        }
        fx_cmp cmp = present ? cmp_value(ks(&lk), (fx_slice){raw.data, raw.len})
                             : cmp_absent(ks(&lk));
        fx_op put = op_put(ks(&lk), FX_SLICE_STR(json), m->meta.metadata_lease_id);
        fx_txn_req t = {.cmp = &cmp, .n_cmp = 1, .success = &put, .n_success = 1};
        fx_txn_resp r = {0};
        e = fx_etcd_txn(c->etcd, &t, &r, c->op_timeout_ms);
        bool won = !e && r.succeeded;
        fx_txn_resp_free(&r);
        free(json);
        fx_bytes_free(&raw);
        if (e) {
            /* Ambiguous: a re-read tells (the list is append-only). */
            bool pr = false, held = fx_err_hold();
            fx_err le = producer_read_list(p, &pr, NULL);
            fx_err_release(held);
            if (le == FX_OK) {
                pthread_mutex_lock(&m->mu);
                bool in = ids_has(p->list, p->n_list, chan);
                pthread_mutex_unlock(&m->mu);
                if (in) return FX_OK;
                return rollback_after(c, m->mpmc, chan, NULL, 0, e);
            }
            return e;
        }
        if (won) {
            pthread_mutex_lock(&m->mu);
            if (!ids_has(p->list, p->n_list, chan) &&
                grow((void **)&p->list, &p->cap_list, p->n_list + 1, sizeof *p->list))
                p->list[p->n_list++] = chan;
            pthread_mutex_unlock(&m->mu);
            FX_INF("mpmc %" PRId64 ": producer %" PRId64 " created the first sub-MPSC %" PRId64,
                   m->mpmc, m->member, chan);
            return FX_OK;
        }
        FX_DBG("mpmc %" PRId64 ": producer can only create the first sub-MPSC; using the winner's",
               m->mpmc);
        if ((e = rollback_unpublished(c, m->mpmc, chan, NULL, 0))) return e;
    }
    return fx_seterr(FX_EEXISTS, "mpmc %" PRId64 ": no first sub-MPSC after %d attempts", m->mpmc,
                     MPMC_CREATE_FIRST_ATTEMPTS);
}

static int ready_cmp_used(const void *a, const void *b)
{
    const ready_ent *x = a, *y = b;
    return x->used < y->used ? -1 : x->used > y->used;
}

/* Routing candidates for one pass: ready sub-MPSCs, least recently used first; else the first
 * unready one (list order); else create the first sub-MPSC. *out malloc'd. */
static fx_err producer_candidates(fx_mpmc_producer *p, int64_t **out, size_t *n)
{
    mpmc_member *m = &p->m;
    *out = NULL;
    *n = 0;
    for (int round = 0; round < 3; round++) {
        pthread_mutex_lock(&m->mu);
        if (p->n_ready > 0) {
            size_t k = p->n_ready;
            ready_ent *tmp = malloc(k * sizeof *tmp);
            int64_t *ids = malloc(k * sizeof *ids);
            if (!tmp || !ids) {
                pthread_mutex_unlock(&m->mu);
                free(tmp);
                free(ids);
                return fx_seterr(FX_ENOMEM, "mpmc: out of memory");
            }
            memcpy(tmp, p->ready, k * sizeof *tmp);
            pthread_mutex_unlock(&m->mu);
            qsort(tmp, k, sizeof *tmp, ready_cmp_used);
            for (size_t i = 0; i < k; i++) ids[i] = tmp[i].chan;
            free(tmp);
            *out = ids;
            *n = k;
            return FX_OK;
        }
        bool stale = p->n_list == 0 || fx_now_ms() - p->list_read_ms > MPMC_LIST_REFRESH_MS;
        if (round == 0 && stale) {
            pthread_mutex_unlock(&m->mu);
            bool present = false;
            fx_err e = producer_read_list(p, &present, NULL);
            if (e) return e;
            producer_keep_list(p);
            continue;
        }
        for (size_t i = 0; i < p->n_list; i++) {
            if (ready_find(p, p->list[i]) >= 0) continue;
            int64_t *ids = malloc(sizeof *ids);
            if (!ids) {
                pthread_mutex_unlock(&m->mu);
                return fx_seterr(FX_ENOMEM, "mpmc: out of memory");
            }
            ids[0] = p->list[i];
            pthread_mutex_unlock(&m->mu);
            *out = ids;
            *n = 1;
            return FX_OK;
        }
        size_t nl = p->n_list;
        pthread_mutex_unlock(&m->mu);
        if (nl == 0) {
            fx_err e = producer_create_first(p);
            if (e) return e;
            producer_keep_list(p);
        }
    }
    return fx_seterr(FX_EPROTO, "mpmc %" PRId64 ": no routing candidate", m->mpmc);
}

/* The cached sub-producer of chan, bound lazily. */
static fx_err producer_sub(fx_mpmc_producer *p, int64_t chan, fx_mpsc_producer **out)
{
    mpmc_member *m = &p->m;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < p->n_subs; i++)
        if (p->subs[i].chan == chan) {
            *out = p->subs[i].p;
            pthread_mutex_unlock(&m->mu);
            return FX_OK;
        }
    pthread_mutex_unlock(&m->mu);
    fx_mpsc_producer *sp = NULL;
    fx_err e = fx__mpsc_producer_open_sub(m->c, chan, p->weight, &m->parent, &sp);
    if (e) return e;
    pthread_mutex_lock(&m->mu);
    if (!member_open_locked(m) ||
        !grow((void **)&p->subs, &p->cap_subs, p->n_subs + 1, sizeof *p->subs)) {
        bool open = member_open_locked(m);
        pthread_mutex_unlock(&m->mu);
        fx_mpsc_producer_close(sp);
        fx_mpsc_producer_free(sp);
        if (open) return fx_seterr(FX_ENOMEM, "mpmc: out of memory");
        return member_gate(m);
    }
    p->subs[p->n_subs++] = (sub_prod){.chan = chan, .p = sp};
    pthread_mutex_unlock(&m->mu);
    FX_DBG("mpmc %" PRId64 ": producer %" PRId64 " bound sub-MPSC %" PRId64, m->mpmc, m->member,
           chan);
    *out = sp;
    return FX_OK;
}

/* Drop a cached sub-producer that failed by itself (re-bound on its next turn). */
static void producer_drop_sub(fx_mpmc_producer *p, int64_t chan)
{
    mpmc_member *m = &p->m;
    fx_mpsc_producer *sp = NULL;
    pthread_mutex_lock(&m->mu);
    if (member_open_locked(m)) { /* else close owns the cache */
        for (size_t i = 0; i < p->n_subs; i++)
            if (p->subs[i].chan == chan) {
                sp = p->subs[i].p;
                p->subs[i] = p->subs[--p->n_subs];
                break;
            }
    }
    pthread_mutex_unlock(&m->mu);
    if (sp) {
        fx_mpsc_producer_close(sp);
        fx_mpsc_producer_free(sp);
    }
}

static void producer_touch(fx_mpmc_producer *p, int64_t chan)
{
    pthread_mutex_lock(&p->m.mu);
    long i = ready_find(p, chan);
    if (i >= 0) p->ready[i].used = ++p->clock;
    pthread_mutex_unlock(&p->m.mu);
}

/* Reserve chan for one put; false when another put holds it. */
static bool producer_reserve(fx_mpmc_producer *p, int64_t chan, bool *oom)
{
    mpmc_member *m = &p->m;
    pthread_mutex_lock(&m->mu);
    bool ok = !ids_has(p->busy, p->n_busy, chan);
    if (ok && !grow((void **)&p->busy, &p->cap_busy, p->n_busy + 1, sizeof *p->busy)) {
        ok = false;
        *oom = true;
    }
    if (ok) p->busy[p->n_busy++] = chan;
    pthread_mutex_unlock(&m->mu);
    return ok;
}

static void producer_unreserve(fx_mpmc_producer *p, int64_t chan)
{
    mpmc_member *m = &p->m;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < p->n_busy; i++)
        if (p->busy[i] == chan) {
            p->busy[i] = p->busy[--p->n_busy];
            break;
        }
    pthread_cond_broadcast(&m->cv); /* a put waiting for a reserved sub-MPSC */
    pthread_mutex_unlock(&m->mu);
}

/* After a sub-producer failure: the endpoint's own error when it must stop (closed, or one of
 * its leases expired: then it closes itself), FX_OK when only that sub-producer is affected. */
static fx_err producer_stop_err(fx_mpmc_producer *p, bool ask_backend)
{
    mpmc_member *m = &p->m;
    int64_t l;
    if (member_leases_expired(m, &l)) return member_fail_lost(m, l);
    pthread_mutex_lock(&m->mu);
    bool open = member_open_locked(m);
    pthread_mutex_unlock(&m->mu);
    if (!open) return member_gate(m);
    if (ask_backend && member_probe_leases(m, &l)) return member_fail_lost(m, l);
    return FX_OK;
}

/* One put (fx_mpmc_put: hold false, the whole batch; fx_mpmc_put_hold: hold true, returns after
 * the first sub-MPSC that stored anything, keeping it reserved in *held). */
static fx_err put_locked(fx_mpmc_producer *p, const fx_slice *values, size_t n, int timeout_ms,
                         size_t *done, fx_mq_msg_id *ids, bool hold, int64_t *held)
{
    mpmc_member *m = &p->m;
    int64_t now = fx_now_ms();
    int64_t deadline = now + (timeout_ms > 0 ? timeout_ms : 0);
    /* Waiting for a sub-MPSC reserved by another put is not waiting for room: bounded apart. */
    int64_t busy_deadline = now + (timeout_ms > MPMC_BUSY_WAIT_MS ? timeout_ms : MPMC_BUSY_WAIT_MS);
    int64_t poll = MPMC_FULL_POLL_MIN_MS;
    int rereads = 0; /* list re-reads after a sub-MPSC vanished (reclaimed) */
    fx_err e;
    for (;;) {
        if ((e = member_gate(m))) return e;
        int64_t *cand = NULL;
        size_t nc = 0;
        pthread_mutex_lock(&p->cand_mu);
        e = producer_candidates(p, &cand, &nc);
        pthread_mutex_unlock(&p->cand_mu);
        if (e) {
            fx_err se = producer_stop_err(p, e == FX_ELEASE_EXPIRED);
            return se ? se : e;
        }
        bool full = false, busy = false, gone = false;
        /* The last bind failure (code and text: later candidates record their own). */
        fx_err last = FX_OK;
        char last_txt[512] = "";
        for (size_t i = 0; i < nc; i++) {
            if ((e = member_gate(m))) break;
            bool oom = false;
            if (!producer_reserve(p, cand[i], &oom)) {
                if (oom) {
                    e = fx_seterr(FX_ENOMEM, "mpmc: out of memory");
                    break;
                }
                busy = true;
                continue;
            }
            fx_mpsc_producer *sp = NULL;
            e = producer_sub(p, cand[i], &sp);
            if (e) { /* bind failed: the endpoint's problem, or try the next one */
                producer_unreserve(p, cand[i]);
                last = e;
                snprintf(last_txt, sizeof last_txt, "%s", fx_err_detail());
                if ((e = producer_stop_err(p, last == FX_ELEASE_EXPIRED))) break;
                FX_DBG("mpmc %" PRId64 ": bind of sub-MPSC %" PRId64 " failed: %s (%s)", m->mpmc,
                       cand[i], fx_errname(last), last_txt);
                if (last == FX_ELEASE_LOST || last == FX_ECLOSED) last = FX_EUNAVAIL;
                if (last == FX_ENOTFOUND) { /* meta gone: reclaimed; route elsewhere */
                    gone = true;
                    p->reroutes++;
                    pthread_mutex_lock(&m->mu);
                    ready_remove(p, cand[i]);
                    pthread_mutex_unlock(&m->mu);
                }
                continue;
            }
            size_t k = 0;
            producer_touch(p, cand[i]);
            e = fx__mpsc_try_put(sp, values + *done, n - *done, &k, ids ? ids + *done : NULL);
            *done += k;
            if (hold && k > 0) { /* the caller answers these, then releases the sub-MPSC */
                *held = cand[i];
                if (e == FX_EFULL) e = FX_OK; /* the rest did not fit here: call again */
                break;
            }
            if (e == FX_OK) {
                producer_unreserve(p, cand[i]);
                break;
            }
            if (e == FX_EFULL) {
                producer_unreserve(p, cand[i]);
                full = true;
                e = FX_OK;
                continue;
            }
            if (e == FX_ELEASE_LOST || e == FX_ECLOSED) {
                char d[256];
                snprintf(d, sizeof d, "%s", fx_err_detail());
                if ((e = producer_stop_err(p, true))) {
                    producer_unreserve(p, cand[i]);
                    break;
                }
                /* Not one of the member's leases: this sub-producer only. The endpoint stays
                 * open (FX_ELEASE_LOST / FX_ECLOSED belong to the endpoint's own state). */
                FX_WRN("mpmc %" PRId64 ": sub-producer of sub-MPSC %" PRId64 " closed itself (%s);"
                       " dropping it", m->mpmc, cand[i], d);
                last = FX_EUNAVAIL;
                snprintf(last_txt, sizeof last_txt, "sub-MPSC %" PRId64 " producer closed itself: "
                         "%s", cand[i], d);
                producer_drop_sub(p, cand[i]);
                producer_unreserve(p, cand[i]);
                gone = true; /* membership gone: reclaimed, or its lease lost */
                p->reroutes++;
                continue;
            }
            producer_unreserve(p, cand[i]);
            break; /* another error: returned with the partial count */
        }
        free(cand);
        if (e || *done == n || (hold && *held >= 0)) return e;
        if (!full && last && gone && rereads++ < 2) { /* re-read the list, route again */
            pthread_mutex_lock(&m->mu);
            p->list_read_ms = 0;
            pthread_mutex_unlock(&m->mu);
            continue;
        }
        if (!full && !busy && last) return fx_seterr(last, "%s", last_txt);
        int64_t until = full ? deadline : busy_deadline;
        if (fx_now_ms() >= until) {
            if (!full)
                return fx_seterr(FX_ETIMEDOUT, "mpmc %" PRId64 ": every sub-MPSC reserved by "
                                 "other puts until the deadline", m->mpmc);
            return fx_seterr(FX_EFULL, "mpmc %" PRId64 ": every sub-MPSC full until the deadline "
                             "(%zu of %zu stored)", m->mpmc, *done, n);
        }
        int64_t left = fx_ms_left(until);
        member_wait(m, poll < left ? poll : left);
        poll = poll * 2 > MPMC_FULL_POLL_MAX_MS ? MPMC_FULL_POLL_MAX_MS : poll * 2;
    }
}

/* The entry of fx_mpmc_put and fx_mpmc_put_hold (arguments checked by the caller). */
static fx_err put_entry(fx_mpmc_producer *p, const fx_slice *values, size_t n, int timeout_ms,
                        size_t *n_put, fx_mq_msg_id *ids, bool hold, int64_t *held)
{
    fx_err e = member_gate(&p->m);
    size_t done = 0;
    if (!e && n > 0) {
        if (!(e = fx__mq_op_enter(p->m.c))) {
            e = put_locked(p, values, n, timeout_ms, &done, ids, hold, held);
            fx__mq_op_leave(p->m.c);
        }
    }
    if (n_put) *n_put = done;
    return e;
}

fx_err fx_mpmc_put(fx_mpmc_producer *p, const fx_slice *values, size_t n, int timeout_ms,
                   size_t *n_put, fx_mq_msg_id *ids)
{
    if (n_put) *n_put = 0;
    if (!p || (n && !values)) return fx_seterr(FX_EINVAL, "mpmc put: bad arguments");
    return put_entry(p, values, n, timeout_ms, n_put, ids, false, NULL);
}

fx_err fx_mpmc_put_hold(fx_mpmc_producer *p, const fx_slice *values, size_t n, int timeout_ms,
                        size_t *n_put, fx_mq_msg_id *ids, int64_t *held)
{
    if (n_put) *n_put = 0;
    if (held) *held = -1;
    if (!p || !held || (n && !values)) return fx_seterr(FX_EINVAL, "mpmc put: bad arguments");
    return put_entry(p, values, n, timeout_ms, n_put, ids, true, held);
}

void fx_mpmc_put_release(fx_mpmc_producer *p, int64_t held)
{
    if (p && held >= 0) producer_unreserve(p, held);
}

size_t fx_mpmc_producer_ready(fx_mpmc_producer *p)
{
    if (!p) return 0;
    pthread_mutex_lock(&p->m.mu);
    size_t n = p->n_ready;
    pthread_mutex_unlock(&p->m.mu);
    return n;
}

/* Close pass: close the cached sub-producers (first error returned), stop the watch, delete the
 * role key, release the handles. */
static fx_err producer_close_pass(void *self)
{
    fx_mpmc_producer *p = self;
    mpmc_member *m = &p->m;
    fx_mq_client *c = m->c;
    int64_t deadline = fx_now_ms() + c->close_timeout_ms;
    bool have_op = fx__mq_op_enter(c) == FX_OK;
    fx_err first = FX_OK;
    bool held = false; /* from the first failure on: its detail is kept through the rest */
    /* state is CLOSING: puts neither add nor drop cached subs any more. */
    pthread_mutex_lock(&m->mu);
    size_t ns = p->n_subs;
    fx_mpsc_producer **sps = ns ? malloc(ns * sizeof *sps) : NULL;
    for (size_t i = 0; sps && i < ns; i++) sps[i] = p->subs[i].p;
    fx_watch *w = p->watch;
    p->watch = NULL;
    pthread_mutex_unlock(&m->mu);
    for (size_t i = 0; i < ns; i++) {
        fx_mpsc_producer *sp = sps ? sps[i] : p->subs[i].p;
        fx_err e = fx_mpsc_producer_close(sp);
        if (e && e != FX_ECLOSED && e != FX_ELEASE_LOST && !first) {
            first = e;
            held = fx_err_hold();
        }
    }
    free(sps);
    fx_watch_stop(w);
    if (p->watch_op) {
        p->watch_op = false;
        fx__mq_op_leave(c);
    }
    member_close_tail(m, deadline, have_op, false);
    if (have_op) fx__mq_op_leave(c);
    FX_DBG("mpmc %" PRId64 ": producer %" PRId64 " closed", m->mpmc, m->member);
    if (first) fx_err_release(held);
    return first;
}

static fx_err producer_close_cb(void *self)
{
    fx_mpmc_producer *p = self;
    return member_close(&p->m, producer_close_pass, p);
}

fx_err fx_mpmc_producer_close(fx_mpmc_producer *p)
{
    if (!p) return fx_seterr(FX_EINVAL, "mpmc producer close: NULL");
    return producer_close_cb(p);
}

static void producer_dealloc(fx_mpmc_producer *p)
{
    member_wait_users(&p->m);
    for (size_t i = 0; i < p->n_subs; i++) fx_mpsc_producer_free(p->subs[i].p);
    free(p->subs);
    free(p->busy);
    free(p->ready);
    free(p->list);
    pthread_mutex_destroy(&p->cand_mu);
    member_destroy(&p->m);
    free(p);
}

void fx_mpmc_producer_free(fx_mpmc_producer *p)
{
    if (!p) return;
    fx_mpmc_producer_close(p);
    producer_dealloc(p);
}

static fx_err producer_start_watch(fx_mpmc_producer *p)
{
    mpmc_member *m = &p->m;
    fx_mq_client *c = m->c;
    fx_mq_key rp;
    fx_err e = fx_mq_prefix_mpmc_ready(&c->keys, m->mpmc, &rp);
    if (e) return e;
    uint8_t end[FX_MQ_KEY_CAP];
    size_t el = fx_prefix_end(ks(&rp), end);
    if ((e = fx__mq_op_enter(c))) return e; /* held until the watch is stopped */
    p->watch_op = true;
    fx_watch_opts o = {.key = ks(&rp), .range_end = {end, el}, .fn = ready_watch_cb, .arg = p};
    fx_watch *w = NULL;
    e = fx_watch_start(c->etcd, &o, c->op_timeout_ms, &w);
    if (e) return e; /* watch_op released by the close pass */
    pthread_mutex_lock(&m->mu);
    p->watch = w;
    pthread_mutex_unlock(&m->mu);
    return FX_OK;
}

fx_err fx_mpmc_producer_open(fx_mq_client *c, int64_t mpmc, int64_t weight,
                             fx_mpmc_producer **out)
{
    if (!c || !out || mpmc < 0 || weight < 0)
        return fx_seterr(FX_EINVAL, "mpmc producer open: bad arguments");
    *out = NULL;
    fx_mpmc_producer *p = calloc(1, sizeof *p);
    if (!p) return fx_seterr(FX_ENOMEM, "mpmc producer: out of memory");
    p->weight = weight;
    fx_err e = member_init(&p->m, c, mpmc, FX_MQ_ROLE_PRODUCER, producer_close_cb, p);
    if (e) {
        free(p);
        return e;
    }
    if (pthread_mutex_init(&p->cand_mu, NULL) != 0) {
        member_destroy(&p->m);
        free(p);
        return fx_seterr(FX_ENOMEM, "mpmc: mutex init");
    }
    if ((e = fx__mq_new_op_enter(c))) {
        pthread_mutex_destroy(&p->cand_mu);
        member_destroy(&p->m);
        free(p);
        return e;
    }
    if ((e = fx__mq_register(c, &p->m.ep))) {
        fx__mq_op_leave(c);
        pthread_mutex_destroy(&p->cand_mu);
        member_destroy(&p->m);
        free(p);
        return e;
    }
    p->m.registered = true;
    e = member_attach(&p->m);
    if (!e) e = member_construct_check(&p->m);
    if (!e) e = producer_start_watch(p);
    if (!e) {
        bool present = false;
        e = producer_read_list(p, &present, NULL);
    }
    if (!e) producer_keep_list(p);
    e = member_construct_end(&p->m, e);
    fx__mq_op_leave(c);
    if (e) {
        bool held = fx_err_hold();
        fx_mpmc_producer_close(p);
        producer_dealloc(p);
        fx_err_release(held);
        return e;
    }
    *out = p;
    return FX_OK;
}

int64_t fx_mpmc_producer_member(const fx_mpmc_producer *p) { return p ? p->m.member : -1; }

uint64_t fx__mpmc_producer_reroutes(const fx_mpmc_producer *p) { return p ? p->reroutes : 0; }

fx_err fx_mpmc_producer_check(fx_mpmc_producer *p)
{
    if (!p) return fx_seterr(FX_EINVAL, "mpmc producer check: NULL");
    return member_gate(&p->m);
}
