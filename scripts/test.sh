#!/usr/bin/env bash
# `make test`: everything CI runs, after `make bootstrap`.
#
# Two tracks side by side. The role scenarios on QEMU/TCG VMs keep one core busy while the controller waits on
# the guest; beside them, on the other core, the checks that need no VM (lint, pytest, the container scenarios,
# and the DGX Spark package resolution, which mostly waits on the index, then the lab's images). The lab cluster starts when the checks
# end: its first stages (the storage guest's boot, check mode) are one TCG guest as well, beside the last VM
# scenario; its later stages (vLLM starts, the Sparks' installs) have both cores to themselves.
#
# Each track runs to its end even when the other one failed (a killed scenario would leave its VM behind), and
# all are reported; the lab runs only if the checks passed. The checks and the lab print as they go; the VM
# track's output goes to its log and is printed when it ends. Per-scenario logs stay in $LOG_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

LOG_DIR=${LOG_DIR:-$PWD/.cache/logs}
CONTAINER_SCENARIOS=${CONTAINER_SCENARIOS:-kv_store_valkey kv_store_invalid}
VM_SCENARIOS=${VM_SCENARIOS:-nvme_raid_safety roce_netplan}
MAKE=${MAKE:-make}
TIMES=$LOG_DIR/.times
mkdir -p "$LOG_DIR"
: > "$TIMES"

# step NAME COMMAND...: run it, append "NAME seconds" to the times.
step() {
  local name=$1 began
  shift
  began=$(date +%s)
  "$@" || return 1
  echo "$name $(($(date +%s) - began))" >> "$TIMES"
}

# resolve-spark mostly waits on the package index (HTTP range requests for each wheel's metadata), so it runs
# beside the rest of its track; its output is printed when the track joins it.
# The lab's images (the Spark image, the wheelhouse, the stand-in for NVIDIA's vLLM image, the VM image) are built
# on this track too, after resolve-spark: the lab then starts from them instead of building them on its own path.
checks_track() {
  local resolve_log=$LOG_DIR/resolve-spark.log images_log=$LOG_DIR/lab-images.log resolve_pid ok=1
  { step resolve-spark "$MAKE" --no-print-directory resolve-spark > "$resolve_log" 2>&1 &&
    step "lab images" kvtier lab images > "$images_log" 2>&1; } &
  resolve_pid=$!
  step lint "$MAKE" --no-print-directory lint &&
    step unit "$MAKE" --no-print-directory unit &&
    step "container scenarios" "$MAKE" --no-print-directory molecule MOLECULE_SCENARIOS="$CONTAINER_SCENARIOS" ||
    ok=0
  echo "==> resolve-spark, then the lab's images (beside lint, unit and the container scenarios; logs: $resolve_log, $images_log):"
  wait "$resolve_pid" || { ok=0; echo "==> FAILED: resolve-spark or the lab's images"; }
  cat "$resolve_log" "$images_log" 2>/dev/null
  [ "$ok" = 1 ]
}

vm_track() {
  step "VM scenarios (beside the checks, then the lab)" "$MAKE" --no-print-directory molecule MOLECULE_SCENARIOS="$VM_SCENARIOS"
}

started=$(date +%s)
vm_log=$LOG_DIR/vm-scenarios.log
echo "==> VM scenarios ($VM_SCENARIOS) run beside the checks (then beside the lab's start); their output: $vm_log"
vm_track > "$vm_log" 2>&1 &
vm_pid=$!

report_vm_track() {
  echo "==> the VM scenarios' output ($vm_log):"
  cat "$vm_log"
}

# The lab's closing table, printed last (a CI log is often read from its end): on a failure, first the end of the
# stage that failed (its last lines before `lab down`, with the reason).
report_lab() {
  local log=$LOG_DIR/lab.log
  [ -f "$log" ] || return 0
  if [ "$1" = 0 ]; then
    echo "==> the end of the lab's output before it went down (all of it: $log):"
    awk '/^==> lab down \(nothing left\)/ { exit } { print }' "$log" | tail -n 20
  fi
  echo "==> the lab's closing table:"
  sed -n '/^kvtier lab test: /,$p' "$log"
}

checks_ok=1
checks_track || checks_ok=0
if [ "$checks_ok" = 0 ]; then
  wait "$vm_pid" || true
  report_vm_track
  echo "==> FAILED: the checks track (lint, unit, resolve-spark or a container scenario; above); the lab did not run"
  exit 1
fi
echo "checks track $(($(date +%s) - started))" >> "$TIMES"

# The lab starts as soon as the checks end: its first stages (the storage guest's boot, check mode) keep one core
# busy, beside the VM track's last scenario on the other.
lab_ok=1
step lab "$MAKE" --no-print-directory lab-test || lab_ok=0
vm_ok=1
wait "$vm_pid" || vm_ok=0
report_vm_track
report_lab "$lab_ok"
if [ "$lab_ok" = 0 ] || [ "$vm_ok" = 0 ]; then
  [ "$vm_ok" = 0 ] && echo "==> FAILED: the VM scenarios (above)"
  [ "$lab_ok" = 0 ] && echo "==> FAILED: the lab (its closing table, above)"
  exit 1
fi

echo "==> make test passed in $(($(date +%s) - started)) s:"
sed 's/^/    /; s/$/ s/' "$TIMES"
rm -f "$TIMES"
