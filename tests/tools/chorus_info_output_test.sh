#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# chorus-info's own output, as a new user reads it: --help lists every option (exit 0), an
# unknown option is named (exit 2); interface addresses carry no ":0" port and no source path
# is printed; the tuner tables are of the model a communicator of this host measures (or say
# that they are the built-in defaults, with CHORUS_TUNER=STATIC); measuring leaves the
# caller's CHORUS_TRANSPORT as it was.
#   chorus_info_output_test.sh CHORUS_INFO
set -uo pipefail
info=$1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

help=$("$info" --help) || fail "--help exited $?"
for option in --params --fabric "--tune [FILE]" "--topo FILE" "-h, --help" CHORUS_ENABLE_TRACE; do
  grep -qF -- "$option" <<< "$help" || fail "--help does not mention '$option'"
done
[ "$(wc -l <<< "$help")" -ge 10 ] || fail "--help is $(wc -l <<< "$help") line(s)"

err=$("$info" --nope 2>&1 >/dev/null)
status=$?
[ "$status" -eq 2 ] || fail "--nope exited $status"
grep -qF "unknown option '--nope'" <<< "$err" || fail "--nope: '$err'"

out=$(CHORUS_TRANSPORT=TCP "$info" 2>&1) || fail "chorus-info exited $?"
grep -E '^Network:|candidate ' <<< "$out" | grep -qE ':0( |$)' && fail "an address with port :0: $(grep -E '^Network:' <<< "$out")"
grep -qE '^Network: interface [^ ]+ [0-9a-f.:]+$' <<< "$out" || fail "no Network line: $(grep -E '^Network' <<< "$out")"
grep -qE 'src/[a-z]+/[a-z_]+\.(h|cc)' <<< "$out" && fail "a source path: $(grep -oE 'src/[a-z]+/[a-z_]+\.(h|cc)' <<< "$out" | head -1)"
# The tables: the measured model (shm between two processes), or a labelled fallback.
if grep -qF "The model measured now between two processes of this host (shm)" <<< "$out"; then
  grep -qE "^  Choices for 2 ranks \(.*measured over shm" <<< "$out" || fail "tables are not of the measured model"
else
  grep -qF "the built-in default model, which a communicator replaces" <<< "$out" || fail "tables unlabelled"
fi
# The measurement forced SHM for a moment: the parameters show the caller's value again.
grep -qE '^  CHORUS_TRANSPORT +=  ?TCP +\[env CHORUS_TRANSPORT' <<< "$out" || fail "CHORUS_TRANSPORT not restored: $(grep -E '^  CHORUS_TRANSPORT ' <<< "$out")"

static=$(CHORUS_TUNER=STATIC "$info" 2>&1)
grep -qF "The built-in default model, which communicators use (CHORUS_TUNER=STATIC)" <<< "$static" || fail "STATIC tables unlabelled"

[ "$failures" -eq 0 ] && echo "chorus-info output: all checks passed"
[ "$failures" -eq 0 ]
