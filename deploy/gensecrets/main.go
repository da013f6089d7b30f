// Command gensecrets writes the secrets kvdir's reference deployments run
// with: a CA, one certificate per directory member (valid for its compose
// container name and its Kubernetes pod and Service names), random role
// tokens (agent, router, admin), one token per agent credential with the
// agent-credentials file binding each to the worker ids it may register,
// and kubernetes.yaml, the Secrets deploy/k8s mounts. `make deploy-secrets`
// runs it; deploy/README.md describes the files.
//
//	go run ./deploy/gensecrets [--out deploy/secrets] [--force] [--owner UID:GID|none]
//
// Existing files are kept (delete one to regenerate it, or give --force to
// regenerate everything). Keys and tokens are mode 0600 in a directory of
// mode 0700. Run as root, it gives them to the images' user (65532:65532),
// which the compose containers run as, so that they can read their bind
// mounts; --owner chooses another owner, or none.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gensecrets", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "deploy/secrets", "output `DIR` (created mode 0700)")
	force := fs.Bool("force", false, "replace existing files (a new CA, certificates and tokens)")
	owner := fs.String("owner", "auto", "`UID:GID` to give the files to, or none; auto: 65532:65532 (the images' user) when run as root, else none")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gensecrets: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	own, err := parseOwner(*owner, os.Geteuid())
	if err != nil {
		fmt.Fprintf(stderr, "gensecrets: --owner: %v\n", err)
		return 2
	}
	res, err := Generate(Options{Dir: *out, Force: *force, Owner: own})
	if err != nil {
		fmt.Fprintf(stderr, "gensecrets: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "gensecrets: %s: wrote %d files, kept %d existing\n", *out, len(res.Written), len(res.Kept))
	return 0
}

// parseOwner reads --owner: UID:GID, none (nil), or auto (the images'
// user for root, else none).
func parseOwner(s string, euid int) (*Owner, error) {
	switch s {
	case "none":
		return nil, nil
	case "auto":
		if euid == 0 {
			return &Owner{UID: ImageUser, GID: ImageUser}, nil
		}
		return nil, nil
	}
	u, g, ok := strings.Cut(s, ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if !ok || err1 != nil || err2 != nil || uid < 0 || gid < 0 {
		return nil, fmt.Errorf("%q: want UID:GID (numbers), none or auto", s)
	}
	return &Owner{UID: uid, GID: gid}, nil
}
