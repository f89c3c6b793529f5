# kvtier: the two commands a newcomer needs are `make lab` and `make test`.
# Both start from a fresh Debian 12 machine (as root) and install what they need.

SHELL := /bin/bash
VENV ?= $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

# Container scenarios (podman), then VM scenarios (QEMU/TCG), one at a time: on two cores, parallel TCG
# guests and vLLM starts starve each other. `make test` runs them all: the kv_store container scenarios,
# spark_serving (two vLLM + LMCache Sparks, hits from all four tiers), the storage safety gates and
# storage_node (RAID0 + XFS + NFS/RDMA between two VMs, reboot).
CONTAINER_SCENARIOS ?= kv_store_redis kv_store_valkey kv_store_invalid spark_serving
VM_SCENARIOS ?= nvme_raid_safety storage_node
MOLECULE_SCENARIOS ?= $(CONTAINER_SCENARIOS) $(VM_SCENARIOS)
# Each scenario's full output is kept here; a failure also prints its failed tasks last.
LOG_DIR ?= $(CURDIR)/.cache/logs

.PHONY: all bootstrap lab test test-serving test-vm lint unit molecule clean help

help:
	@echo "make lab   - provision the local lab with playbooks/site.yml and show the tiers working"
	@echo "make test  - everything CI runs: lint, unit tests, the container scenarios (kv_store, spark_serving) and the VM scenarios (storage)"
	@echo "make test-serving - spark_serving alone: two vLLM + LMCache Sparks, hits from every tier (~16 min)"
	@echo "make test-vm - the QEMU/TCG VM scenarios: nvme_raid_safety, storage_node (RAID + NFS/RDMA + reboot)"
	@echo "make lint | unit | molecule SCENARIO=name | molecule MOLECULE_SCENARIOS='a b'  - narrower targets"

bootstrap:
	./scripts/bootstrap.sh

lab: bootstrap
	kvtier lab up

test: bootstrap
	$(MAKE) lint unit molecule

test-serving: bootstrap
	$(MAKE) molecule MOLECULE_SCENARIOS=spark_serving

test-vm: bootstrap
	$(MAKE) molecule MOLECULE_SCENARIOS="$(VM_SCENARIOS)"

lint:
	yamllint --strict .
	ansible-lint --profile production

unit:
	pytest -q tests/unit

molecule:
ifdef SCENARIO
	molecule test -s $(SCENARIO)
else
	@set -eo pipefail; mkdir -p $(LOG_DIR); for s in $(MOLECULE_SCENARIOS); do \
	  echo "==> molecule test -s $$s (log: $(LOG_DIR)/$$s.log)"; start=$$(date +%s); \
	  if ! molecule test -s $$s 2>&1 | tee $(LOG_DIR)/$$s.log; then \
	    echo "==> $$s FAILED after $$(( $$(date +%s) - start )) s; the tasks that failed:"; \
	    awk -f scripts/failed-tasks.awk $(LOG_DIR)/$$s.log; exit 1; \
	  fi; \
	  echo "==> $$s passed in $$(( $$(date +%s) - start )) s"; \
	done
endif

clean:
	-molecule destroy --all
	rm -rf .cache
