#!/usr/bin/env bash
# `make test`: everything CI runs, after `make bootstrap`.
#
# Two tracks side by side, then the lab alone. The role scenarios on QEMU/TCG VMs keep one core busy for most
# of their ~14 minutes while the controller waits on the guest; the checks that need no VM (lint, pytest, the
# DGX Spark package resolution, the container scenarios) take about as long on the other core. The lab cluster
# runs last and alone: its vLLM starts and its TCG storage guest need both cores.
#
# Each track runs to its end even when the other one failed (a killed scenario would leave its VM behind), and
# both are reported. The checks track prints as it goes; the VM track's output goes to its log and is printed
# when it ends. Per-scenario logs stay in $LOG_DIR.
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

checks_track() {
  step lint "$MAKE" --no-print-directory lint &&
    step unit "$MAKE" --no-print-directory unit &&
    step resolve-spark "$MAKE" --no-print-directory resolve-spark &&
    step "container scenarios" "$MAKE" --no-print-directory molecule MOLECULE_SCENARIOS="$CONTAINER_SCENARIOS"
}

vm_track() {
  step "VM scenarios" "$MAKE" --no-print-directory molecule MOLECULE_SCENARIOS="$VM_SCENARIOS"
}

started=$(date +%s)
vm_log=$LOG_DIR/vm-scenarios.log
echo "==> VM scenarios ($VM_SCENARIOS) run beside the checks; their output: $vm_log"
vm_track > "$vm_log" 2>&1 &
vm_pid=$!

checks_ok=1
checks_track || checks_ok=0
vm_ok=1
wait "$vm_pid" || vm_ok=0

echo "==> the VM scenarios' output ($vm_log):"
cat "$vm_log"
if [ "$checks_ok" = 0 ] || [ "$vm_ok" = 0 ]; then
  [ "$checks_ok" = 0 ] && echo "==> FAILED: the checks track (lint, unit, resolve-spark or a container scenario; above)"
  [ "$vm_ok" = 0 ] && echo "==> FAILED: the VM scenarios (above)"
  exit 1
fi
echo "two tracks $(($(date +%s) - started))" >> "$TIMES"

step lab "$MAKE" --no-print-directory lab-test

echo "==> make test passed in $(($(date +%s) - started)) s:"
sed 's/^/    /; s/$/ s/' "$TIMES"
rm -f "$TIMES"
