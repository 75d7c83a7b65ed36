#!/usr/bin/env bash
# Run tests against agents.ingest._fastingest built with AddressSanitizer + UndefinedBehaviorSanitizer.
#
# The compiled ingest path reads hostile bytes (record batches, JSON payloads) in place; this
# builds it with -fsanitize=address,undefined (gcc; any UB aborts) into a copy of the tracked
# files under a temporary directory, so the worktree's own build is untouched, and runs pytest
# there with the sanitizer runtimes preloaded into the venv's Python.
#
# Usage: scripts/asan_fastingest.sh [pytest args...]
#   default: the compiled-path tests (test_fastingest, test_raw_records, test_key_index,
#   test_bucket_columns, test_user_table, test_fastingest_users, test_user_changelog_c,
#   test_user_changelog_restore, test_fastingest_extra_members). FUZZ_EXAMPLES=2000 raises the
#   property tests' example counts.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py="$root/.venv/bin/python"
inc=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
suffix=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$root" && git ls-files | tar cf - -T -) | (cd "$tmp" && tar xf -)
gcc -shared -fPIC -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined \
    -fno-omit-frame-pointer -ffp-contract=off -fno-fast-math -std=c11 -I"$inc" \
    -I"$root/agents/ingest/csrc" "$root"/agents/ingest/csrc/*.c \
    -o "$tmp/agents/ingest/_fastingest$suffix"  # every source (as setup.py and the build test)
libs="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
if [ $# -eq 0 ]; then
    set -- tests/unit/agents/ingest/test_fastingest.py tests/unit/agents/ingest/test_raw_records.py \
        tests/unit/agents/ingest/test_key_index.py tests/unit/agents/ingest/test_bucket_columns.py \
        tests/unit/agents/ingest/test_user_table.py tests/unit/agents/ingest/test_fastingest_users.py \
        tests/unit/agents/ingest/test_user_changelog_c.py \
        tests/unit/agents/ingest/test_user_changelog_restore.py \
        tests/unit/agents/ingest/test_fastingest_extra_members.py -q
fi
cd "$tmp"
# detect_leaks=0: CPython keeps its interned objects at exit; replay history kept out of ~
ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD="$libs" PYTHONPATH="$tmp" \
    STREAM_DP_REPLAY_HISTORY="$tmp/.replay-history" \
    "$py" -m pytest -p no:cacheprovider "$@"
