// Command kvdirctl is kvdir's operator CLI. It answers, over the directory's
// gRPC API, which worker holds which session's prefix and how much of it, how
// loaded each worker is, whether the directory cluster is healthy, and (over
// the router's HTTP API) why the router would place a request where it does;
// it also drains and expires workers and manages the cluster's membership.
//
// Run "kvdirctl --help" for the commands. Every global flag has an
// environment variable KVDIR_CTL_<FLAG>, e.g. KVDIR_CTL_DIRECTORY; the command
// line wins over the environment. The README beside this file is the
// operator guide, with output captured from a running cluster.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
