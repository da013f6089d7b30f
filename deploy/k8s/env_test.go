package k8s

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/testkit"
)

// TestVariablesAreFlags builds each kvdir binary the manifests run and
// checks that its --help names every KVDIR_ variable the manifests set on
// it: a variable that is no flag's would be ignored.
func TestVariablesAreFlags(t *testing.T) {
	testkit.SkipIfShort(t, "builds the binaries and runs their --help as child processes")
	_, objs, err := LoadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	help := map[string]string{}
	for _, cv := range KVDIRVars(objs) {
		if _, ok := help[cv.Binary]; !ok {
			bin := filepath.Join(dir, cv.Binary)
			if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/"+cv.Binary).CombinedOutput(); err != nil {
				t.Fatalf("go build %s: %v\n%s", cv.Binary, err, out)
			}
			out, err := exec.Command(bin, "--help").Output()
			if err != nil {
				t.Fatalf("%s --help: %v", cv.Binary, err)
			}
			help[cv.Binary] = string(out)
		}
		for _, v := range cv.Vars {
			if !strings.Contains(help[cv.Binary], "("+v+")") && !strings.Contains(help[cv.Binary], v+" ") {
				t.Errorf("%s: container %s sets %s, which %s --help does not list", cv.Obj, cv.Container, v, cv.Binary)
			}
		}
	}
	if len(help) == 0 {
		t.Fatal("no container runs a kvdir image")
	}
}
