# kvtier: the two commands a newcomer needs are `make lab` and `make test`.
# Both start from a fresh Debian 12 machine (as root) and install what they need.

SHELL := /bin/bash
VENV ?= $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

# Container scenarios (podman). The VM scenarios (QEMU/TCG: storage block layer, NFS over RDMA) run with
# `make test-vm`; they join `make test` once they have passed end to end on a clean clone (issues 4 and 5).
CONTAINER_SCENARIOS ?= kv_store_redis kv_store_valkey kv_store_invalid
VM_SCENARIOS ?= nvme_raid nvme_raid_safety nfs_rdma
MOLECULE_SCENARIOS ?= $(CONTAINER_SCENARIOS)

.PHONY: all bootstrap lab test test-vm lint unit molecule clean help

help:
	@echo "make lab   - provision the local lab with playbooks/site.yml and show the tiers working"
	@echo "make test  - everything CI runs: lint, unit tests, container molecule scenarios"
	@echo "make test-vm - the QEMU/TCG VM scenarios (storage RAID, NFS over RDMA); slow"
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
