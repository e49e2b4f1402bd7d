#!/usr/bin/env bash
# Runs every fuzz target of the module for $FUZZTIME each (default 10s).
set -euo pipefail
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10s}
cd "$(dirname "$0")/.."
status=0
for pkg in $($GO list ./...); do
  for target in $($GO test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    echo "== $pkg $target ($FUZZTIME)"
    $GO test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$pkg" || status=1
  done
done
exit $status
