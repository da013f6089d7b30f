package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
)

// Network is the compose cluster's network (deploy/compose/docker-compose.yml).
const Network = "kvdir-net"

// Docker runs the docker CLI.
type Docker struct {
	// Bin is the docker command (default "docker").
	Bin string
}

func (d Docker) bin() string {
	if d.Bin == "" {
		return "docker"
	}
	return d.Bin
}

// Run runs docker with args and returns its standard output; a failure
// carries the command and its standard error.
func (d Docker) Run(ctx context.Context, args ...string) (string, error) {
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, d.bin(), args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// IP returns the container's address on Network ("" when it is not
// attached, e.g. after a network disconnect, or not running).
func (d Docker) IP(ctx context.Context, container string) (string, error) {
	out, err := d.Run(ctx, "inspect", "-f", `{{with index .NetworkSettings.Networks "`+Network+`"}}{{.IPAddress}}{{end}}`, container)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out), nil
}

// State returns "status/health" of a container, e.g. "running/healthy".
func (d Docker) State(ctx context.Context, container string) (string, error) {
	out, err := d.Run(ctx, "inspect", "-f", `{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}`, container)
	return strings.TrimSpace(out), err
}

// WaitHealthy waits until every container is running and healthy.
func (d Docker) WaitHealthy(ctx context.Context, timeout time.Duration, containers ...string) error {
	return testkit.Poll(ctx, timeout, "healthy containers", func() (bool, string) {
		var bad []string
		for _, c := range containers {
			st, err := d.State(ctx, c)
			if err != nil {
				st = err.Error()
			}
			if st != "running/healthy" {
				bad = append(bad, c+"="+st)
			}
		}
		return len(bad) == 0, strings.Join(bad, ", ")
	})
}

// Logs returns a container's log lines (stdout and stderr) since t.
func (d Docker) Logs(ctx context.Context, container string, since time.Time) (string, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, d.bin(), "logs", "--since", since.UTC().Format(time.RFC3339Nano), container)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("docker logs %s: %w", container, err)
	}
	return out.String(), nil
}
