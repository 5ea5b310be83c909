# reverie: `make train` and `make test` are all you need; both build the virtual environment first.
#
#   make train ARGS="env=pendulum size=s"    # Hydra overrides go in ARGS
#   make test  PYTEST_ARGS="-x tests/test_logging.py"   # in 2 processes (pytest-xdist); PYTEST_WORKERS=0: one
#   make test-slow                           # learning checks marked @pytest.mark.slow
#   make bench ARGS="..."                    # speed/memory scripts in bench/ (print numbers)
#   make sysdeps                             # Debian packages: headless OpenGL for DMC pixels, Chromium for the
#                                            # `reverie play` browser test (run by train/test)
#
# The venv is (re)installed only when pyproject.toml is newer than the stamp file. The editable install uses
# setuptools' compat mode (a path in a .pth file), so `import reverie` finds the package even from a folder that
# holds the checkout as reverie/ (with the default finder, that folder would shadow it as a namespace package).
# torch is installed FIRST with an exact pin, so the `-e .` install finds it satisfied and never pulls
# another (multi-GB CUDA) build.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (one per core of the 2-core machines the suite is sized for; 0: one process)
PYTEST_WORKERS ?= 2
# Debian packages for headless EGL rendering (MuJoCo/dm_control pixels). libosmesa6 is the software fallback
# (MUJOCO_GL=osmesa) if EGL cannot create a context: `make sysdeps GL_PACKAGES=libosmesa6`.
GL_PACKAGES ?= libegl1 libgl1 libegl-mesa0 libgl1-mesa-dri
# Headless browser for the `reverie play` page test (tests/test_play_browser.py drives /usr/bin/chromium through
# Playwright; it fails in CI without it).
BROWSER_PACKAGES ?= chromium

BIN := $(VENV)/bin
STAMP := $(VENV)/.reverie-installed

.PHONY: venv sysdeps train test test-slow bench clean distclean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install '$(TORCH)' $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -e '.[test]' --config-settings editable_mode=compat
	touch $@
	@echo "[reverie] set up in $(VENV). To put \`reverie\` on PATH for the README's examples, run once per shell:"
	@echo "[reverie]   source $(VENV)/bin/activate"

# Installs the missing GL_PACKAGES and BROWSER_PACKAGES with apt-get when run as root on Debian/Ubuntu; otherwise
# (not root, no apt, or the install fails) it prints what to install and carries on: DMC pixel tests and the
# browser test then skip with that reason (outside CI).
sysdeps:
	@command -v dpkg >/dev/null 2>&1 || { echo "[reverie] no dpkg: make sure headless OpenGL (EGL or OSMesa) is installed for DMC pixels and chromium for the play test"; exit 0; }; \
	missing=""; for p in $(GL_PACKAGES) $(BROWSER_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	[ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "[reverie] system packages missing:$$missing. Not root (or no apt-get), so not installing them;"; \
	  echo "[reverie] run 'sudo apt-get install -y$$missing' for DMC pixels and the play browser test (skipped until then)."; exit 0; fi; \
	echo "[reverie] installing system packages:$$missing"; \
	{ DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; } || \
	  echo "[reverie] WARNING: apt-get could not install$$missing; DMC pixel tests and the play browser test will be skipped"

# REVERIE_MAKE_TRAIN: an interrupted run prints `make train ARGS="--resume <run_dir>"` as its resume command.
# Exit status 130 (Ctrl-C or SIGTERM, handled: final checkpoint written, resume line printed) counts as success, so
# make does not end a clean interrupt with "Error 130"; any other failure stays a failure.
train: venv sysdeps
	REVERIE_MAKE_TRAIN=1 $(BIN)/reverie train $(ARGS) || { status=$$?; [ $$status -eq 130 ] || exit $$status; }

test: venv sysdeps
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-slow: venv sysdeps
	$(BIN)/pytest -q -m slow $(PYTEST_ARGS)

bench: venv
	$(BIN)/python bench/run.py $(ARGS)

# Build and test leftovers only: runs/ (your experiments) and the venv are kept. `make distclean` drops the venv.
clean:
	rm -rf build dist .pytest_cache *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
