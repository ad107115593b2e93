# Assay — run `make` for the list of targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
BIN := node_modules/.bin
# The runtime is Node 24, installed by npm (the `node` package) so every machine runs the same one.
NODE := $(BIN)/node
# node_modules is (re)installed when missing or older than package-lock.json or the patches to it
# (bin/patch-deps.js, npm's postinstall): npm writes node_modules/.package-lock.json on every install,
# so a plain `npm ci` counts (no second install).
DEPS := node_modules/.package-lock.json

.PHONY: help dev test typecheck lint format migrate db/generate verify bench bundle

help: ## list the targets
	@grep -E '^[a-zA-Z/_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(DEPS): package-lock.json bin/patch-deps.js
	npm ci
	@touch $@

# The production bundle (bin/bundle.js), rebuilt when a source changed: what `assay` runs.
bundle: $(DEPS) ## build the bundle bin/assay.js runs (npm ci builds it too; skipped when current)
	@$(NODE) bin/build.js

dev: $(DEPS) bundle ## API + worker with the embedded database and readable logs; prints a dev token (Ctrl-C stops all)
	@LOG_FORMAT=$${LOG_FORMAT:-pretty} exec $(NODE) bin/assay.js all --dev-token

test: $(DEPS) typecheck lint bundle ## typecheck, lint and every test file against a real PostgreSQL
	@files=$$(find test -name '*.test.ts' | sort); \
	if [ -z "$$files" ]; then echo "no test files found" >&2; exit 1; fi; \
	$(NODE) --import tsx test/run.ts $$files

typecheck: $(DEPS) ## tsc, strict
	$(BIN)/tsc --noEmit

lint: $(DEPS) ## biome: lint and formatting check
	$(BIN)/biome check .

format: $(DEPS) ## biome: apply formatting and safe fixes
	$(BIN)/biome check --write .

migrate: $(DEPS) ## apply migrations to DATABASE_URL (or the embedded database)
	$(NODE) bin/assay.js migrate

db/generate: $(DEPS) ## generate a migration from src/db/schema.ts (drizzle-kit)
	$(BIN)/drizzle-kit generate

verify: $(DEPS) ## fail if db/generate would change migrations/
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; cp -r migrations "$$tmp/"; \
	(cd "$$tmp" && $(CURDIR)/$(BIN)/drizzle-kit generate --dialect postgresql \
	  --schema $(CURDIR)/src/db/schema.ts --out ./migrations >/dev/null) || exit 1; \
	if diff -r migrations "$$tmp/migrations"; then echo "migrations/ matches src/db/schema.ts"; \
	else echo "migrations/ is out of date: run make db/generate and commit the result" >&2; exit 1; fi

bench: $(DEPS) bundle ## benchmarks of the bundle `assay` runs (rebuilt when the sources changed), one JSON line per workload
	@for f in $$(find bench -name '*.ts' -not -path '*/lib/*' | sort); do $(NODE) --import tsx $$f || exit 1; done
