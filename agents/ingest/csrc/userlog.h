/* The per-person changelog written by the compact table itself (agents/ingest/csrc/userlog.c):
 * byte for byte what agents.ingest.user_records and agents.ingest.user_digest compute. */
#ifndef STREAM_DP_USERLOG_H
#define STREAM_DP_USERLOG_H

#include "usertable.h"

/* UserTable.changelog(extra, mac_key, context_hash, digest_key) and
 * UserTable.digest_sum(digest_key): see their docstrings in usertable.c. */
PyObject *ul_changelog(UserTable *self, PyObject *args);
PyObject *ul_digest_sum(UserTable *self, PyObject *arg);

#endif
