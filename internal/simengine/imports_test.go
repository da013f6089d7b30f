package simengine

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const (
	module        = "github.com/kvdir/kvdir"
	simenginePath = module + "/internal/simengine"
)

// simulationSide are the packages (a trailing "/" takes a whole tree) that
// may link the simulator: the simulator itself, the binary that serves it
// and the benchmarks. Everything else in the module is production code or
// its tooling, and depends only on package costmodel for engine timing.
var simulationSide = []string{
	simenginePath,
	module + "/cmd/enginesim",
	module + "/bench/",
}

func onSimulationSide(pkg string) bool {
	for _, s := range simulationSide {
		if pkg == s || strings.HasSuffix(s, "/") && strings.HasPrefix(pkg, s) {
			return true
		}
	}
	return false
}

// TestProductionDoesNotLinkSimulator checks with go list that no package
// outside the simulation side (the router, kvdirctl, the agent, the
// directory, the placement policies, ...) links this package, directly or
// through another package, and that internal/costmodel, which both sides
// share, depends on no other kvdir package. Test-only imports do not count:
// a package's Deps without -test leave them out.
func TestProductionDoesNotLinkSimulator(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the go command (go list -deps over the module)")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to list dependencies with: %v", err)
	}
	cmd := exec.Command(gobin, "list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s/...: %v\n%s", module, err, stderr.Bytes())
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		pkg := fields[0]
		seen[pkg] = true
		if pkg == module+"/internal/costmodel" {
			for _, dep := range fields[1:] {
				if strings.HasPrefix(dep, module+"/") {
					t.Errorf("internal/costmodel depends on %s; it is the leaf that production and simulation share", dep)
				}
			}
		}
		if onSimulationSide(pkg) {
			continue
		}
		for _, dep := range fields[1:] {
			if dep == simenginePath {
				t.Errorf("%s links the engine simulator (%s); production code takes engine timing from internal/costmodel", pkg, simenginePath)
			}
		}
	}
	for _, pkg := range []string{"cmd/router", "cmd/kvdirctl", "internal/router", "internal/placement", "internal/costmodel"} {
		if !seen[module+"/"+pkg] {
			t.Errorf("go list did not report %s/%s: the check would pass vacuously", module, pkg)
		}
	}
}
