# kvtier: the two commands a newcomer needs are `make lab` and `make test`.
# Both start from a fresh Debian 12 machine (as root) and install what they need.

SHELL := /bin/bash
VENV ?= $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

# Container scenarios (podman), then the VM scenarios (QEMU/TCG: the storage node end to end, and the
# storage safety gates). One at a time: on two cores, parallel TCG guests starve each other.
CONTAINER_SCENARIOS ?= kv_store_redis kv_store_valkey kv_store_invalid
VM_SCENARIOS ?= storage_node nvme_raid_safety
MOLECULE_SCENARIOS ?= $(CONTAINER_SCENARIOS) $(VM_SCENARIOS)

.PHONY: all bootstrap lab test test-vm lint unit molecule clean help

help:
	@echo "make lab   - provision the local lab with playbooks/site.yml and show the tiers working"
	@echo "make test  - everything CI runs: lint, unit tests, container and VM molecule scenarios"
	@echo "make test-vm - only the QEMU/TCG VM scenarios (storage node RAID + NFS over RDMA, safety gates)"
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
