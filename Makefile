# backplane: the two commands are `sudo make demo` and `sudo make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST := $(PY) -m pytest

.PHONY: setup demo test test-unit test-root clean

setup:
	bash scripts/setup.sh

demo: setup
	bash scripts/demo.sh

# Unit tests need no root; root tests build fabrics in namespaces. Tests that need sch_netem
# (the delay tier) are skipped with the reason on a kernel without it.
test: setup
	$(PYTEST) -ra tests

test-unit: setup
	$(PYTEST) -ra tests/unit

test-root: setup
	$(PYTEST) -ra tests/root

clean:
	$(VENV)/bin/backplane clean
