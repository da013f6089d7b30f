# kvdir: build, test and benchmark entry points. `make help` lists them.

GO        ?= go
FUZZTIME  ?= 15s
BENCH_OUT ?= bench/results/index.json

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Compile every package and command
	$(GO) build ./...

.PHONY: vet
vet: ## go vet
	$(GO) vet ./...

.PHONY: fmt-check
fmt-check: ## Fail if any Go file is not gofmt'd
	@out=$$(gofmt -l .); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: test
test: vet fmt-check ## Vet, format check and all tests with the race detector
	$(GO) test -race -count=1 ./...

.PHONY: bench-index
bench-index: ## Index and hashing figures at full scale -> bench/results/index.json
	@mkdir -p $(dir $(BENCH_OUT))
	$(GO) run ./bench/cmd/indexbench -out $(BENCH_OUT)

.PHONY: bench-go
bench-go: ## Go micro-benchmarks of the index and hashing (for benchstat)
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./internal/radix ./internal/blockhash | tee bench/results/go-bench.txt

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 15s)
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done
