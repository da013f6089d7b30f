// Package chaos drives fault-injection tests against the compose cluster of
// deploy/compose (3 directory nodes, 4 enginesim + agent pairs, 2 routers)
// with the real Docker engine, under steady load from internal/loadgen, and
// checks after every fault what kvdir promises under faults: no client request
// failed except those in flight at a killed router, no acknowledged event
// batch lost, all directory nodes' digests equal, and every worker's view in
// the directory equal to its engine's cache within a bounded time.
//
// The test is TestChaos; it runs only when KVDIR_CHAOS=1 (make test-chaos),
// so that `go test ./...` compiles and vets it, runs the unit tests of its
// helpers, and skips the Docker part. See deploy/README.md, "Chaos tests",
// for what each fault does and how each invariant is checked.
package chaos
