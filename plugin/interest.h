/* interest.h -- which delivery subjects have subscribers on the local nats-server.
 *
 * Source: the monitoring endpoint GET <monitor_url>/subsz?subs=1&acc=<account>&offset=O&limit=L,
 * paged until a short page (nats-server 2.9 reports `total` as the page size: never trust it).
 * A subscription counts as interest in claim <token> of a channel when its subject is exactly the
 * literal "<deliver_prefix>.<token>" (one more token, no wildcard). Subscriptions of the bridge's
 * own client ids and subjects starting with '$' are skipped. Wildcard subscribers create no claim.
 *
 * Routed interest: nats-server 2.9's /subsz lists the subscriptions of the server's
 * own clients only; a subscriber connected to another server of the cluster shows up in
 * GET <monitor_url>/routez?subs=detail instead (per route: subject, and "sid" = "<account>
 * <subject>[ <queue>]"). The fetch reads it after the /subsz pages and adds those of `account`
 * (all accounts when account is empty). A server without routes answers an empty list.
 *
 * Bounded: a response body cap (16 MiB), a page cap, a per-request deadline.
 * Thread rules: fx_interest_parse is pure; fx_interest_fetch does one blocking HTTP exchange
 * (call it from the bridge's interest thread, never from a NATS callback).
 */
#ifndef FX_PLUGIN_INTEREST_H
#define FX_PLUGIN_INTEREST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fx_err.h"

/* A set of distinct literal subjects with at least one (non-bridge) subscriber. */
typedef struct fx_interest {
    char **subjects;  /* owned, sorted, unique */
    size_t n;
} fx_interest;
void fx_interest_free(fx_interest *s);
bool fx_interest_has(const fx_interest *s, const char *subject);

/* Add the literal subscriptions of one /subsz page body to *acc (dedup). exclude_cids: the
 * bridge's own client ids. *page_len receives the number of entries in the page (0 for the
 * stats-only shape). FX_EPROTO on malformed JSON. */
fx_err fx_interest_parse(const char *body, size_t len, const uint64_t *exclude_cids,
                         size_t n_exclude, fx_interest *acc, size_t *page_len);

/* Add the literal routed subscriptions of account (NULL/empty: any) in one /routez?subs=detail
 * body to *acc (dedup). FX_EPROTO on malformed JSON. */
fx_err fx_interest_parse_routez(const char *body, size_t len, const char *account,
                                fx_interest *acc);

/* Fetch every /subsz page and the /routez routed subscriptions from monitor_url for account and
 * return the set. */
fx_err fx_interest_fetch(const char *monitor_url, const char *account,
                         const uint64_t *exclude_cids, size_t n_exclude, int timeout_ms,
                         fx_interest *out);

/* The claim token of subject under deliver_prefix ("q.orders" + "q.orders.alice" -> "alice"),
 * or NULL if subject is not exactly one token under the prefix. Returns a pointer into subject. */
const char *fx_interest_claim_token(const char *deliver_prefix, const char *subject);

#endif
