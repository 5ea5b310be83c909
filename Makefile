# reverie: `make train` and `make test` are all you need; both build the virtual environment first.
#
#   make train ARGS="env=pendulum size=s"    # Hydra overrides go in ARGS
#   make test  PYTEST_ARGS="-x tests/test_logging.py"
#   make test-slow                           # learning checks marked @pytest.mark.slow
#   make bench ARGS="..."                    # speed/memory scripts in bench/ (print numbers)
#
# The venv is (re)installed only when pyproject.toml is newer than the stamp file.
# torch is installed FIRST with an exact pin, so the `-e .` install finds it satisfied and never pulls
# another (multi-GB CUDA) build.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
ARGS ?=
PYTEST_ARGS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.reverie-installed

.PHONY: venv train test test-slow bench clean distclean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install '$(TORCH)' $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -e '.[test]'
	touch $@

train: venv
	$(BIN)/reverie train $(ARGS)

test: venv
	$(BIN)/pytest -q $(PYTEST_ARGS)

test-slow: venv
	$(BIN)/pytest -q -m slow $(PYTEST_ARGS)

bench: venv
	@test -f bench/run.py || { echo "bench/run.py does not exist yet (see DESIGN.md section 6)."; exit 1; }
	$(BIN)/python bench/run.py $(ARGS)

# Build and test leftovers only: runs/ (your experiments) and the venv are kept. `make distclean` drops the venv.
clean:
	rm -rf build dist .pytest_cache *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
