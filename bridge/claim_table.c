/* claim_table.c -- the in-flight table of one claim. Contract: claim_table.h. */
#include "claim_table.h"

#include <stdlib.h>
#include <string.h>

static void heap_swap(ctab *t, uint32_t a, uint32_t b)
{
    uint32_t ia = t->heap[a], ib = t->heap[b];
    t->heap[a] = ib;
    t->heap[b] = ia;
    t->ents[ib].heap_pos = (int32_t)a;
    t->ents[ia].heap_pos = (int32_t)b;
}

static void heap_up(ctab *t, uint32_t i)
{
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (t->ents[t->heap[p]].due_ms <= t->ents[t->heap[i]].due_ms) break;
        heap_swap(t, i, p);
        i = p;
    }
}

static void heap_down(ctab *t, uint32_t i)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < t->heap_n && t->ents[t->heap[l]].due_ms < t->ents[t->heap[m]].due_ms) m = l;
        if (r < t->heap_n && t->ents[t->heap[r]].due_ms < t->ents[t->heap[m]].due_ms) m = r;
        if (m == i) break;
        heap_swap(t, i, m);
        i = m;
    }
}

void ctab_unschedule(ctab *t, uint32_t idx)
{
    ctab_ent *e = &t->ents[idx];
    if (e->heap_pos < 0) return;
    uint32_t i = (uint32_t)e->heap_pos;
    e->heap_pos = -1;
    t->heap_n--;
    if (i == t->heap_n) return;
    t->heap[i] = t->heap[t->heap_n];
    t->ents[t->heap[i]].heap_pos = (int32_t)i;
    heap_down(t, i);
    heap_up(t, i);
}

void ctab_schedule(ctab *t, uint32_t idx, int64_t due)
{
    ctab_ent *e = &t->ents[idx];
    ctab_unschedule(t, idx);
    e->due_ms = due;
    t->heap[t->heap_n] = idx;
    e->heap_pos = (int32_t)t->heap_n;
    t->heap_n++;
    heap_up(t, (uint32_t)e->heap_pos);
}

uint32_t ctab_next(const ctab *t) { return t->heap_n ? t->heap[0] : CTAB_NIL; }

void ctab_unhash(ctab *t, uint32_t idx)
{
    ctab_ent *e = &t->ents[idx];
    if (!e->hashed) return;
    uint32_t *pp = &t->buckets[e->claim_seq & t->nb_mask];
    while (*pp != CTAB_NIL) {
        if (*pp == idx) {
            *pp = e->hnext;
            break;
        }
        pp = &t->ents[*pp].hnext;
    }
    e->hashed = false;
    e->hnext = CTAB_NIL;
}

void ctab_hash(ctab *t, uint32_t idx)
{
    ctab_ent *e = &t->ents[idx];
    uint32_t *b = &t->buckets[e->claim_seq & t->nb_mask];
    e->hnext = *b;
    *b = idx;
    e->hashed = true;
}

uint32_t ctab_find(const ctab *t, uint64_t cseq)
{
    for (uint32_t i = t->buckets[cseq & t->nb_mask]; i != CTAB_NIL; i = t->ents[i].hnext)
        if (t->ents[i].claim_seq == cseq) return i;
    return CTAB_NIL;
}

bool ctab_init(ctab *t, int64_t max_entries, ctab_grow_fn grow, void *arg)
{
    memset(t, 0, sizeof *t);
    t->grow = grow;
    t->grow_arg = arg;
    int64_t m = max_entries;
    if (m < 1) m = 1;
    if (m > (int64_t)CTAB_MAX_ENTRIES) m = CTAB_MAX_ENTRIES;
    t->max_ents = (uint32_t)m;
    uint32_t nb = 64;
    while (nb < 2 * t->max_ents && nb < (1u << 17)) nb <<= 1;
    t->nb_mask = nb - 1;
    t->buckets = malloc(nb * sizeof *t->buckets);
    if (!t->buckets) return false;
    for (uint32_t i = 0; i < nb; i++) t->buckets[i] = CTAB_NIL;
    return true;
}

static bool table_grow(ctab *t)
{
    if (t->n_ents >= t->max_ents) return false;
    uint32_t nn = t->n_ents ? t->n_ents * 2 : 64;
    if (nn > t->max_ents) nn = t->max_ents;
    ctab_ent *ne = realloc(t->ents, nn * sizeof *ne);
    if (!ne) return false;
    t->ents = ne;
    uint32_t *nf = realloc(t->freel, nn * sizeof *nf);
    if (!nf) return false;
    t->freel = nf;
    uint32_t *nh = realloc(t->heap, nn * sizeof *nh);
    if (!nh) return false;
    t->heap = nh;
    if (t->grow && !t->grow(t->grow_arg, nn)) return false;
    for (uint32_t i = nn; i > t->n_ents; i--) {
        memset(&t->ents[i - 1], 0, sizeof(ctab_ent));
        t->ents[i - 1].heap_pos = -1;
        t->ents[i - 1].hnext = CTAB_NIL;
        t->freel[t->n_free++] = i - 1;
    }
    t->n_ents = nn;
    return true;
}

uint32_t ctab_alloc(ctab *t)
{
    if (t->n_free == 0 && !table_grow(t)) return CTAB_NIL;
    uint32_t idx = t->freel[--t->n_free];
    ctab_ent *e = &t->ents[idx];
    memset(e, 0, sizeof *e);
    e->heap_pos = -1;
    e->hnext = CTAB_NIL;
    e->gen = ++t->gen_ctr;
    t->n_used++;
    return idx;
}

void ctab_release(ctab *t, uint32_t idx)
{
    ctab_ent *e = &t->ents[idx];
    if (e->state == E_FREE) return;
    ctab_unhash(t, idx);
    ctab_unschedule(t, idx);
    fx_mq_delivery_free(&e->dv);
    e->state = E_FREE;
    t->freel[t->n_free++] = idx;
    t->n_used--;
}

void ctab_release_all(ctab *t)
{
    for (uint32_t i = 0; i < t->n_ents; i++) ctab_release(t, i);
}

void ctab_free(ctab *t)
{
    if (t->ents) ctab_release_all(t);
    free(t->ents);
    free(t->freel);
    free(t->heap);
    free(t->buckets);
    memset(t, 0, sizeof *t);
}
