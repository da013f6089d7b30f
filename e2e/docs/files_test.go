package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/testkit/transcript"
)

// guides is every markdown file with commands in it, and how TestGuides
// treats it. A file with commands that is not listed fails
// TestEveryGuideIsListed.
var guides = []struct{ file, how string }{
	{"README.md", "TestGuides/readme: its two blocks are make demo and make test, both in notRun"},
	{"cmd/directory/README.md", "TestGuides/directory: every block, in order"},
	{"cmd/enginesim/README.md", "TestGuides/enginesim: every block, in order"},
	{"cmd/kvdirctl/README.md", "TestGuides/kvdirctl: every block, in the capture order its last section describes"},
	{"cmd/router/README.md", "TestGuides/dev-fleet: 'What a request looks like' against kvbench dev. Not run: 'Running' " +
		"(a router in the foreground, as docs/running.md starts it in the background; and --workers with addresses that do not exist here) " +
		"and 'In front of vLLM, SGLang and TensorRT-LLM' (a GPU and a real engine)"},
	{"docs/engine-side.md", "TestGuides/engine-side: every block, in order"},
	{"docs/running.md", "TestGuides/running-by-hand (the by-hand sections) and TestGuides/dev-fleet (make dev's output and the two-turn session); " +
		"'In containers' is Docker, which the chaos tier runs"},
	{"docs/benchmarks.md", "not run: its blocks run kvbench sim on the Mooncake trace (minutes) and write bench/results; " +
		"make bench-sim, make bench-sim-routers and the benchmark tests cover it"},
	{"deploy/README.md", "not run: every block needs Docker (images, the compose cluster) or a Kubernetes cluster (kubectl, helm install, istioctl); " +
		"the chaos tier (make test-chaos) runs the compose cluster, and go test ./deploy/helm and make test-apiserver check what the Kubernetes blocks apply"},
	{"deploy/helm/kvdir/README.md", "not run: its one block installs the chart into a Kubernetes cluster; go test ./deploy/helm renders and checks the chart, make test-apiserver applies it"},
}

// TestEveryGuideIsListed fails when a markdown file shows commands and is
// neither checked by TestGuides nor excluded with a reason above.
func TestEveryGuideIsListed(t *testing.T) {
	listed := map[string]bool{}
	for _, g := range guides {
		listed[g.file] = true
	}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin" || d.Name() == "tmp") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".md") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		for _, b := range transcript.Parse(rel, src) {
			if len(b.Steps()) > 0 && !listed[rel] {
				t.Errorf("%s shows commands (%s) but is not in the guides table of e2e/docs; check it in TestGuides or say why not",
					rel, b.Where())
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
