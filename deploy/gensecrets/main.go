// Command gensecrets writes the secrets kvdir's reference deployments run
// with: a CA, one certificate per directory member (valid for its compose
// container name and its Kubernetes pod and Service names), random role
// tokens (agent, router, admin), one token per agent credential with the
// agent-credentials file binding each to the worker ids it may register,
// and kubernetes.yaml, the Secrets deploy/k8s mounts. `make deploy-secrets`
// runs it; deploy/README.md describes the files.
//
//	go run ./deploy/gensecrets [--out deploy/secrets] [--force]
//
// Existing files are kept (delete one to regenerate it, or give --force to
// regenerate everything). The output directory is mode 0700.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gensecrets", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "deploy/secrets", "output `DIR` (created mode 0700)")
	force := fs.Bool("force", false, "replace existing files (a new CA, certificates and tokens)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gensecrets: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	res, err := Generate(Options{Dir: *out, Force: *force})
	if err != nil {
		fmt.Fprintf(stderr, "gensecrets: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "gensecrets: %s: wrote %d files, kept %d existing\n", *out, len(res.Written), len(res.Kept))
	return 0
}
