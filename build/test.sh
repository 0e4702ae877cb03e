#!/usr/bin/env bash
# The whole suite: compile dist/trellis (the e2e tests run the real binary), run every bun:test file
# (unit, type checks, and e2e against a real kube-apiserver and real systemd nodes), and end with the
# line `N passed, N failed` computed from bun's own summary.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT

if ! bun run build; then
  echo "0 passed, 1 failed"
  exit 1
fi
bun test --timeout 300000 "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(sed -n 's/^ *\([0-9][0-9]*\) pass$/\1/p' "$log" | tail -1)
failed=$(sed -n 's/^ *\([0-9][0-9]*\) fail$/\1/p' "$log" | tail -1)
if [[ -z $passed && -z $failed ]]; then
  # bun printed no summary (crashed, or found no tests): that is a failure, not a pass.
  echo "0 passed, 1 failed"
  exit 1
fi
# CI shows only the head and the tail of this output: repeat what bun printed just before each failed
# test (its error, and the test's own account of what it saw) right above the summary line.
if [[ ${failed:-0} != 0 ]]; then
  echo "---- the output before each failed test (at most 60 lines each, 5 tests) ----"
  awk '/^[0-9]+ tests? failed:/ { exit } /^\(fail\) / && shown < 5 { shown++; start = NR > 60 ? NR - 60 : 1; for (i = start; i < NR; i++) if (i in buf) print buf[i]; print; print "----" } { buf[NR] = $0; delete buf[NR - 61] }' "$log"
fi
echo "${passed:-0} passed, ${failed:-0} failed"
exit "$rc"
