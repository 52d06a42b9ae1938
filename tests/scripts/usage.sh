#!/usr/bin/env bash
# Every script a user runs answers --help with its usage (the comment at its top, exit 0) and
# refuses an option it does not know with exit 2 and a message naming it, before it installs,
# builds or starts anything (ctest's timeout would catch a script that started a build).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
scripts=(scripts/demo scripts/fuzz scripts/lint scripts/package scripts/pg scripts/setup
  scripts/test bench/run bench/peers/run bench/latency_path bench/cpu_split bench/enqueue_cost
  bench/producer_overload bench/producers_split bench/claim_gather bench/build_ab bench/history_index
  bench/enqueue_instructions)
failed=0
fail() { echo "FAIL $1: $2"; failed=1; }
for s in "${scripts[@]}"; do
  [ -x "$root/$s" ] || { fail "$s" "missing or not executable"; continue; }
  # The usage's first line is the first line of the script's header comment.
  first=$(sed -n '2s/^# \{0,1\}//p' "$root/$s")
  out=$("$root/$s" --help 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] || fail "$s" "--help exited $rc: $out"
  [ "$(printf '%s\n' "$out" | head -n 1)" = "$first" ] || fail "$s" "--help printed: $out"
  out=$("$root/$s" --no-such-option 2>&1 >/dev/null)
  rc=$?
  [ "$rc" -eq 2 ] || fail "$s" "--no-such-option exited $rc: $out"
  case "$out" in
    *"--no-such-option"*) ;;
    *) fail "$s" "--no-such-option was not named: $out" ;;
  esac
done
# An unknown option after a valid one is refused too (scripts/setup once read only its first
# argument, and 'scripts/setup --package --bogus' installed packages).
valid_first=("scripts/demo --short" "scripts/fuzz 5" "scripts/package --install-check"
  "scripts/setup --package" "scripts/test --asan" "bench/run --quick" "bench/run --peers"
  "bench/peers/run --rounds 1"
  "bench/latency_path --samples 4000" "bench/cpu_split --jobs 1000" "bench/enqueue_cost --parse"
  "bench/producer_overload --rounds 1" "bench/producers_split --rounds 1"
  "bench/claim_gather --gathers 0,2" "bench/build_ab --rounds 1" "bench/history_index --rounds 1"
  "bench/enqueue_instructions --calls 10")
for entry in "${valid_first[@]}"; do
  read -r s first_arg <<<"$entry"
  out=$("$root/$s" $first_arg --no-such-option 2>&1 >/dev/null)
  rc=$?
  [ "$rc" -eq 2 ] || fail "$s" "$first_arg --no-such-option exited $rc: $out"
  case "$out" in
    *"--no-such-option"*) ;;
    *) fail "$s" "$first_arg --no-such-option: the option was not named: $out" ;;
  esac
done
# bench/run --peers hands every flag to bench/peers/run: its --help is that script's usage (a
# bench/run that kept the flags itself would refuse '--peers --help' or print its own).
peers_first=$(sed -n '2s/^# \{0,1\}//p' "$root/bench/peers/run")
out=$("$root/bench/run" --peers --help 2>&1)
rc=$?
[ "$rc" -eq 0 ] && [ "$(printf '%s\n' "$out" | head -n 1)" = "$peers_first" ] ||
  fail "bench/run" "--peers --help exited $rc and did not print bench/peers/run's usage: $out"
[ "$failed" -eq 0 ] && echo "every script answers --help and refuses an unknown option"
exit "$failed"
