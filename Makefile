# kvtier: the two commands a newcomer needs are `make lab` and `make test`.
# Both start from a fresh Debian 12 machine (as root) and install what they need.

SHELL := /bin/bash
VENV ?= $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

# Container scenarios (podman), then VM scenarios (QEMU/TCG), one at a time: on two cores, parallel TCG
# guests and vLLM starts starve each other. `make test` runs the container scenarios (spark_serving, with two
# vLLM + LMCache Sparks, takes ~30 min) and the storage safety gates (~12 min); storage_node (the storage
# node end to end with NFS/RDMA to a Spark VM and a reboot) takes ~50 min under TCG on two cores, which
# would take the suite past CI's budget, so it runs with `make test-vm`.
CONTAINER_SCENARIOS ?= kv_store_redis kv_store_valkey kv_store_invalid spark_serving
VM_SCENARIOS ?= storage_node nvme_raid_safety
MOLECULE_SCENARIOS ?= $(CONTAINER_SCENARIOS) nvme_raid_safety

.PHONY: all bootstrap lab test test-vm lint unit molecule clean help

help:
	@echo "make lab   - provision the local lab with playbooks/site.yml and show the tiers working"
	@echo "make test  - everything CI runs: lint, unit tests, container scenarios (incl. spark_serving), the storage safety VM scenario"
	@echo "make test-vm - the QEMU/TCG VM scenarios: storage_node (RAID + NFS/RDMA + reboot, ~50 min), nvme_raid_safety"
	@echo "make lint | unit | molecule SCENARIO=name | molecule MOLECULE_SCENARIOS='a b'  - narrower targets"

bootstrap:
	./scripts/bootstrap.sh

lab: bootstrap
	kvtier lab up

test: bootstrap
	$(MAKE) lint unit molecule

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
