# The two set-up commands of the README: `make demo` (main job) and `make test` (test suite).
PY ?= python3

.PHONY: install demo test lint bench

install:
	$(PY) -m pip install -q -e ".[test]"
	# mup declares torchvision but never imports it; its wheel breaks the CPU torch
	$(PY) -m pip install -q --no-deps "mup==1.0.0"

demo: install
	ptctl study run studies/catalog/cpu_demo.yaml

test: install
	$(PY) -m ruff check .
	$(PY) -m pytest -q -p no:cacheprovider

bench: install
	$(PY) benchmarks/bench_pt.py --device cpu
	$(PY) benchmarks/bench_tau.py --device cpu
