/* claim_table.h -- the in-flight table of one consumer (a claim): the deliveries handed out by
 * fx_mpmc_get and not yet committed, indexed by claim seq (hash) and ordered by due time (binary
 * min-heap). The delivery engine (delivery.h) owns one; its front-end reads the entries.
 *
 * Contract:
 *  - Entries live in one array and are named by their index (uint32_t, CTAB_NIL: none). An index
 *    stays valid until ctab_release(); growth (ctab_alloc) may move the array, so a ctab_ent
 *    pointer is valid only until the next ctab_alloc.
 *  - Capacity grows on demand (64, then doubling) up to max_entries (clamped to [1, 2^24]);
 *    ctab_alloc returns CTAB_NIL at that cap or when memory runs out, the table unchanged.
 *    Before the table grows it calls the grow hook given to ctab_init with the new capacity, so
 *    the owner can size arrays that run parallel to it (indexed by entry or holding up to one
 *    item per entry); a hook that returns false makes the growth (and ctab_alloc) fail.
 *  - An entry whose state is E_FREE is free. ctab_alloc returns a zeroed entry (state E_FREE,
 *    not hashed, not scheduled) with a fresh gen: the caller sets its state before anything
 *    else (ctab_release ignores an entry in state E_FREE).
 *  - Ownership: the table owns each live entry's delivery (dv): ctab_release frees it
 *    (fx_mq_delivery_free). msg points into dv.value and dead_reason at static text.
 *  - Hash: ctab_hash indexes the entry by its claim_seq; change claim_seq only while the entry is
 *    not hashed (ctab_unhash first). Keys are not checked for uniqueness: with two entries of
 *    the same claim_seq hashed, ctab_find returns the one hashed last.
 *  - Heap: ctab_schedule (re)sets an entry's due time and puts it in the heap; ctab_unschedule
 *    takes it out; ctab_next is the entry due first (ties in no particular order).
 * Thread rules: none inside. A table belongs to one claim and only that claim's steps (one worker
 * at a time) use it; the caller provides any exclusion.
 */
#ifndef FX_CLAIM_TABLE_H
#define FX_CLAIM_TABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "flatdict.h"
#include "fluxon_mq.h"

#define CTAB_NIL UINT32_MAX
#define CTAB_MAX_ENTRIES (1u << 24)

enum { E_FREE = 0, E_WAIT_SEND, E_WAIT_ACK, E_WAIT_DLQ, E_DLQ_RETRY };

typedef struct ctab_ent {
    uint8_t state;
    bool hashed;
    uint64_t gen;
    fx_mq_delivery dv;
    fx_mq_msg msg;
    uint64_t delivered; /* attempts published (by earlier consumers too: bridge/attempts.h) */
    bool planned;       /* persist_attempts: to be published in this round */
    uint32_t rec_n;     /* attempt count the record of generation rec_gen holds for it */
    uint64_t rec_gen;
    uint64_t claim_seq, nonce;
    int64_t due_ms;
    int32_t heap_pos; /* -1: not in the heap */
    uint32_t hnext;
    const char *dead_reason;
} ctab_ent;

/* Called before the table grows to cap entries; false: do not grow. */
typedef bool (*ctab_grow_fn)(void *arg, uint32_t cap);

typedef struct ctab {
    uint32_t max_ents; /* the cap */
    ctab_ent *ents;    /* n_ents entries (the capacity), free ones in state E_FREE */
    uint32_t n_ents, n_used;
    uint32_t *freel; /* free indexes */
    uint32_t n_free;
    uint32_t *buckets; /* hash chains by claim_seq & nb_mask, linked by hnext */
    uint32_t nb_mask;
    uint32_t *heap; /* heap_n indexes, min-heap by due_ms */
    uint32_t heap_n;
    uint64_t gen_ctr;
    ctab_grow_fn grow;
    void *grow_arg;
} ctab;

/* Empty table of at most max_entries entries (no entry array yet). grow may be NULL. false: out
 * of memory (ctab_free still required). */
bool ctab_init(ctab *t, int64_t max_entries, ctab_grow_fn grow, void *arg);
/* Release every live entry and free the table's memory. */
void ctab_free(ctab *t);

/* A free entry (see the contract), or CTAB_NIL at the cap or out of memory. */
uint32_t ctab_alloc(ctab *t);
/* Unhash, unschedule and free the entry and its delivery. No-op for an entry in state E_FREE. */
void ctab_release(ctab *t, uint32_t idx);
void ctab_release_all(ctab *t);

void ctab_hash(ctab *t, uint32_t idx);
void ctab_unhash(ctab *t, uint32_t idx);
/* The entry hashed with claim seq cseq, or CTAB_NIL. */
uint32_t ctab_find(const ctab *t, uint64_t cseq);

void ctab_schedule(ctab *t, uint32_t idx, int64_t due_ms);
void ctab_unschedule(ctab *t, uint32_t idx);
/* The scheduled entry with the earliest due time, or CTAB_NIL. */
uint32_t ctab_next(const ctab *t);

#endif
