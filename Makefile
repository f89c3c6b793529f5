# kvtier: the two commands a newcomer needs are `make lab` and `make test`.
# Both start from a fresh Debian 12 machine (as root) and install what they need.

SHELL := /bin/bash
VENV ?= $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

# Container scenarios (podman), then VM scenarios (QEMU/TCG), one at a time: on two cores, parallel TCG
# guests and vLLM starts starve each other. `make test` runs the kv_store container scenarios, spark_serving
# (two vLLM + LMCache Sparks, hits from all four tiers, ~28 min) and the storage safety gates (~12 min).
# storage_node (~50 min under TCG) runs with `make test-vm`.
CONTAINER_SCENARIOS ?= kv_store_redis kv_store_valkey kv_store_invalid spark_serving
VM_SCENARIOS ?= storage_node nvme_raid_safety
MOLECULE_SCENARIOS ?= $(CONTAINER_SCENARIOS) nvme_raid_safety

.PHONY: all bootstrap lab test test-serving test-vm lint unit molecule clean help

help:
	@echo "make lab   - provision the local lab with playbooks/site.yml and show the tiers working"
	@echo "make test  - everything CI runs: lint, unit tests, kv_store and spark_serving container scenarios, the storage safety VM scenario"
	@echo "make test-serving - spark_serving alone: two vLLM + LMCache Sparks, hits from every tier (~28 min)"
	@echo "make test-vm - the QEMU/TCG VM scenarios: storage_node (RAID + NFS/RDMA + reboot, ~50 min), nvme_raid_safety"
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
	@set -e; for s in $(MOLECULE_SCENARIOS); do \
	  echo "==> molecule test -s $$s"; start=$$(date +%s); \
	  molecule test -s $$s; \
	  echo "==> $$s passed in $$(( $$(date +%s) - start )) s"; \
	done
endif

clean:
	-molecule destroy --all
	rm -rf .cache
