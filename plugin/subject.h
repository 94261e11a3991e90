/* subject.h -- NATS subject syntax: validation, matching and overlap (pure, thread-safe).
 * Tokens are separated by '.'; '*' matches one token, '>' (last token only) one or more.
 * A valid subject: 1..FX_SUBJECT_MAX bytes, no empty token, no whitespace or control byte;
 * wildcards only as whole tokens. */
#ifndef FX_PLUGIN_SUBJECT_H
#define FX_PLUGIN_SUBJECT_H

#include <stdbool.h>
#include <stddef.h>

#define FX_SUBJECT_MAX 1024

/* Valid subject; with allow_wildcards false, '*' and '>' tokens are rejected (a literal). */
bool fx_subject_valid(const char *s, bool allow_wildcards);
/* A single valid token (no '.', no wildcard): used for channel names, bridge names, claims. */
bool fx_subject_token_valid(const char *s);
/* Does the literal subject `lit` match `pattern` (which may hold wildcards)? */
bool fx_subject_match(const char *pattern, const char *lit);
/* The same for inputs the caller has validated already (fx_subject_valid(pattern, true) and
 * fx_subject_valid(lit, false) both true): no validation pass, for one literal matched against
 * many stored patterns. Invalid inputs give an unspecified answer (never a crash). */
bool fx_subject_match_valid(const char *pattern, const char *lit);
/* Could some literal subject match both patterns? (used for config overlap checks) */
bool fx_subject_overlap(const char *a, const char *b);

#endif
