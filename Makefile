# Each target sets up its own environment, so a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The CPU build of PyTorch; a loose `torch` would pull a multi-GB CUDA build.
TORCH  := torch==2.13.0

.PHONY: demo install test lint style types shared-tests bench gpu-check clean

# Byte-compiled after the install, on every core (pip compiles one module at a time: about half
# of its 100 s here). The compiled files are needed: where PYTHONDONTWRITEBYTECODE is set (as on
# this project's machines) Python would otherwise compile torch anew in every process it starts.
# A few files meant for newer Pythons do not compile, as under pip: not an install failure.
# Of transformers' ~300 model families only those the tests and the demo import are compiled
# (the rest took 8 of its 10 s); another one is compiled when first imported, as without this step.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile $(TORCH)
	$(BIN)/pip install -q --no-compile -c constraints.txt -e '.[torch,dev,transformers,lightning,pytorch-lightning]'
	$(BIN)/python -m compileall -q -j 0 -x '/transformers/models/(?!__init__|auto/|encoder_decoder/|gpt2/)' \
	  $(VENV)/lib > /dev/null || true
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tuimon demo

# `tuimon` on the PATH of every new shell: a link to this checkout's environment (the folder is
# created if needed; BINDIR=... puts it elsewhere). Says how to add the folder when the PATH lacks it.
BINDIR ?= $(HOME)/.local/bin
install: $(STAMP)
	mkdir -p "$(BINDIR)"
	ln -sfn "$(abspath $(BIN))/tuimon" "$(BINDIR)/tuimon"
	@echo "tuimon -> $(abspath $(BIN))/tuimon, linked in $(BINDIR)"
	@case ":$$PATH:" in *":$(BINDIR):"*) ;; \
	  *) echo "$(BINDIR) is not on your PATH: add  export PATH=\"$(BINDIR):\$$PATH\"  to ~/.bashrc (or ~/.profile)";; esac

# Static checks (about a minute): style and the import boundaries (seconds), the types (mypy, the
# rest).
lint: style types

style: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

types: $(STAMP)
	$(BIN)/mypy

# Style first, then the types beside the tests that may share the machine (mypy takes one core for
# about a minute, while those tests mostly wait on sockets and subprocesses), then alone the tests
# that time this machine (the `solo` mark, tests/conftest.py).
# Each phase lists its slowest tests, so that a CI log says where the time went.
test: style
	$(MAKE) --no-print-directory -j 2 types shared-tests
	$(BIN)/python -m pytest -m solo --durations=15

# Two processes, one torch thread each so that they do not oversubscribe the two cores (three took
# 30-50 s off but made a relay test miss its 10 s deadline once in five fresh-clone runs). The
# project's modules are byte-compiled first: where PYTHONDONTWRITEBYTECODE is set every Python
# process the tests start would compile them again from source (~0.8 s each here).
shared-tests: $(STAMP)
	$(BIN)/python -m compileall -q publisher tuimon tests benchmarks
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile -m "not solo" --durations=15

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/small_gpt.py
	$(BIN)/python benchmarks/ingest.py
	$(BIN)/python benchmarks/ingest.py --rates 10000,50000 --traffic hostile
	$(BIN)/python benchmarks/flood.py

# On a GPU machine (under 8 min): the GPU-only tests, the NVML reader on every device, a Monitor that
# never synchronises the device, the overhead on CUDA. Exit status 3 where there is no GPU.
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
