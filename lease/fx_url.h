/* fx_url.h -- the one URL parser of the project (libcurl's curl_url API underneath).
 *
 * Parses "scheme://[user[:password]@]host[:port][/path][?query]" and "unix:/path[?query]" (also
 * "unix:///path") into bounded, NUL-terminated parts. Every user of a URL goes through it: the
 * etcd endpoints (lease/etcd.c), the Redis KV url (lease/kv_redis.c), the leafnode url
 * (plugin/leaf.c), the config checks (plugin/config.c) and the monitoring url (plugin/interest.c).
 *
 * Rules: at most FX_URL_MAX bytes, no whitespace or control byte, one URL (no comma), a host
 * (IPv6 in brackets, stored without them), a port 1..65535 when present, no fragment. The
 * userinfo ends at the LAST '@' of the authority (an '@' before it belongs to the user or
 * password, as if written %40); user and password are percent-decoded and a bad %-escape or a
 * decoded NUL is refused. The path is percent-decoded ("" when absent or just "/"); the query is
 * kept as written. Userinfo, a path and a query are refused unless the flags allow them.
 *
 * Errors: a status and a short reason in err that never quotes the URL or any part of it (a URL
 * may carry a password). Thread-safe (curl_url handles are per call).
 *
 * The same rule serves the other users of a URL's userinfo: fx_url_redact (every URL that goes
 * into a log line or an error message, in the bridge and in fluxonctl), fx_url_split_userinfo
 * (clients that take the credentials apart from the URL, cnats: the decoded user and password
 * go to natsOptions_SetUserInfo, the URL without them to SetURL: nats.url, fluxonctl --server)
 * and fx_url_normalize (clients that end the userinfo at its first '@': libcurl for
 * nats.monitor_url). The leaf connection and the Redis plane use fx_url_parse's decoded parts.
 */
#ifndef FX_URL_H
#define FX_URL_H

#include <stdbool.h>
#include <stddef.h>

#define FX_URL_MAX 4096
#define FX_URL_SCHEME_CAP 16
#define FX_URL_USER_CAP 256
#define FX_URL_HOST_CAP 256
#define FX_URL_PATH_CAP 1024
#define FX_URL_QUERY_CAP 256

typedef struct fx_url {
    char scheme[FX_URL_SCHEME_CAP]; /* lower case */
    bool has_user;                  /* "user@" or "user:password@" (the user may be empty) */
    bool has_password;
    char user[FX_URL_USER_CAP];     /* percent-decoded */
    char password[FX_URL_USER_CAP]; /* percent-decoded */
    char host[FX_URL_HOST_CAP];     /* IPv6 without brackets; for unix: "" */
    int port;                       /* 0 when the URL has none */
    char path[FX_URL_PATH_CAP];     /* percent-decoded; "" when none or "/" */
    char query[FX_URL_QUERY_CAP];   /* without '?'; "" when none */
    bool has_query;
} fx_url;

enum {
    FX_URL_USERINFO = 1u << 0, /* accept user[:password]@ */
    FX_URL_PATH = 1u << 1,     /* accept a path other than "/" */
    FX_URL_QUERY = 1u << 2,    /* accept ?query */
};

typedef enum fx_url_status {
    FX_URL_OK = 0,
    FX_URL_EMISSING,  /* NULL or empty */
    FX_URL_ELONG,     /* longer than FX_URL_MAX */
    FX_URL_ESPACE,    /* whitespace or a control byte */
    FX_URL_ELIST,     /* a comma: several URLs */
    FX_URL_ESCHEME,   /* no "scheme://" (or "unix:") */
    FX_URL_EHOST,     /* no host, bad host, bad IPv6 literal, host too long */
    FX_URL_EPORT,     /* not 1..65535 */
    FX_URL_EUSER,     /* user: bad %-escape, too long, or userinfo not allowed */
    FX_URL_EPASSWORD, /* password: bad %-escape or too long */
    FX_URL_EPATH,     /* a path not allowed, bad or too long (unix: not absolute) */
    FX_URL_EQUERY,    /* a query not allowed or too long */
    FX_URL_EFRAGMENT, /* "#..." */
    FX_URL_EMALFORMED,/* anything else curl refuses */
    FX_URL_ENOMEM,
} fx_url_status;

/* Parse url into *out (zeroed first; wiped on failure). err (may be NULL) gets the reason. */
fx_url_status fx_url_parse(const char *url, unsigned flags, fx_url *out, char *err, size_t errlen);
/* Zero the parts that may hold secrets (user, password, whole struct). */
void fx_url_wipe(fx_url *u);
/* Copy url into out (cap bytes, always NUL-terminated, cut to fit) with each userinfo replaced
 * by three stars: nats://u:p@w@h:4222 is shown as nats://(3 stars)@h:4222. The userinfo of an
 * element ends at its LAST '@' (also one after a slash, '?' or '#': a password holding those
 * unescaped is no valid URL, but is still never shown). One URL or a comma-separated list; an
 * element that does not start with "scheme://" belongs to the one before it (a ',' inside a
 * password). NULL -> "-". Never fails; no allocation. */
void fx_url_redact(const char *url, char *out, size_t cap);
/* For a client that takes credentials apart from the URL: url is one URL or a comma-separated
 * list (as natsOptions_SetURL takes it; an element without "scheme://" is read as nats://).
 * Each element is parsed as fx_url_parse(FX_URL_USERINFO | FX_URL_PATH | FX_URL_QUERY) does;
 * out receives the list with every userinfo removed (the rest as written), cred (has_user,
 * has_password, user, password; the rest zeroed) the percent-decoded credentials of the first
 * element that has any. On failure out and cred are wiped and err says why (never quoting). */
fx_url_status fx_url_split_userinfo(const char *url, char *out, size_t cap, fx_url *cred,
                                    char *err, size_t errlen);
/* For a client that reads the userinfo up to its FIRST '@' (libcurl, cnats): url with each '@'
 * of the userinfo but the last written %40 (the rest as written) into out. FX_URL_ELONG when it
 * does not fit in cap. Does not validate (fx_url_parse does). */
fx_url_status fx_url_normalize(const char *url, char *out, size_t cap);
/* true when u's scheme is one of the NULL-terminated list (lower case names, no "://"). */
bool fx_url_scheme_is(const fx_url *u, const char *const *schemes);

#endif
