# The two set-up commands of the README: `make demo` (main job) and `make test` (test suite).
# `make test-fast` is the edit loop: the tests not marked slow, without ruff, mypy or the install (run
# `make install` once first).
# Everything runs in a project-local virtual environment (.venv): it sees the machine's packages (torch, ray … already
# installed are not downloaded again) and installs what is missing into itself, never into the system Python.
VENV ?= .venv
PY ?= $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# pytest as both test targets run it: bytecode caching on (where the environment turns it off, every run compiles
# everything again), one torch thread per worker, no cache folder, no benchmark plugin
PYTEST = PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider -p no:benchmark

.PHONY: install demo test test-fast lint bench bench-quick

$(VENV)/bin/python:
	python3 -m venv --system-site-packages $(VENV)

install: $(VENV)/bin/python
	$(PY) -m pip install -q -e ".[test]"
	# mup declares torchvision but never imports it; its wheel breaks the CPU torch
	$(PY) -m pip install -q --no-deps "mup==1.0.0"
	# the example model family (a plugin: studies/catalog/nanogpt_mup.yaml, docs/plugins.md)
	$(PY) -m pip install -q --no-deps -e examples/nanogpt_mup

demo: install
	ptctl study run studies/catalog/cpu_demo.yaml

# test: the tests not marked slow as test-fast runs them, then the slow ones on two workers, a test file whole on
# one (its module's Ray cluster or server starts once): 13½–14 min where one process takes 19 (docs/LOG.md)
test: install
	$(PY) -m ruff check .
	$(PY) -m mypy  # pyproject [tool.mypy]: strict on every package
	$(MAKE) --no-print-directory test-fast
	$(PYTEST) -m slow -n 2 --dist loadfile

# test-fast: no install (it would add its pip time to every run); one pytest worker per core (pytest-xdist)
test-fast:
	$(PYTEST) -m "not slow" -n auto

bench: install  # every benchmark; each prepares its own data (a fresh clone and an empty ~/.ptctl work)
	$(PY) benchmarks/bench_pt.py --device cpu
	$(PY) benchmarks/bench_tau.py --device cpu
	$(PY) benchmarks/bench_orchestration.py
	$(PY) benchmarks/bench_orchestration.py --steps 200
	$(PY) benchmarks/bench_api.py
	$(PY) benchmarks/bench_storage.py
	$(PY) benchmarks/bench_coord_seeds.py
	$(PY) benchmarks/bench_batched.py
	$(PY) benchmarks/bench_memory.py

bench-quick: install  # the same end to end at toy sizes, minutes in all: checks they run, measures nothing
	$(PY) benchmarks/bench_pt.py --device cpu --configs small --steps 1 --repeats 1 --warmup 1 --batch 4
	$(PY) benchmarks/bench_tau.py --device cpu --width 64 --n-layers 1 --vocab 512 --seq-len 32 --batch 2 \
		--steps 1 --warmup 1 --decode-batch 1 --prompt 8 --new-tokens 8 --repeats 1
	$(PY) benchmarks/bench_orchestration.py --quick
	$(PY) benchmarks/bench_api.py --gets 100 --posts 2 --max-seconds 20
	$(PY) benchmarks/bench_storage.py --widths 32 --repeats 1
	$(PY) benchmarks/bench_batched.py --quick
