// Package helm holds kvdir's Helm chart (deploy/helm/kvdir) and renders it
// with a pinned Helm (make helm-template) for the tests that decode the
// output strictly, cross-check it with deploy/k8s's checks, compare it with
// deploy/k8s's manifests and apply it to a real API server.
package helm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Version is the Helm release make installs (HELM_VERSION in
// deploy/Makefile.inc).
const Version = "v3.22.0"

// KubeVersion is the Kubernetes version helm template renders for: the
// chart requires 1.30+ (native sidecars, preStop sleep), and helm template
// assumes an older one unless told.
const KubeVersion = "1.37.2"

// Namespace is where the chart is rendered: the one the Secrets make
// deploy-secrets writes are in.
const Namespace = "kvdir"

// ChartDir returns the chart's directory (deploy/helm/kvdir).
func ChartDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "kvdir")
}

// GatewayExample returns the path of the example Gateway that the chart's
// HTTPRoute attaches to in endpoint-picker mode
// (deploy/gateway/istio/gateway.yaml).
func GatewayExample() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "gateway", "istio", "gateway.yaml")
}

// Binary finds helm: $KVDIR_HELM, else the repository's bin/helm (make
// helm-install), else helm on PATH. It returns "" if there is none.
func Binary() string {
	if h := os.Getenv("KVDIR_HELM"); h != "" {
		return h
	}
	_, file, _, _ := runtime.Caller(0)
	if h := filepath.Join(filepath.Dir(file), "..", "..", "bin", "helm"); isFile(h) {
		return h
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h
	}
	return ""
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// Template runs helm template on the chart in Namespace with the given
// values files (relative to the chart directory) and --set assignments,
// and returns the rendered manifests; a failure carries helm's message.
func Template(helmBin string, valuesFiles []string, set ...string) ([]byte, error) {
	return TemplateIn(helmBin, Namespace, valuesFiles, set...)
}

// TemplateIn is Template for the release namespace ns.
func TemplateIn(helmBin, ns string, valuesFiles []string, set ...string) ([]byte, error) {
	if helmBin == "" {
		return nil, errors.New("no helm binary")
	}
	dir := ChartDir()
	args := []string{"template", "kvdir", dir, "--namespace", ns, "--kube-version", KubeVersion}
	for _, f := range valuesFiles {
		args = append(args, "--values", filepath.Join(dir, f))
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helmBin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm template %v: %w: %s", valuesFiles, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

// CIValues lists the chart's values files in ci/, relative to the chart
// directory (ci/epp-values.yaml, ...).
func CIValues() ([]string, error) {
	files, err := filepath.Glob(filepath.Join(ChartDir(), "ci", "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("list ci values: %w", err)
	}
	for i, f := range files {
		files[i] = filepath.Join("ci", filepath.Base(f))
	}
	return files, nil
}
