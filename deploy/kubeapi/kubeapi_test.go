package kubeapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/deploy/helm"
	"github.com/kvdir/kvdir/deploy/k8s"
	"github.com/kvdir/kvdir/internal/testkit"
)

// binaryOrSkip finds a binary make test-apiserver builds: $env, else the
// repository's bin/name.
func binaryOrSkip(t *testing.T, env, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	root, err := testkit.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(root, "bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no %s (%s or bin/%s): make test-apiserver builds it", name, env, name)
	}
	return p
}

// startAPIServer starts etcd and kube-apiserver on loopback for t, with TLS
// from a test CA, a client certificate to authenticate with and every
// request authorized, and returns a client once /readyz answers ok.
func startAPIServer(t *testing.T) *Client {
	t.Helper()
	apiserver := binaryOrSkip(t, "KVDIR_KUBE_APISERVER", "kube-apiserver")
	etcd := binaryOrSkip(t, "KVDIR_ETCD", "etcd")
	dir := t.TempDir()
	ca := testkit.MustCA(t, "kvdir-test-kube-ca")
	caFile, err := ca.WriteCA(dir, "ca.crt")
	if err != nil {
		t.Fatal(err)
	}
	serveCert, serveKey, err := ca.MustIssue(t, []string{"127.0.0.1", "localhost"}, x509.ExtKeyUsageServerAuth).Write(dir, "apiserver")
	if err != nil {
		t.Fatal(err)
	}
	// The service-account token signing key (the server wants one).
	_, saKey, err := ca.MustIssue(t, []string{"service-accounts"}).Write(dir, "sa")
	if err != nil {
		t.Fatal(err)
	}
	client := ca.MustIssue(t, []string{"kvdir-test"}, x509.ExtKeyUsageClientAuth)
	addrs := testkit.FreeAddrs(t, 3)
	etcdClient, etcdPeer, apiAddr := addrs[0], addrs[1], addrs[2]

	began := time.Now()
	testkit.StartProc(t, "etcd", etcd,
		"--name", "kvdir-test", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://"+etcdClient, "--advertise-client-urls", "http://"+etcdClient,
		"--listen-peer-urls", "http://"+etcdPeer, "--initial-advertise-peer-urls", "http://"+etcdPeer,
		"--initial-cluster", "kvdir-test=http://"+etcdPeer, "--log-level", "error")
	testkit.Eventually(t, 30*time.Second, "etcd healthy", func() (bool, string) {
		resp, err := http.Get("http://" + etcdClient + "/health")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var h struct{ Health string }
		_ = json.NewDecoder(resp.Body).Decode(&h)
		return h.Health == "true", fmt.Sprintf("%d %q", resp.StatusCode, h.Health)
	})
	t.Logf("etcd healthy after %v", time.Since(began).Round(time.Millisecond))

	began = time.Now()
	p := testkit.StartProc(t, "kube-apiserver", apiserver,
		"--etcd-servers", "http://"+etcdClient,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", fmt.Sprint(testkit.Port(apiAddr)),
		"--tls-cert-file", serveCert, "--tls-private-key-file", serveKey,
		"--client-ca-file", caFile,
		"--authorization-mode", "AlwaysAllow",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saKey, "--service-account-signing-key-file", saKey,
		// Nothing is routed to Services here; the range is only allocated.
		"--service-cluster-ip-range", "10.96.0.0/16",
		// The kubernetes Service's endpoints would be the advertise
		// address, which may not be loopback.
		"--endpoint-reconciler-type", "none",
		"--cert-dir", filepath.Join(dir, "certs"))
	c := NewClient("https://"+apiAddr, &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{client.TLS}, MinVersion: tls.VersionTLS12})
	// Stop waiting as soon as the server exits: its output says why.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := testkit.Poll(ctx, 90*time.Second, "kube-apiserver /readyz ok", func() (bool, string) { return c.Ready(ctx) }); err != nil {
		t.Fatalf("%v (exit code %d)", err, p.ExitCode())
	}
	v, err := c.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver %s ready after %v", v, time.Since(began).Round(time.Millisecond))
	return c
}

// applyAll applies every document of data in ns and returns how many.
func applyAll(t *testing.T, c *Client, ns, source string, data []byte) int {
	t.Helper()
	n := 0
	for i, doc := range k8s.Documents(data) {
		out, err := c.Apply(context.Background(), ns, doc)
		if err != nil {
			t.Errorf("%s#%d: %v", source, i, err)
			continue
		}
		var stored struct {
			Metadata struct{ UID string } `json:"metadata"`
		}
		if err := json.Unmarshal(out, &stored); err != nil || stored.Metadata.UID == "" {
			t.Errorf("%s#%d: stored object without a uid (%v)", source, i, err)
		}
		n++
	}
	return n
}

func namespace(name string) []byte {
	return []byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: " + name + "\n")
}

// TestAPIServerAcceptsManifests starts a real API server, loads the
// upstream CRDs the chart's optional objects and the example Gateway need
// (upstreamCRDs), waits until each is established, and server-side
// applies, with strict
// field validation, every object of deploy/k8s (namespace kvdir), the
// Secrets make deploy-secrets generates, the chart rendered with its
// defaults and each values file in ci/ (a namespace each), and the example
// Gateway of deploy/gateway beside the EPP variant. Then it applies
// broken copies of real manifests and expects the server to refuse each,
// saying why.
func TestAPIServerAcceptsManifests(t *testing.T) {
	testkit.SkipIfShort(t, "runs etcd, kube-apiserver and helm")
	h := helm.Binary()
	if h == "" {
		t.Skip("no helm: make test-apiserver installs it")
	}
	kz := binaryOrSkip(t, "KVDIR_KUSTOMIZE", "kustomize")
	c := startAPIServer(t)
	ctx := context.Background()

	loadUpstreamCRDs(t, c)

	// deploy/k8s as kubectl apply -k applies it: kustomize's output, with
	// the kustomization's namespace, labels and image tags.
	kust, _, err := k8s.LoadDir(filepath.Join("..", "k8s"))
	if err != nil {
		t.Fatal(err)
	}
	base, err := filepath.Abs(filepath.Join("..", "k8s"))
	if err != nil {
		t.Fatal(err)
	}
	built := kustomizeBuild(t, kz, base, "app.kubernetes.io/part-of: kvdir", "image: kvdir/router:dev")
	total := applyAll(t, c, kust.Namespace, "kustomize build deploy/k8s", built)
	if want := len(kust.Resources); total < want {
		t.Errorf("kustomize build deploy/k8s: %d objects applied, want at least one per resource file (%d)", total, want)
	}
	t.Logf("deploy/k8s: %d objects applied in namespace %s", total, kust.Namespace)

	// An overlay of it, as an operator writes one: another namespace,
	// an image tag and the engines' replicas changed without templates.
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, base)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: kvdir-overlay
resources:
  - `+filepath.ToSlash(rel)+`
images:
  - name: kvdir/router
    newTag: v0.1.0
replicas:
  - name: vllm
    count: 4
`), 0o644); err != nil {
		t.Fatal(err)
	}
	built = kustomizeBuild(t, kz, overlay, "name: kvdir-overlay\n", "image: kvdir/router:v0.1.0", "replicas: 4")
	t.Logf("an overlay of deploy/k8s: %d objects applied in namespace kvdir-overlay", applyAll(t, c, "kvdir-overlay", "overlay", built))

	// The Secrets make deploy-secrets writes, in the same namespace.
	bins, err := testkit.Build(t.TempDir(), "deploy/gensecrets")
	if err != nil {
		t.Fatal(err)
	}
	secrets := t.TempDir()
	if out, err := runOut(bins["deploy/gensecrets"], "--out", secrets); err != nil {
		t.Fatalf("gensecrets: %v\n%s", err, out)
	}
	sec, err := os.ReadFile(filepath.Join(secrets, "kubernetes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("deploy/gensecrets: %d Secrets applied", applyAll(t, c, kust.Namespace, "kubernetes.yaml", sec))

	// The chart, each variant in a namespace of its own.
	ci, err := helm.CIValues()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range append([]string{""}, ci...) {
		name := "defaults"
		var values []string
		if v != "" {
			name = strings.TrimSuffix(filepath.Base(v), "-values.yaml")
			values = []string{v}
		}
		ns := "chart-" + name
		applyAll(t, c, "", "namespace "+ns, namespace(ns))
		out, err := helm.TemplateIn(h, ns, values)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("chart %s: %d objects applied in namespace %s", name, applyAll(t, c, ns, "chart "+name, out), ns)
	}
	// The Gateway the EPP variant's HTTPRoute attaches to, beside it.
	gw, err := os.ReadFile(helm.GatewayExample())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("deploy/gateway/istio: %d objects applied in namespace chart-epp", applyAll(t, c, "chart-epp", "gateway/istio/gateway.yaml", gw))

	// Broken manifests: the server refuses each, and says why. They go to
	// a namespace of their own, so that no refusal is about changing an
	// object applied above.
	applyAll(t, c, "", "namespace broken", namespace("broken"))
	sts, err := os.ReadFile(filepath.Join("..", "k8s", "directory.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	epp, err := helm.Template(h, []string{"ci/epp-values.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	mon, err := helm.Template(h, []string{"ci/monitoring-values.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, kind string
		src        []byte
		old, new   string
		want       string
	}{
		{"misspelt field", "StatefulSet", sts, "  replicas: 3\n", "  replica: 3\n", ".spec.replica: field not declared in schema"},
		{"label selector mismatch", "StatefulSet", sts, "    matchLabels:\n      app.kubernetes.io/name: kvdir-directory\n  template:", "    matchLabels:\n      app.kubernetes.io/name: kvdir-directorx\n  template:", "`selector` does not match template `labels`"},
		{"sidecar restart policy", "StatefulSet", sts, "      containers:\n", "      initContainers:\n        - name: bad\n          image: x\n          restartPolicy: Sometimes\n      containers:\n", `Unsupported value: "Sometimes"`},
		{"pool failure mode", "InferencePool", epp, "failureMode: FailOpen", "failureMode: Sometimes", `Unsupported value: "Sometimes"`},
		{"pool without a port", "InferencePool", epp, "    port:\n      number: 9002\n", "", "port is required when kind is 'Service'"},
		{"pool misspelt field", "InferencePool", epp, "  targetPorts:\n", "  targetPort:\n", ".spec.targetPort: field not declared in schema"},
		{"pool with two target ports", "InferencePool", epp, "    - number: 8000\n", "    - number: 8000\n    - number: 8001\n", "spec.targetPorts: Too many: 2: must have at most 1 item"},
		{"pool selector label value", "InferencePool", epp, "      app.kubernetes.io/name: vllm\n", "      app.kubernetes.io/name: -vllm\n", `spec.selector.matchLabels.app.kubernetes.io/name in body should match`},
		{"route path not absolute", "HTTPRoute", epp, "            value: /\n", "            value: v1\n", "value must be an absolute path and start with '/'"},
		{"route to a Service without a port", "HTTPRoute", epp, "        - group: inference.networking.k8s.io\n          kind: InferencePool\n", "        - kind: Service\n", "Must have port for Service reference"},
		{"monitor interval", "ServiceMonitor", mon, "      interval: 15s\n", "      interval: 15 seconds\n", `spec.endpoints[0].interval in body should match`},
		{"gateway route namespaces", "Gateway", gw, "from: Same", "from: Everywhere", `Unsupported value: "Everywhere"`},
		{"gateway listeners clash", "Gateway", gw, "    - name: http\n", "    - name: web\n      protocol: HTTP\n      port: 80\n    - name: http\n",
			"Combination of port, protocol and hostname must be unique for each listener"},
	} {
		doc := pick(t, tc.src, tc.kind)
		if !strings.Contains(string(doc), tc.old) {
			t.Fatalf("%s: %q not in the %s", tc.name, tc.old, tc.kind)
		}
		bad := strings.Replace(string(doc), tc.old, tc.new, 1)
		bad = strings.Replace(bad, "\n  namespace: kvdir\n", "\n  namespace: broken\n", 1)
		_, err := c.Apply(ctx, "broken", []byte(bad))
		var se *StatusError
		if !errors.As(err, &se) || !strings.Contains(se.Message, tc.want) {
			t.Errorf("%s: %v, want the server to refuse it saying %q", tc.name, err, tc.want)
			continue
		}
		t.Logf("%s: refused: %d %s: %s", tc.name, se.Code, se.Reason, se.Message)
	}
}

// upstreamCRDs are the CustomResourceDefinitions that the chart's optional
// objects (InferencePool, HTTPRoute, ServiceMonitor) and the example
// Gateway need, the upstream files themselves: each is a file in the zip of
// a module that deploy/tools/kubeapi's go.mod requires, read from the module
// cache at that version. GatewayClass comes with Gateway, as in Gateway
// API's own install.
var upstreamCRDs = []struct{ module, file, name string }{
	{"sigs.k8s.io/gateway-api-inference-extension", "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml", "inferencepools.inference.networking.k8s.io"},
	{"sigs.k8s.io/gateway-api", "config/crd/standard/gateway.networking.k8s.io_gatewayclasses.yaml", "gatewayclasses.gateway.networking.k8s.io"},
	{"sigs.k8s.io/gateway-api", "config/crd/standard/gateway.networking.k8s.io_gateways.yaml", "gateways.gateway.networking.k8s.io"},
	{"sigs.k8s.io/gateway-api", "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml", "httproutes.gateway.networking.k8s.io"},
	{"github.com/prometheus-operator/prometheus-operator", "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml", "servicemonitors.monitoring.coreos.com"},
}

// loadUpstreamCRDs applies every CRD of upstreamCRDs and waits until each
// is established.
func loadUpstreamCRDs(t *testing.T, c *Client) {
	t.Helper()
	ctx := context.Background()
	root, err := testkit.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	modDir := filepath.Join(root, "deploy", "tools", "kubeapi")
	type module struct{ dir, version string }
	modules := map[string]module{}
	for _, crd := range upstreamCRDs {
		m, ok := modules[crd.module]
		if !ok {
			dir, version, err := ModuleDir(ctx, modDir, crd.module)
			if err != nil {
				t.Fatal(err)
			}
			m = module{dir, version}
			modules[crd.module] = m
		}
		source := crd.module + "@" + m.version + "/" + crd.file
		b, err := os.ReadFile(filepath.Join(m.dir, filepath.FromSlash(crd.file)))
		if err != nil {
			t.Fatal(err)
		}
		docs := k8s.Documents(b)
		if len(docs) != 1 {
			t.Fatalf("%s: %d documents, want one CustomResourceDefinition", source, len(docs))
		}
		out, err := c.Apply(ctx, "", docs[0])
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		var stored typeMeta
		if err := json.Unmarshal(out, &stored); err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		if stored.Kind != "CustomResourceDefinition" || stored.Metadata.Name != crd.name {
			t.Fatalf("%s: stored %s %s, want CustomResourceDefinition %s", source, stored.Kind, stored.Metadata.Name, crd.name)
		}
		began := time.Now()
		testkit.Eventually(t, 30*time.Second, "CRD "+crd.name+" established", func() (bool, string) { return c.Established(ctx, crd.name) })
		t.Logf("CRD %s from %s: established after %v", crd.name, source, time.Since(began).Round(time.Millisecond))
	}
}

func runOut(bin string, args ...string) ([]byte, error) {
	return exec.Command(bin, args...).CombinedOutput()
}

// kustomizeBuild runs kustomize build on dir and checks that its output
// holds each of want (what the kustomization's transforms put there).
func kustomizeBuild(t *testing.T, kz, dir string, want ...string) []byte {
	t.Helper()
	out, err := exec.Command(kz, "build", dir).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			t.Fatalf("kustomize build %s: no %q in its output", dir, w)
		}
	}
	return out
}

// pick returns the first document of data whose kind is kind.
func pick(t *testing.T, data []byte, kind string) []byte {
	t.Helper()
	for _, d := range k8s.Documents(data) {
		if strings.Contains(string(d), "\nkind: "+kind+"\n") {
			return d
		}
	}
	t.Fatalf("no %s", kind)
	return nil
}
