// Package e2e holds the process-level system tests of kvdir: each test
// starts real binaries (cmd/directory, cmd/enginesim, cmd/agent,
// cmd/router, cmd/kvdirctl), built once per test run, on loopback
// through internal/testkit/fleet and drives them only through their
// flags, HTTP and gRPC, killing (-9), terminating and restarting them.
// Every test skips under -short (the unit tier); `make test-e2e` runs
// them. Set TEST_DUMP_LOGS=1 to see the processes' output even when a test
// passes.
package e2e
