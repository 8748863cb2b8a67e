# backplane: the two commands are `sudo make demo` and `sudo make test`.
# Inside the delay tier's VM the venv is /opt/backplane/venv (BACKPLANE_VENV).
VENV   ?= $(or $(BACKPLANE_VENV),.venv)
PY     := $(VENV)/bin/python
PYTEST := $(PY) -m pytest
HAS_NETEM := $(PY) -c 'import sys; from emulator.fabric.capabilities import has_netem; sys.exit(0 if has_netem() else 1)'

.PHONY: setup vm-setup demo test test-host test-unit test-root test-delay test-rxe vm-test vm-build vagrant-smoke clean

# Bytecode for the project's modules too: with PYTHONDONTWRITEBYTECODE set (some machines, the VM)
# every process would compile them again on import (the VM's boot compiles them for its Python).
setup:
	bash scripts/setup.sh
	$(PY) -m compileall -q -j 0 emulator bench

vm-setup: setup
	bash scripts/vm/setup-host.sh

demo: setup
	bash scripts/demo.sh

# Every tier. Tests that need sch_netem (the delay tier) run here on a kernel that has it; on one
# without it they are skipped here, with the reason, and run in the VM afterwards.
test: test-host
	@if $(HAS_NETEM); then echo "[test] this kernel has sch_netem: the delay tier ran above"; \
	else echo "[test] this kernel has no sch_netem: the delay tier runs in the VM"; \
	     $(MAKE) --no-print-directory vm-test; fi

test-host: setup
	$(PYTEST) -ra tests/unit tests/datapath tests/root

test-unit: setup
	$(PYTEST) -ra tests/unit

test-root: setup
	$(PYTEST) -ra tests/root

# The delay and rxe tiers in a VM with a stock kernel (QEMU; KVM where it boots, else software
# emulation), in one boot; -k runs both even when the first fails.
vm-test: vm-setup
	$(VENV)/bin/backplane vm build
	$(PYTEST) -ra tests/vm
	$(VENV)/bin/backplane vm run -- make -k test-delay test-rxe

vm-build: vm-setup
	$(VENV)/bin/backplane vm build

# Runs where netem exists (in the VM: provisioned already, its root read-only, so no set-up).
test-delay: $(if $(BACKPLANE_IN_VM),,setup)
	$(PYTEST) -ra -s -m netem tests/root

# The soft-NIC against the kernel's RoCEv2 (rdma_rxe): runs where the kernel has it (the VM).
test-rxe: $(if $(BACKPLANE_IN_VM),,setup)
	$(PYTEST) -ra tests/rxe

# The Vagrantfile exercised for real: a local box from the guest root, libvirt with plain QEMU.
vagrant-smoke: vm-setup
	bash scripts/vagrant/smoke.sh

clean:
	$(VENV)/bin/backplane clean
