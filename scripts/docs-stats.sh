#!/usr/bin/env bash
# Words per documentation page, and how often the pages a user reads name what only this
# repository's developers have: a git commit of this repository, a test file, `../shared`.
# Prints one row per page and the user pages' totals. A manual read like a notebook shows up
# here first.
#
#   scripts/docs-stats.sh            every page
#   scripts/docs-stats.sh --totals   the totals only
#
# User pages: README.md, docs/*.md but the internals (architecture, distributed, performance,
# performance-history, security-checks) and the generated reference, examples/*.md. A commit in a
# table row is a dated number's (one dated table a page is the rule); `prose` counts the others.
set -euo pipefail
cd "$(dirname "$0")/.."

internals=" docs/architecture.md docs/distributed.md docs/rendezvous.md docs/nccl.md docs/launcher.md docs/in-place-restarts.md docs/losing-nothing.md docs/job-shapes.md docs/performance.md docs/performance-history.md docs/security-checks.md "

# A word of 7 to 40 hex digits with a letter and a digit that git knows as a commit; with a
# second argument, only outside table rows.
commits() {
    { if [ -n "${2:-}" ]; then grep -v '^|' "$1"; else cat "$1"; fi |
        grep -oE '\b[0-9a-f]{7,40}\b' || true; } | { grep '[a-f]' || true; } |
        { grep '[0-9]' || true; } | while read -r w; do
            if git cat-file -e "$w^{commit}" 2>/dev/null; then echo "$w"; fi
        done | wc -l
}
# A test file: `…/tests/….rs`, `…/tests.rs`, `…_test(s).rs`, `….test.yaml`.
tests() {
    { grep -oE '[A-Za-z0-9_./*-]*(tests?/[A-Za-z0-9_./*-]*\.rs|tests\.rs|_tests?\.rs|\.test\.yaml)' "$1" || true; } | wc -l
}
shared() { { grep -o '\.\./shared' "$1" || true; } | wc -l; }

totals=0
[ "${1:-}" = --totals ] && totals=1
printf '%-36s %6s %5s %8s %6s %6s %s\n' page words user commits prose tests ../shared
tw=0 tc=0 tp=0 tt=0 ts=0 over=0
for page in README.md docs/*.md examples/*.md; do
    words=$(wc -w <"$page")
    user=yes
    case "$internals" in *" $page "*) user=no ;; esac
    c=$(commits "$page") p=$(commits "$page" prose) t=$(tests "$page") s=$(shared "$page")
    if [ "$user" = yes ]; then
        tw=$((tw + words)) tc=$((tc + c)) tp=$((tp + p)) tt=$((tt + t)) ts=$((ts + s))
        [ "$words" -gt 2000 ] && over=$((over + 1))
    fi
    [ $totals = 1 ] || printf '%-36s %6s %5s %8s %6s %6s %s\n' "$page" "$words" "$user" "$c" "$p" "$t" "$s"
done
printf '%-36s %6s %5s %8s %6s %6s %s\n' "user pages" "$tw" "" "$tc" "$tp" "$tt" "$ts"
echo "user pages over 2,000 words: $over"
