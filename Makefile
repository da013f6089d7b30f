# kvdir: build, test and benchmark entry points. `make help` lists them.

GO        ?= go
FUZZTIME  ?= 15s
BENCH_OUT ?= bench/results/index.json

# Code generators, pinned; `make proto` installs them into ./bin.
BUF_VERSION                ?= v1.75.0
PROTOC_GEN_GO_VERSION      ?= v1.36.12
PROTOC_GEN_GO_GRPC_VERSION ?= v1.6.2
# The linter, pinned (v0.8.2 is staticcheck 2026.2.2); `make verify` installs it into ./bin.
STATICCHECK_VERSION        ?= v0.8.2
BIN := $(CURDIR)/bin

include deploy/Makefile.inc

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-17s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Compile every package and command
	$(GO) build ./...

.PHONY: bin
bin: ## Build the binaries the docs run into ./bin: directory, agent, router, enginesim, kvdirctl, kvbench
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/directory ./cmd/agent ./cmd/router ./cmd/enginesim ./cmd/kvdirctl ./bench/cmd/kvbench

.PHONY: dev
dev: bin ## A local fleet until Ctrl-C: 3 directory nodes, 2 enginesims with agents, a router; prints their addresses
	$(BIN)/kvbench dev $(DEV_ARGS)

.PHONY: vet
vet: ## go vet
	$(GO) vet ./...

.PHONY: fmt-check
fmt-check: ## Fail if any Go file is not gofmt'd
	@out=$$(gofmt -l .); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: verify
verify: tidy-check fmt-check vet staticcheck proto-check standalone-check ## Static checks CI runs: go.mod tidy, gofmt, vet, staticcheck, generated protobuf current, no outside paths

.PHONY: tidy-check
tidy-check: ## Fail if go.mod or go.sum is not tidy (go mod tidy -diff prints the fix)
	$(GO) mod tidy -diff

.PHONY: standalone-check
standalone-check: ## Fail if a tracked file names a path outside the repository or a tracker number instead of the requirement
	@# The patterns spell the paths with character classes, so this line does not match itself.
	@if git grep -nIiE '[.][.]/share[d]/|/wor[k]/|\bissue[s]? #?[0-9]+\b' -- .; then \
	  echo "the lines above refer to a path outside the repository or to a tracker number; say the requirement itself" >&2; exit 1; \
	fi

.PHONY: staticcheck
staticcheck: $(BIN)/staticcheck-$(STATICCHECK_VERSION) ## staticcheck (pinned) on every package
	$(BIN)/staticcheck ./...

.PHONY: proto-check
proto-check: tools ## Fail if the generated code in proto/ is not what buf generate writes from the .proto files (run `make proto`)
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	PATH="$(BIN):$$PATH" buf lint || exit 1; \
	PATH="$(BIN):$$PATH" buf generate -o "$$tmp" || exit 1; \
	stale=0; \
	for f in $$( { (cd proto && find . -name '*.pb.go'); (cd "$$tmp/proto" && find . -name '*.pb.go'); } | sort -u); do \
	  if ! cmp -s "proto/$$f" "$$tmp/proto/$$f"; then echo "stale or missing: proto/$${f#./}" >&2; stale=1; fi; \
	done; \
	if [ $$stale = 1 ]; then echo "proto/: generated code is not current; run make proto and commit it" >&2; exit 1; fi; \
	echo "proto/: generated code is current"

# The test tiers. `make test` runs every tier CI runs, in order; each can
# also be run alone.
#   unit   go test -race -short: no child process, no binary, nothing
#          beyond Go (a test that needs more calls testkit.SkipIfShort)
#   e2e    the tests -short skips, in full, in every package that has one:
#          e2e/ (real processes on loopback, the live dashboard check
#          among them), the libzmq interop test (python3), the replay
#          comparison (haproxy), long randomised runs
#   apiserver  deploy/k8s and the Helm chart server-side applied to a real
#          kube-apiserver over etcd, both built from pinned modules
#          (deploy/Makefile.inc; its own tier, so deploy/kubeapi is not in
#          E2E_PKGS)
#   chaos  faults on the compose cluster under load (Docker; deploy/Makefile.inc;
#          its own tier, so deploy/chaos is not in E2E_PKGS)
E2E_PKGS = $(shell grep -rlE --include='*_test.go' 'testing[.]Short|testkit[.]SkipIfShort|testkit[.]Binar|testkit[.]StartProc|fleet[.]New|clitest[.]Build' . \
	| grep -v -e '^\./internal/testkit/' -e '^\./deploy/chaos/' -e '^\./deploy/kubeapi/' | xargs -r -n1 dirname | sort -u)

.PHONY: test
test: test-unit test-e2e test-apiserver test-chaos ## Every tier CI runs: vet, format check, then unit, e2e, API-server and chaos tests (race detector)

.PHONY: test-unit
test-unit: deps vet fmt-check ## Fast tier: go test -race -short ./... (no child processes; under 90 s)
	$(GO) test -race -short -count=1 ./...

.PHONY: test-e2e
test-e2e: deps helm-install ## Process tier: the tests -short skips (e2e/, live dashboard, python3/haproxy interop, the Helm chart, long runs)
	$(GO) test -race -count=1 -timeout 20m $(E2E_PKGS)

.PHONY: deps
deps: ## Install what the tests need beyond Go when root (Debian: python3-zmq, python3-msgpack, haproxy, docker-compose, iproute2); otherwise say what
	@missing=""; \
	/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null || missing="$$missing python3-zmq python3-msgpack"; \
	command -v haproxy >/dev/null 2>&1 || missing="$$missing haproxy"; \
	command -v docker >/dev/null 2>&1 || missing="$$missing docker.io"; \
	command -v docker-compose >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	command -v tc >/dev/null 2>&1 || missing="$$missing iproute2"; \
	command -v nsenter >/dev/null 2>&1 || missing="$$missing util-linux"; \
	if [ -n "$$missing" ]; then \
	  echo "the tests need$$missing (Debian packages): python3-zmq and python3-msgpack for the libzmq interop test, haproxy for the replay baseline, docker.io and docker-compose for the chaos tests, iproute2 (tc) and util-linux (nsenter) for its slow-follower fault"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else echo "run as root, or: sudo apt-get install$$missing" >&2; exit 1; fi; \
	fi

.PHONY: demo
demo: ## The main job: directory, 4 enginesims+agents (70B, time-compressed), routers; a bundled agent trace under round-robin, session-hash, kvdir -> bench/results/demo.*
	$(GO) run ./bench/cmd/kvbench demo

# The public Mooncake trace (Apache-2.0; origin in bench/testdata/README.md); any file of its format works.
TRACE ?= bench/testdata/mooncake_synthetic_trace.jsonl

.PHONY: bench-sim
bench-sim: ## kvbench sim: every policy on TRACE, 8 x llama3-70b, KV 2x and 0.7x the working set, and at half rate -> bench/results/sim-mooncake-70b-*
	$(GO) run ./bench/cmd/kvbench sim --trace $(TRACE) --replicas 8 --profile llama3-70b --kv-blocks 101200 --policies all --parallel 2 --out bench/results/sim-mooncake-70b-kv2x.json
	$(GO) run ./bench/cmd/kvbench sim --trace $(TRACE) --replicas 8 --profile llama3-70b --kv-blocks 35400 --policies all --parallel 2 --out bench/results/sim-mooncake-70b-kv0.7x.json
	$(GO) run ./bench/cmd/kvbench sim --trace $(TRACE) --replicas 8 --profile llama3-70b --kv-blocks 101200 --time-scale 2 --policies all --parallel 2 --out bench/results/sim-mooncake-70b-kv2x-halfrate.json

# 4 routers behind a round-robin balancer, without and with shared placement intents (the 1-router runs
# are sim-demo and bench-sim's), then kvdir with the intents arriving later and later (docs/benchmarks.md).
SIM_DEMO   := --trace bench/testdata/demo-sessions.jsonl --replicas 4 --profile llama3-70b --policies round-robin,session-hash,kvdir --no-charts
SIM_MOON   := --trace $(TRACE) --replicas 8 --profile llama3-70b --kv-blocks 101200 --no-charts
.PHONY: bench-sim-routers
bench-sim-routers: ## kvbench sim: 4 routers without and with shared intents, demo trace and TRACE (KV 2x, own and half rate) -> bench/results/sim-*-4routers*
	$(GO) run ./bench/cmd/kvbench sim $(SIM_DEMO) --routers 4 --out bench/results/sim-demo-4routers.json
	$(GO) run ./bench/cmd/kvbench sim $(SIM_DEMO) --routers 4 --shared-intents --out bench/results/sim-demo-4routers-intents.json
	$(GO) run ./bench/cmd/kvbench sim $(SIM_MOON) --policies all --parallel 2 --routers 4 --out bench/results/sim-mooncake-70b-kv2x-4routers.json
	$(GO) run ./bench/cmd/kvbench sim $(SIM_MOON) --policies all --parallel 2 --routers 4 --shared-intents --out bench/results/sim-mooncake-70b-kv2x-4routers-intents.json
	$(GO) run ./bench/cmd/kvbench sim $(SIM_MOON) --time-scale 2 --policies all --parallel 2 --routers 4 --out bench/results/sim-mooncake-70b-kv2x-halfrate-4routers.json
	$(GO) run ./bench/cmd/kvbench sim $(SIM_MOON) --time-scale 2 --policies all --parallel 2 --routers 4 --shared-intents --out bench/results/sim-mooncake-70b-kv2x-halfrate-4routers-intents.json
	for lag in 20ms 100ms 500ms 2s; do \
	  $(GO) run ./bench/cmd/kvbench sim $(SIM_MOON) --time-scale 2 --policies kvdir --routers 4 --shared-intents --intent-lag $$lag \
	    --out bench/results/sim-mooncake-70b-kv2x-halfrate-4routers-intents-$$lag.json || exit 1; \
	done

.PHONY: bench-capacity
bench-capacity: ## kvbench sweep: every policy's capacity at a p90 TTFT SLO on TRACE (8 x llama3-70b, KV 2x, 10 s) and the demo trace (the profile's 2 s) -> bench/results/capacity-*
	@# TRACE's prompts take 5.5 s at p90 on an idle cluster: its SLO is twice that (bench/testdata/README.md).
	$(GO) run ./bench/cmd/kvbench sweep --trace $(TRACE) --replicas 8 --profile llama3-70b --kv-blocks 101200 --slo 10s --parallel 2 --out bench/results/capacity-mooncake.json
	$(GO) run ./bench/cmd/kvbench sweep --trace bench/testdata/demo-sessions.jsonl --replicas 4 --profile llama3-70b --parallel 2 --out bench/results/capacity-demo.json

.PHONY: bench-eval
bench-eval: ## kvbench eval: the capacity sweep over every member of bench/testdata/evalset.json -> bench/results/capacity-eval*
	$(GO) run ./bench/cmd/kvbench eval --set bench/testdata/evalset.json --out-dir bench/results

.PHONY: bench
bench: bench-index bench-directory bench-directory-workers bench-directory-groups bench-follow bench-agent bench-router bench-router-candidates bench-router-memory bench-sim bench-sim-routers bench-capacity bench-eval demo ## Every benchmark; refreshes bench/results/ and the figure tables quoting them
	$(GO) run ./bench/cmd/kvbench docs

.PHONY: bench-index
bench-index: ## Index and hashing figures at full scale -> bench/results/index.json
	@mkdir -p $(dir $(BENCH_OUT))
	$(GO) run ./bench/cmd/kvbench index --out $(BENCH_OUT)

.PHONY: bench-index-workers
bench-index-workers: ## Index figures on 2 M entries over pools of 64 to 16,384 workers -> bench/results/index-workers-N.json
	@for n in 64 1024 4096 16384; do \
	  $(GO) run ./bench/cmd/kvbench index --scale 0.2 --goradix-scale -1 --matches 100000 --churn-events 2000000 \
	    --workers $$n --out bench/results/index-workers-$$n.json || exit 1; \
	done

.PHONY: bench-directory-quota
bench-directory-quota: ## 3 directory processes, one worker flooded past its block quota -> bench/results/directory-quota.json
	$(GO) run ./bench/cmd/kvbench directory --block-quota

.PHONY: bench-directory-workers
bench-directory-workers: ## 3 directory processes, the same workload published by 64 then 1,024 workers (same batches in flight) -> bench/results/directory-workers.json
	@mkdir -p bench/results
	$(GO) run ./bench/cmd/kvbench directory --worker-pools 64,1024 --scale 0.5 --batch-blocks 256 --rounds 3 --out bench/results/directory-workers.json

.PHONY: bench-directory-groups
bench-directory-groups: ## 1, 2, 3 independent 3-process directory groups published to at once: events/s, ratio, per-core -> bench/results/directory-groups.json
	@mkdir -p bench/results
	$(GO) run ./bench/cmd/kvbench directory --groups 3 --scale 0.5 --rounds 3 --out bench/results/directory-groups.json

.PHONY: bench-directory
bench-directory: ## 3 directory processes, 64 publishing workers -> bench/results/directory.json
	@mkdir -p bench/results
	$(GO) run ./bench/cmd/kvbench directory --out bench/results/directory.json

.PHONY: bench-follow
bench-follow: ## A router's local replica at 10 M entries: cold start, memory per entry, view lag (3 directory processes) -> bench/results/follow.json
	@mkdir -p bench/results
	$(GO) run ./bench/cmd/kvbench follow --out bench/results/follow.json

.PHONY: bench-agent
bench-agent: ## Agent decode+hash rate, end-to-end event lag (directory, enginesim, agent processes) -> bench/results/agent.json
	@mkdir -p bench/results
	$(GO) run ./bench/cmd/kvbench agent --out bench/results/agent.json

.PHONY: bench-router
bench-router: haproxy-dep ## Router decision time, proxy overhead vs HAProxy, throughput (real processes) -> bench/results/router.json
	@mkdir -p bench/results
	$(GO) run ./bench/cmd/kvbench router --out bench/results/router.json

.PHONY: bench-router-candidates
bench-router-candidates: ## Router decision time, warm 32 k-token session, 4 vs 1,024 candidate workers side by side -> bench/results/router-candidates.json
	@mkdir -p bench/results
	$(GO) test -run '^$$' -bench 'DecisionCandidates$$' -benchtime 2000x -count 1 ./internal/router -args -candidates-out ../../bench/results/router-candidates.json

.PHONY: bench-router-memory
bench-router-memory: ## Router memory with 200 slow bodies held and 500 clients (real processes) -> bench/results/router-memory.json
	@mkdir -p bench/results
	$(GO) run ./bench/cmd/kvbench router-memory --out bench/results/router-memory.json

.PHONY: haproxy-dep
haproxy-dep: ## Install Debian's HAProxy if missing (the router benchmark's baseline)
	@if ! command -v haproxy >/dev/null 2>&1; then \
	  echo "installing haproxy (Debian) for the router benchmark's baseline"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy; \
	  else echo "run as root, or: sudo apt-get install haproxy" >&2; exit 1; fi; \
	fi

.PHONY: docs
docs: ## Rewrite the generated figure tables in the Markdown files from bench/results (after a benchmark run)
	$(GO) run ./bench/cmd/kvbench docs

.PHONY: docs-check
docs-check: ## Fail if a generated figure table in a Markdown file differs from bench/results
	$(GO) run ./bench/cmd/kvbench docs --check

.PHONY: bench-go
bench-go: ## Go micro-benchmarks of the index and hashing (for benchstat)
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./internal/radix ./internal/blockhash ./internal/router | tee bench/results/go-bench.txt

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 15s); a failing input is minimised for at most 2 s
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 2s $$pkg; \
	  done; \
	done

.PHONY: proto
proto: tools ## Lint the protobuf files and regenerate the Go code in proto/
	PATH="$(BIN):$$PATH" buf lint
	PATH="$(BIN):$$PATH" buf generate

.PHONY: tools
tools: $(BIN)/buf-$(BUF_VERSION) $(BIN)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION) $(BIN)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)

$(BIN)/buf-$(BUF_VERSION):
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	@touch $@
$(BIN)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION):
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@touch $@
$(BIN)/staticcheck-$(STATICCHECK_VERSION):
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	@touch $@
$(BIN)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION):
	GOBIN=$(BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	@touch $@
