// Command healthcheck is the health probe of kvdir's container images. The
// images are built FROM scratch, so there is no shell, curl or wget to run
// a Docker HEALTHCHECK with; this tiny static program is copied into each
// image instead. It GETs one URL and exits 0 when the answer is 2xx, 1
// otherwise (Docker's "unhealthy"), 2 on a usage error.
//
//	healthcheck [--timeout 2s] http://127.0.0.1:7002/readyz
//
// The URL may also come from the environment variable HEALTHCHECK_URL,
// so that one image can be probed on a port chosen at run time (it has no
// KVDIR_ prefix: the binaries read KVDIR_<BINARY>_<FLAG>, and the directory
// warns about variables of its prefix it does not know).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"
)

// exit statuses.
const (
	statusHealthy   = 0
	statusUnhealthy = 1
	statusUsage     = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", 2*time.Second, "how long the GET may take")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "healthcheck GETs a URL and exits 0 if it answers 2xx, 1 otherwise (2 on a usage error).\n\n"+
			"Usage: healthcheck [--timeout 2s] URL\n"+
			"The URL may instead be given as HEALTHCHECK_URL.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return statusHealthy
		}
		return statusUsage
	}
	target := getenv("HEALTHCHECK_URL")
	switch fs.NArg() {
	case 0:
	case 1:
		target = fs.Arg(0)
	default:
		fmt.Fprintln(stderr, "healthcheck: give one URL")
		return statusUsage
	}
	if target == "" {
		fmt.Fprintln(stderr, "healthcheck: no URL: give it as the argument or HEALTHCHECK_URL")
		return statusUsage
	}
	if u, err := url.Parse(target); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		fmt.Fprintf(stderr, "healthcheck: %q is not an http(s) URL\n", target)
		return statusUsage
	}
	if *timeout <= 0 {
		fmt.Fprintln(stderr, "healthcheck: --timeout must be positive")
		return statusUsage
	}
	if err := probe(target, *timeout, stdout); err != nil {
		fmt.Fprintln(stderr, "healthcheck:", err)
		return statusUnhealthy
	}
	return statusHealthy
}

// probe GETs target and fails unless it answers 2xx within timeout. The
// first bytes of the body are copied to out (Docker keeps them in the
// container's health log).
func probe(target string, timeout time.Duration, out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("GET %s: %s: %s", target, resp.Status, body)
	}
	_, _ = out.Write(body)
	return nil
}
