/* mpsc.c -- Fluxon MPSC: create, ChanManager (four real lease handles), membership; the producer
 * with the batched, gap-free write path is in mpsc_prod.c, the consumer with the watch-driven
 * at-least-once read path in mpsc_cons.c, what they share in mpsc_int.h, the payload planes in
 * plane.h. Contracts: fluxon_mq.h (public), mq_int.h (fx__mpsc_*).
 *
 * Producer write path (one put call, serialised per producer):
 *   capacity: count_prefix(payload prefix of the channel) -> room = capacity - count; no room:
 *   wait on the producer condvar (woken by close / lease loss) polling the count every
 *   CAP_POLL_MS until the put's deadline (FX_EFULL then). Store min(room, rest) values in chunks
 *   of <= CHUNK_MSGS values / CHUNK_BYTES bytes. One chunk = ids [next, next+m):
 *     ONE txn  compare(produce offset == next-1 (absent when next == 0), membership key exists,
 *              the channel's meta exists: the bind's proof, member_txn)
 *              success: offset put (global lease), with the payload puts (payload lease) on the
 *                       etcd fused plane; failure: read offset, membership, meta (count)
 *     on the split planes (etcd split, Redis) the payloads are written before it (put_many);
 *     plane.h has the three planes (fused, split, Redis) and where their payload ops go.
 *   The compare makes a retry of an ambiguous failure (timeout after send) idempotent: a retry
 *   that finds the offset already at next+m-1 knows the first attempt landed. `next` advances only
 *   after success; a chunk that cannot be confirmed before the deadline leaves `offset_unknown`,
 *   and the next put re-reads the produce offset before choosing ids. So no id is skipped and no
 *   id is written twice with different values. A missing membership key means the member lease
 *   is gone or the sub-MPSC was reclaimed, a missing meta the latter: the producer closes itself
 *   (FX_ELEASE_LOST; an MPMC producer reroutes the batch). A write refused because a lease is gone
 *   (payload or global): the same.
 *
 * Consumer read path:
 *   resume points = consume offsets read once at open; the client's shared produce-offset watch
 *   (pwatch.h: one stream per client, registered first) plus one read of the channel's produce
 *   offsets right after registering raise produce[p] monotonically and wake get(). get() picks producers
 *   round robin among those with produce >= next_fetch, reads a run with ONE range read, skips
 *   (ERR with the ids + counters: the consumer's skipped_ids and the client's payload_missing,
 *   treated as acked) ids missing below the produce offset: the payload plane lost them (e.g.
 *   Redis without fsync); a consumer never waits for them. ack() marks ids in a
 *   per-producer window; a commit round (commit_pool.h) advances each consume offset over the contiguous
 *   acked prefix and deletes the payloads below it: one txn (offset puts + payload range deletes)
 *   on the fused plane, else offsets first, then payload delete_range (plane.h). Failed commits retry with
 *   a bounded backoff; close makes one final bounded attempt.
 *
 * Bounds: at most MAX_UNACKED (65536) handed-out, unacknowledged ids per producer: get() skips a
 * producer at that bound (and times out if nothing else is ready) until acks come in.
 *
 * Endpoint lifecycle (both kinds): lifecycle.h's fx_life, guarded by the endpoint's `mu`
 * (OPEN -> CLOSING -> CLOSED, RETRY for a consumer close that failed strongly): the first closer
 * does the work, concurrent closers wait for CLOSED, the worker unregisters from the client root
 * after CLOSED and then leaves the close; free waits for CLOSED and for every closer to have left.
 * A lost lease is armed at once: the next call reports FX_ELEASE_LOST and closes the endpoint.
 */
#include "mpsc_int.h"

/* ---- ChanManager ------------------------------------------------------------------------------ */

void mgr_release(chan_mgr *m)
{
    fx_lease_release(m->h_member);
    fx_lease_release(m->h_payload);
    fx_lease_release(m->h_long);
    fx_lease_release(m->h_global);
    m->h_member = m->h_payload = m->h_long = m->h_global = NULL;
}

fx_err read_meta(fx_mq_client *c, int64_t chan, fx_mq_chan_meta *out)
{
    fx_mq_key k;
    fx_err e = key_err(fx_mq_key_chan_meta(&c->keys, chan, &k), "meta");
    if (e) return e;
    fx_kv kv = {0};
    e = fx_etcd_get(c->etcd, fx_mq_key_slice(&k), &kv, c->op_timeout_ms);
    if (e == FX_ENOTFOUND)
        return fx_seterr(FX_ENOTFOUND, "mpsc channel %lld: meta not found", (long long)chan);
    if (e) return e;
    e = fx_mq_chan_meta_decode(kv.value.data, kv.value.len, out);
    fx_kv_free(&kv);
    return e;
}

/* The channel's global-long (id-allocator) lease expired while its meta lives on (a sub-MPSC
 * whose meta is kept by the MPMC metadata lease, unbound by anyone for long_lease_ttl_s). Its
 * counters went with it; no handle of the channel is alive (each holds that lease), so starting
 * them again cannot collide with a live membership, and producers resume after their produce
 * offset. Publish a fresh cluster lease and CAS it into the meta (the meta keeps its lease), then
 * register it. Concurrent binders converge on one lease (create==0 on the cluster-lease key, CAS
 * on the meta). */
fx_err mgr_renew_long(fx_mq_client *c, chan_mgr *m)
{
    fx_mq_key lk, mk;
    fx_err e = key_err(fx_mq_key_cluster_lease_id_alloc(&c->keys, m->chan, &lk), "cluster lease");
    if (!e) e = key_err(fx_mq_key_chan_meta(&c->keys, m->chan, &mk), "meta");
    if (e) return e;
    int64_t old = m->meta.global_long_lease_id;
    for (int attempt = 0; attempt < 3; attempt++) {
        int64_t nl = 0;
        bool granted = false;
        if ((e = fx__mq_cluster_lease(c, &lk, m->long_ttl_s, &nl, &granted))) return e;
        fx_kv kv = {0};
        if ((e = fx_etcd_get(c->etcd, fx_mq_key_slice(&mk), &kv, c->op_timeout_ms))) {
            fx_kv_free(&kv);
            return e == FX_ENOTFOUND ? fx_seterr(FX_ENOTFOUND, "mpsc channel %lld: meta gone",
                                                 (long long)m->chan)
                                     : e;
        }
        fx_mq_chan_meta cur;
        if ((e = fx_mq_chan_meta_decode(kv.value.data, kv.value.len, &cur))) {
            fx_kv_free(&kv);
            return e;
        }
        if (cur.global_long_lease_id == old) {
            fx_mq_chan_meta nm = cur;
            nm.global_long_lease_id = nl;
            char *js = NULL;
            if ((e = fx_mq_chan_meta_encode(&nm, &js))) {
                fx_kv_free(&kv);
                return e;
            }
            fx_cmp cmp = {.target = FX_CMP_MOD, .result = FX_CMP_EQUAL,
                          .key = fx_mq_key_slice(&mk), .num = kv.mod_revision};
            fx_op put = {.type = FX_OP_PUT,
                         .u.put = {.key = fx_mq_key_slice(&mk), .value = FX_SLICE_STR(js),
                                   .lease = kv.lease}};
            fx_txn_req tx = {.cmp = &cmp, .n_cmp = 1, .success = &put, .n_success = 1};
            fx_txn_resp resp = {0};
            e = fx_etcd_txn(c->etcd, &tx, &resp, c->op_timeout_ms);
            bool won = e == FX_OK && resp.succeeded;
            fx_txn_resp_free(&resp);
            free(js);
            fx_kv_free(&kv);
            if (e) return e;
            if (!won) continue; /* the meta changed under us: look again */
            cur = nm;
            FX_WRN("mpsc channel %lld: id-allocator lease %lld had expired; renewed as %lld "
                   "(its idx counters restart)",
                   (long long)m->chan, (long long)old, (long long)nl);
        } else {
            fx_kv_free(&kv);
            if (cur.global_long_lease_id != nl) continue; /* someone else's renewal: reread */
        }
        m->meta.global_long_lease_id = cur.global_long_lease_id;
        return fx__mq_hold(c, false, m->long_ttl_s, m->meta.global_long_lease_id, granted, NULL,
                           NULL, &m->h_long);
    }
    return fx_seterr(FX_ELEASE_EXPIRED, "mpsc channel %lld: id-allocator lease %lld expired and "
                     "could not be renewed", (long long)m->chan, (long long)old);
}

/* Bind a ChanManager to an existing channel (new_with_chan_id / new_mpmc_subchannel_with_chan_id):
 * read and validate meta, register global, global-long, payload, and the member lease (granted
 * here for a standalone endpoint, the parent's for a sub endpoint). Global, member and payload
 * handles carry the endpoint's expiry callback (the global lease holds the meta and the offsets:
 * without it a consumer would retry its commits forever). On error everything acquired is
 * released. */
fx_err mgr_open(fx_mq_client *c, int64_t chan, const fx__mpsc_parent *parent,
                fx_lease_expired_fn cb, void *arg, chan_mgr *m)
{
    memset(m, 0, sizeof *m);
    m->c = c;
    m->chan = chan;
    m->sub = parent != NULL;
    /* A fresh sub-MPSC (just created by this caller, unpublished): its meta is known and the
     * leases it shares with the parent are held by the parent member, the long one was just
     * granted: no read, no probes. */
    bool fresh = parent && parent->fresh_meta;
    fx_err e = key_err(fx_mq_key_chan_meta(&c->keys, chan, &m->k_meta), "meta");
    if (e) return e;
    if (fresh)
        m->meta = *parent->fresh_meta;
    else if ((e = read_meta(c, chan, &m->meta)))
        return e;
    if (parent) {
        if (m->meta.global_lease_id != parent->global_lease ||
            m->meta.payload_lease_id != parent->payload_lease)
            return fx_seterr(FX_EPROTO,
                             "sub-mpsc %lld: meta leases (global %lld, payload %lld) differ from "
                             "the parent's (%lld, %lld)",
                             (long long)chan, (long long)m->meta.global_lease_id,
                             (long long)m->meta.payload_lease_id, (long long)parent->global_lease,
                             (long long)parent->payload_lease);
        m->mpmc = parent->mpmc;
        m->ttl_s = parent->ttl_s > 0 ? parent->ttl_s : m->meta.ttl_seconds;
        m->data_ttl_s = parent->data_ttl_s > 0 ? parent->data_ttl_s : m->ttl_s;
        m->long_ttl_s = parent->long_ttl_s > 0 ? parent->long_ttl_s : c->long_ttl_s;
    } else {
        m->ttl_s = m->data_ttl_s = m->meta.ttl_seconds;
        m->long_ttl_s = c->long_ttl_s;
    }
    if ((e = fx__mq_hold(c, false, m->data_ttl_s, m->meta.global_lease_id, fresh, cb, arg,
                         &m->h_global)))
        goto fail;
    e = fx__mq_hold(c, false, m->long_ttl_s, m->meta.global_long_lease_id, fresh, NULL, NULL,
                    &m->h_long);
    if (e == FX_ELEASE_EXPIRED) e = mgr_renew_long(c, m);
    if (e) goto fail;
    if ((e = fx__mq_hold(c, true, m->data_ttl_s, m->meta.payload_lease_id, fresh, cb, arg,
                         &m->h_payload)))
        goto fail;
    bool granted = false;
    if (parent) {
        m->member_lease = parent->member_lease;
    } else {
        if ((e = fx__mq_grant(c, m->ttl_s, &m->member_lease))) goto fail;
        granted = true;
    }
    if ((e = fx__mq_hold(c, false, m->ttl_s, m->member_lease, granted || fresh, cb, arg,
                         &m->h_member)))
        goto fail;
    return FX_OK;
fail:
    mgr_release(m);
    return e;
}

/* ---- create ----------------------------------------------------------------------------------- */

fx_err fx__mpsc_create(fx_mq_client *c, const fx_mq_chan_cfg *cfg, const fx__mpsc_parent *parent,
                       int64_t *out_chan)
{
    if (!c || !cfg || !out_chan) return fx_seterr(FX_EINVAL, "mpsc create: NULL argument");
    fx_err e = fx__mq_cfg_validate(c, cfg);
    if (e) return e;
    if (parent && (parent->global_lease <= 0 || parent->payload_lease <= 0 || parent->mpmc < 0))
        return fx_seterr(FX_EINVAL, "mpsc create: parent overrides need global and payload leases");
    if ((e = fx__mq_new_op_enter(c))) return e;
    fx_lease *hg = NULL, *hl = NULL, *hp = NULL;
    char *js = NULL;
    int64_t chan = 0, gl = 0, gll = 0, pl = 0;
    bool g_new = false, l_new = false, p_new = false;
    fx_mq_key k;
    int64_t ttl = parent && parent->data_ttl_s > 0 ? parent->data_ttl_s : cfg->ttl_s;
    int64_t long_ttl = parent && parent->long_ttl_s > 0 ? parent->long_ttl_s : c->long_ttl_s;

    if ((e = key_err(fx_mq_key_alloc_chan_ids(&c->keys, &k), "chan counter"))) goto out;
    if ((e = fx__mq_alloc_ids(c, &k, 0, 1, &chan))) goto out;
    if (parent) {
        gl = parent->global_lease;
    } else {
        if ((e = key_err(fx_mq_key_cluster_lease_chan(&c->keys, chan, &k), "cluster lease")))
            goto out;
        if ((e = fx__mq_cluster_lease(c, &k, cfg->ttl_s, &gl, &g_new))) goto out;
    }
    if ((e = key_err(fx_mq_key_cluster_lease_id_alloc(&c->keys, chan, &k), "cluster lease")))
        goto out;
    if ((e = fx__mq_cluster_lease(c, &k, long_ttl, &gll, &l_new))) goto out;
    if (parent) {
        pl = parent->payload_lease;
    } else {
        if ((e = fx_kv_allocate_lease(c->kv, cfg->ttl_s, &pl, c->op_timeout_ms))) goto out;
        p_new = true;
    }
    if ((e = fx__mq_hold(c, false, ttl, gl, g_new, NULL, NULL, &hg))) goto out;
    if ((e = fx__mq_hold(c, false, long_ttl, gll, l_new, NULL, NULL, &hl))) goto out;
    if ((e = fx__mq_hold(c, true, ttl, pl, p_new, NULL, NULL, &hp))) goto out;

    fx_mq_chan_meta meta = {.capacity = cfg->capacity, .ttl_seconds = cfg->ttl_s,
                            .global_lease_id = gl, .global_long_lease_id = gll,
                            .payload_lease_id = pl, .segments = c->segments};
    if ((e = fx_mq_chan_meta_encode(&meta, &js))) goto out;
    if ((e = key_err(fx_mq_key_chan_meta(&c->keys, chan, &k), "meta"))) goto out;
    fx_cmp cmp = {.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL, .key = fx_mq_key_slice(&k)};
    fx_op put = {.type = FX_OP_PUT,
                 .u.put = {.key = fx_mq_key_slice(&k), .value = FX_SLICE_STR(js), .lease = gl}};
    fx_txn_req tx = {.cmp = &cmp, .n_cmp = 1, .success = &put, .n_success = 1};
    fx_txn_resp resp = {0};
    e = fx_etcd_txn(c->etcd, &tx, &resp, c->op_timeout_ms);
    if (e == FX_OK && !resp.succeeded)
        e = fx_seterr(FX_EEXISTS, "mpsc create: meta of channel %lld already exists",
                      (long long)chan);
    fx_txn_resp_free(&resp);
    if (e == FX_OK) {
        *out_chan = chan;
        FX_DBG("mpsc channel %lld created (global %lld, long %lld, payload %lld)",
               (long long)chan, (long long)gl, (long long)gll, (long long)pl);
    }
out:
    free(js);
    fx_lease_release(hp);
    fx_lease_release(hl);
    fx_lease_release(hg);
    fx__mq_op_leave(c);
    return e;
}

#define SUB_CHAN_ID_BLOCK 16

/* A sub-MPSC channel id: from this client's block, a new block of SUB_CHAN_ID_BLOCK ids from the
 * shared counter when it is used up (ids stay unique; a client that exits leaves a gap). */
static fx_err sub_chan_id(fx_mq_client *c, int64_t *out)
{
    pthread_mutex_lock(&c->ids_mu);
    fx_err e = FX_OK;
    if (c->chan_next >= c->chan_end) {
        fx_mq_key k;
        int64_t first = 0;
        e = key_err(fx_mq_key_alloc_chan_ids(&c->keys, &k), "chan counter");
        if (!e) e = fx__mq_alloc_ids(c, &k, 0, SUB_CHAN_ID_BLOCK, &first);
        if (!e) {
            c->chan_next = first;
            c->chan_end = first + SUB_CHAN_ID_BLOCK;
        }
    }
    if (!e) *out = c->chan_next++;
    pthread_mutex_unlock(&c->ids_mu);
    return e;
}

/* The sub-MPSC creation in two round trips (a thousand claims may each create one): a
 * channel id from the client's block, a grant of the new global-long lease, then ONE txn that
 * creates the id-allocator cluster-lease key and the meta (both create==0). The global and
 * payload leases are the parent's, held by the parent member: no registration here. Until the
 * sub-MPSC is published the meta key is bound to its own global-long lease (the publish txn
 * moves it to the global lease, mpmc.c consumer_publish): a sub-MPSC never published (its
 * creator crashed, or the publish was ambiguous and could not be verified) is unlisted, so no
 * reclaim sees it; every key of it then goes with that lease, which only its binder renews,
 * instead of living as long as the channel. On an error
 * after the txn was sent *out_chan and *out_meta are set: the txn may have landed and the caller
 * rolls the channel's keys back and revokes its global-long lease (rollback_unpublished);
 * otherwise *out_chan is -1 (and the lease, if granted, is revoked here). */
fx_err fx__mpsc_create_sub(fx_mq_client *c, const fx_mq_chan_cfg *cfg,
                           const fx__mpsc_parent *parent, int64_t *out_chan,
                           fx_mq_chan_meta *out_meta)
{
    if (!c || !cfg || !out_chan || !out_meta || !parent)
        return fx_seterr(FX_EINVAL, "mpsc create: NULL argument");
    *out_chan = -1;
    fx_err e = fx__mq_cfg_validate(c, cfg);
    if (e) return e;
    if (parent->global_lease <= 0 || parent->payload_lease <= 0 || parent->mpmc < 0)
        return fx_seterr(FX_EINVAL, "mpsc create: parent overrides need global and payload leases");
    if ((e = fx__mq_new_op_enter(c))) return e;
    int64_t chan = -1, gll = 0;
    int64_t long_ttl = parent->long_ttl_s > 0 ? parent->long_ttl_s : c->long_ttl_s;
    char *js = NULL;
    fx_mq_key lk, mk;
    if ((e = sub_chan_id(c, &chan))) goto out;
    if ((e = key_err(fx_mq_key_cluster_lease_id_alloc(&c->keys, chan, &lk), "cluster lease")))
        goto out;
    if ((e = key_err(fx_mq_key_chan_meta(&c->keys, chan, &mk), "meta"))) goto out;
    if ((e = fx__mq_grant(c, long_ttl, &gll))) goto out;
    fx_mq_chan_meta meta = {.capacity = cfg->capacity, .ttl_seconds = cfg->ttl_s,
                            .global_lease_id = parent->global_lease, .global_long_lease_id = gll,
                            .payload_lease_id = parent->payload_lease, .segments = c->segments};
    if ((e = fx_mq_chan_meta_encode(&meta, &js))) goto out;
    char lv[FX_MQ_DEC_BUF];
    size_t lvl = fx_mq_dec_format(gll, lv);
    fx_cmp cmp[2] = {
        {.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL, .key = fx_mq_key_slice(&lk)},
        {.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL, .key = fx_mq_key_slice(&mk)}};
    fx_op put[2] = {
        {.type = FX_OP_PUT, .u.put = {.key = fx_mq_key_slice(&lk), .value = {lv, lvl},
                                      .lease = gll}},
        {.type = FX_OP_PUT, .u.put = {.key = fx_mq_key_slice(&mk), .value = FX_SLICE_STR(js),
                                      .lease = gll}}};
    fx_txn_req tx = {.cmp = cmp, .n_cmp = 2, .success = put, .n_success = 2};
    fx_txn_resp resp = {0};
    e = fx_etcd_txn(c->etcd, &tx, &resp, c->op_timeout_ms);
    if (e) {
        *out_chan = chan; /* maybe landed: the caller rolls back (and revokes gll) */
        *out_meta = meta;
    } else if (!resp.succeeded) {
        e = fx_seterr(FX_EEXISTS, "mpsc create: keys of channel %lld already exist",
                      (long long)chan);
    }
    fx_txn_resp_free(&resp);
    if (e == FX_OK) {
        *out_chan = chan;
        *out_meta = meta;
        FX_DBG("sub-mpsc channel %lld created (global %lld, long %lld, payload %lld)",
               (long long)chan, (long long)meta.global_lease_id, (long long)gll,
               (long long)meta.payload_lease_id);
    } else if (gll && *out_chan < 0) {
        fx_err re = fx_etcd_lease_revoke(c->etcd, gll, c->op_timeout_ms);
        if (re && re != FX_ENOTFOUND)
            FX_DBG("sub-mpsc create: revoke of unused lease %lld: %s", (long long)gll,
                   fx_errname(re));
    }
out:
    free(js);
    fx__mq_op_leave(c);
    return e;
}

fx_err fx_mpsc_create(fx_mq_client *c, const fx_mq_chan_cfg *cfg, int64_t *out_chan)
{
    return fx__mpsc_create(c, cfg, NULL, out_chan);
}

/* Membership txn: create(key)==0 and create(meta) > 0 -> put key (member lease) [+ put weight key
 * (global lease)]. The meta compare is the bind's proof that the channel still exists:
 * a reclaim deletes the meta and every key under the channel prefix in one txn whose compares
 * see any key a bind put after the reclaim's read, so either the bind lands first (the reclaim
 * then fails its compare, or deletes this membership and the first put txn finds it gone) or
 * the reclaim lands first and this txn fails: FX_ENOTFOUND, the caller routes elsewhere. Channel
 * ids are never reused (a shared counter), so existence is proof enough. No extra round trip.
 * Retry-safe: when the key exists with our value and our lease, a previous attempt landed.
 * *create_rev (may be NULL): the membership key's create revision (the writer's fence: attempts.h).
 * excl (may be NULL): a prefix that must hold no key but ours (the consumer memberships of the
 * channel: an MPSC never has two live consumers, the reference's "invalid binding state" that
 * fails every producer put); the compare covers the whole prefix, so two binders racing cannot
 * both win. */
fx_err member_txn(fx_mq_client *c, fx_slice meta, fx_slice key, fx_slice val, int64_t lease,
                  const fx_slice *wkey, fx_slice wval, int64_t wlease, const fx_slice *excl,
                  int64_t *create_rev)
{
    if (create_rev) *create_rev = 0;
    fx_err e = FX_OK;
    uint8_t xend[FX_MQ_KEY_CAP];
    fx_slice xe = {NULL, 0};
    if (excl) xe = (fx_slice){xend, fx_prefix_end(*excl, xend)};
    for (int attempt = 0; attempt < MEMBER_TXN_ATTEMPTS; attempt++) {
        fx_cmp cmp[2] = {
            {.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL, .key = excl ? *excl : key,
             .range_end = xe},
            {.target = FX_CMP_CREATE, .result = FX_CMP_GREATER, .key = meta, .num = 0}};
        fx_op ok[2] = {
            {.type = FX_OP_PUT, .u.put = {.key = key, .value = val, .lease = lease}},
            {.type = FX_OP_PUT, .u.put = {.key = wkey ? *wkey : key, .value = wval,
                                          .lease = wlease}},
        };
        fx_op get[2] = {
            {.type = FX_OP_RANGE, .u.range = {.key = excl ? *excl : key, .range_end = xe}},
            {.type = FX_OP_RANGE, .u.range = {.key = meta, .count_only = true}}};
        fx_txn_req tx = {.cmp = cmp, .n_cmp = 2, .success = ok, .n_success = wkey ? 2 : 1,
                         .failure = get, .n_failure = 2};
        fx_txn_resp resp = {0};
        e = fx_etcd_txn(c->etcd, &tx, &resp, c->op_timeout_ms);
        if (e == FX_OK) {
            bool have = resp.n_responses == 2 && resp.responses[0].type == FX_OP_RANGE &&
                        resp.responses[1].type == FX_OP_RANGE;
            if (!resp.succeeded && have && resp.responses[1].u.range.count == 0) {
                fx_txn_resp_free(&resp); /* reclaimed (or expired) before this bind landed */
                return fx_seterr(FX_ENOTFOUND, "channel meta %.*s gone (reclaimed): not bound",
                                 (int)meta.len, (const char *)meta.data);
            }
            if (!resp.succeeded) {
                const fx_range_resp *r = have ? &resp.responses[0].u.range : NULL;
                const fx_kv *other = NULL;
                for (size_t i = 0; r && i < r->n_kvs && !other; i++) {
                    const fx_kv *kv = &r->kvs[i];
                    bool ours = kv->key.len == key.len &&
                                memcmp(kv->key.data, key.data, key.len) == 0 &&
                                kv->lease == lease && kv->value.len == val.len &&
                                memcmp(kv->value.data, val.data, val.len) == 0;
                    if (!ours) other = kv;
                    else if (create_rev) *create_rev = kv->create_revision;
                }
                if (r && r->n_kvs >= 1 && !other) {
                    e = FX_OK; /* our earlier attempt landed */
                } else if (excl && other) {
                    e = fx_seterr(FX_EEXISTS, "channel already has a consumer (membership %.*s): "
                                  "an MPSC takes one consumer at a time",
                                  (int)other->key.len, (const char *)other->key.data);
                } else {
                    e = fx_seterr(FX_EEXISTS, "membership key %.*s is held by another member",
                                  (int)key.len, (const char *)key.data);
                }
            } else if (create_rev) {
                *create_rev = resp.revision; /* the txn's revision: the key's creation */
            }
            fx_txn_resp_free(&resp);
            return e;
        }
        fx_txn_resp_free(&resp);
        if (!transient(e)) return e;
        fx_sleep_ms(RETRY_MIN_MS); /* bounded: MEMBER_TXN_ATTEMPTS x op deadline */
    }
    return e;
}
