#!/usr/bin/env bash
# scripts/mutate.sh: the mutation check, run by `make mutate` (not in CI).
#
# Plants each known bug of a mutant list (default scripts/mutants.txt, then scripts/mutants/*.txt) in
# turn, runs the tests of the packages it touches, restores the file, and
# prints how many the suite catches, per package. A survivor is a bug the
# suite lets through: write the test that catches it, or, when the change is
# equivalent, say so with survives:. `make mutate` passes make test's
# environment (the tools' PATH and the TRACEGRPO_REQUIRE_* variables), so
# the tests run as make test runs them.
#
# The list: one mutant per block of "key: value" lines; # starts a comment.
#
#   mutant: trainer/weights-hash-drops-tail      a unique name: package/what
#   file: trainer/ranks.go                       the file, from the repo root
#   why: the ranks' weights hash skips the last partial 64 KiB chunk
#   from:                                        the exact text to replace:
#   |	h.Write(buf)                              "|" lines, the "|" removed,
#   |	return h.Sum(nil), nil                    the rest kept byte for byte
#   to:                                          (tabs too), joined by "\n";
#   |	return h.Sum(nil), nil                    or text after "from: "
#   packages: ./kernels/cuda     optional: the packages to test instead of the
#                                file's own and every package whose tests
#                                build on it (own package first)
#   skip: ^TestPTXFresh$         optional: go test -skip, for a test that fails
#                                on any change to the file, not on the bug
#   survives: why                optional: the change is equivalent; reported,
#                                not counted as a failure
#
# The from: text must occur exactly once in the file, or the whole check
# fails before any test runs (and TestListApplies fails in CI): the list
# cannot rot silently. Each package's tests run with -count=1 -failfast,
# the mutant's own package first, until one fails (caught) or all pass
# (survived). A mutant that does not build is an error of the list.
#
# Ctrl-C or SIGTERM kill the tests in progress and restore the file; the
# original waits in .mutate/backup/ while a mutant is planted, and a run
# that was killed outright is repaired by the next one.
#
# Flags: -run REGEXP (mutants by name), -check (only check that every
# mutant applies), -v (the catching test's output), -timeout (per package,
# default 10m), -list FILE. Exit status: 0 when every mutant is caught (or
# survives as listed), 1 when one survived or does not build, 2 for a bad
# list, 130 when interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .mutate/bin
go build -o .mutate/bin/mutate ./internal/mutate/cmd
exec .mutate/bin/mutate "$@"
