# kvtier: the two commands a newcomer needs are `make lab` and `make test`.
# Both start from a fresh Debian 12 machine (as root) and install what they need.

SHELL := /bin/bash
VENV ?= $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

# make test (scripts/test.sh): two tracks side by side, the VM scenarios (QEMU/TCG, one at a time: two TCG
# guests on two cores starve each other) beside lint, pytest, the container scenarios (podman) and resolve-spark;
# the lab starts when the checks end, beside the last VM scenario.
# Scenarios run stock Ansible, except MITOGEN_SCENARIOS (below),
# which run Mitogen's strategy as the lab does (kvtier/lab/strategy.py; KVTIER_LAB_MITOGEN=0 turns it off);
# `molecule test` by hand runs stock Ansible. Then the one serving cluster of the suite, the lab
# (`kvtier lab test`): site.yml, site.yml again with nothing changed, the canaries (the tier proof) and every other check
# that needs a serving cluster, each a named stage, then `lab down`.
CONTAINER_SCENARIOS ?= kv_store_valkey kv_store_invalid
VM_SCENARIOS ?= nvme_raid_safety roce_netplan
# Scenarios run with Mitogen's strategy: in a TCG guest it costs ~30 s once per playbook and saves ~8 s per task,
# so it pays where a playbook runs many tasks (nvme_raid_safety's converge: 37), not in roce_netplan's short ones.
MITOGEN_SCENARIOS ?= nvme_raid_safety
MOLECULE_SCENARIOS ?= $(CONTAINER_SCENARIOS) $(VM_SCENARIOS)
# Each scenario's full output is kept here; a failure also prints its failed tasks last.
LOG_DIR ?= $(CURDIR)/.cache/logs

.PHONY: all bootstrap lab test test-lab test-vm lint unit docs dashboard lock resolve-spark molecule lab-test clean help

help:
	@echo "make lab   - provision the local lab with playbooks/site.yml and show the tiers working"
	@echo "make test  - everything CI runs: the VM scenarios beside lint, unit tests, resolve-spark and the container scenarios, then beside the lab cluster's stages"
	@echo "make test-lab - the lab cluster's stages alone (kvtier lab test): site.yml, a spec change by site.yml under a client"
	@echo "               stream, health, canaries, benches, L3/L2 faults, storage reboot (and the NFS/RDMA client),"
	@echo "               the rolling L2 repair under a client stream, the persistence check, lab down"
	@echo "make test-vm - the QEMU/TCG VM scenarios: nvme_raid_safety (the storage safety gates), roce_netplan"
	@echo "make resolve-spark - resolve the GPU packages for a DGX Spark (aarch64, CPython 3.12) and check every requirement"
	@echo "make dashboard - regenerate the Grafana dashboard (roles/monitoring/files/kvtier-dashboard.json) from its code"
	@echo "make lock  - resolve requirements.in into requirements.lock with every file's sha256 (pip-tools)"
	@echo "make lint | unit | docs | molecule SCENARIO=name | molecule MOLECULE_SCENARIOS='a b'  - narrower targets"

bootstrap:
	./scripts/bootstrap.sh

lab: bootstrap
	kvtier lab up

test: bootstrap
	@CONTAINER_SCENARIOS="$(CONTAINER_SCENARIOS)" VM_SCENARIOS="$(VM_SCENARIOS)" LOG_DIR="$(LOG_DIR)" ./scripts/test.sh

test-lab: bootstrap
	$(MAKE) lab-test

lab-test:
	@set -o pipefail; mkdir -p $(LOG_DIR); kvtier lab test 2>&1 | tee $(LOG_DIR)/lab.log

test-vm: bootstrap
	$(MAKE) molecule MOLECULE_SCENARIOS="$(VM_SCENARIOS)"

lint:
	yamllint --strict .
	ansible-lint --profile production
	ruff format --check .
	ruff check .
	shellcheck $$(git ls-files -- '*.sh')

unit:
	pytest -q tests/unit

# The reference pages and docs/measurements.md, generated from the code (a unit test fails when one is stale).
docs:
	python -m kvtier.reference

# The Grafana dashboard, generated from kvtier/monitoring/dashboard.py (a unit test fails when the JSON is stale).
dashboard:
	python -m kvtier.monitoring.dashboard

# The controller's lock: requirements.in resolved with every transitive requirement and each file's sha256, by
# pip-tools in a venv of its own (pins already in the lock are kept; LOCK_ARGS="--upgrade-package NAME" moves one).
PIP_TOOLS ?= pip-tools==7.7.0
lock:
	@python3 -m venv .cache/pip-tools && .cache/pip-tools/bin/pip install --quiet "$(PIP_TOOLS)"
	.cache/pip-tools/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
	  --no-emit-find-links --output-file requirements.lock $(LOCK_ARGS) requirements.in

# The real Sparks' install route, as close as this machine gets: vllm + lmcache + nixl resolved for aarch64 /
# CPython 3.12 / glibc 2.39 from PyPI (nothing installed); fails if a declared requirement would be missing.
resolve-spark:
	@mkdir -p $(LOG_DIR)
	@set -o pipefail; kvtier wheelhouse resolve --report $(LOG_DIR)/spark-resolution.json 2>&1 | grep -v '^WARNING: Location'

molecule:
ifdef SCENARIO
	molecule test -s $(SCENARIO)
else
	@set -eo pipefail; mkdir -p $(LOG_DIR); for s in $(MOLECULE_SCENARIOS); do \
	  echo "==> molecule test -s $$s (log: $(LOG_DIR)/$$s.log)"; start=$$(date +%s); \
	  if ! ( if [[ " $(MITOGEN_SCENARIOS) " == *" $$s "* ]]; then eval "$$(python -m kvtier.lab.strategy)"; fi; \
	         molecule test -s $$s ) 2>&1 | tee $(LOG_DIR)/$$s.log; then \
	    echo "==> $$s FAILED after $$(( $$(date +%s) - start )) s; the tasks that failed:"; \
	    awk -f scripts/failed-tasks.awk $(LOG_DIR)/$$s.log; exit 1; \
	  fi; \
	  echo "==> $$s passed in $$(( $$(date +%s) - start )) s"; echo "  molecule $$s $$(( $$(date +%s) - start ))" >> $(LOG_DIR)/.times; \
	done
endif

clean:
	-molecule destroy --all
	rm -rf .cache
