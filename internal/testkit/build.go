package testkit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// ModuleRoot finds the repository root (the folder with go.mod) from the
// working directory up.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run inside the kvdir repository")
		}
		dir = parent
	}
}

// Build compiles cmd/<name> for every name into dir in one go build
// (packages compile in parallel and share their dependencies) and returns
// the binaries' paths by name. A name with a slash is a main package's
// folder from the module root (e.g. bench/cmd/kvbench), its binary named
// by its last element.
func Build(dir string, names ...string) (map[string]string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return nil, err
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	bins := make(map[string]string, len(names))
	for _, n := range names {
		pkg := "./cmd/" + n
		if strings.Contains(n, "/") {
			pkg = "./" + n
		}
		args = append(args, pkg)
		bins[n] = filepath.Join(dir, filepath.Base(n))
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build %v: %w\n%s", names, err, out)
	}
	return bins, nil
}

// built caches the binaries Binaries built, once per test binary.
var built struct {
	mu   sync.Mutex
	dir  string
	bins map[string]string
}

// Binaries returns the paths of cmd/<name> for every name, built once per
// test binary (those not built yet in one go build) into a temporary folder
// that Main removes. It skips t under -short: a test that runs a real
// binary is not a unit test.
func Binaries(t testing.TB, names ...string) map[string]string {
	t.Helper()
	SkipIfShort(t, "runs the binaries of "+fmt.Sprint(names))
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir == "" {
		dir, err := os.MkdirTemp("", "kvdir-test-bin-")
		if err != nil {
			t.Fatal(err)
		}
		built.dir, built.bins = dir, map[string]string{}
	}
	var missing []string
	for _, n := range names {
		if _, ok := built.bins[n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		bins, err := Build(built.dir, missing...)
		if err != nil {
			t.Fatal(err)
		}
		for n, p := range bins {
			built.bins[n] = p
		}
	}
	out := make(map[string]string, len(names))
	for _, n := range names {
		out[n] = built.bins[n]
	}
	return out
}

// Binary is Binaries for one command.
func Binary(t testing.TB, name string) string {
	t.Helper()
	return Binaries(t, name)[name]
}

// Main runs a package's tests and removes the binaries Binaries built; a
// package whose tests build binaries calls it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	built.mu.Lock()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	built.mu.Unlock()
	os.Exit(code)
}
