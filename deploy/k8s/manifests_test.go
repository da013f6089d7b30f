package k8s

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvdir/kvdir/internal/testkit"
)

// TestManifestsDecodeStrictly decodes every manifest kustomization.yaml
// lists into its Kubernetes API type, rejecting unknown fields, and checks
// the objects a deployment needs are there: the directory StatefulSet with
// its Services and disruption budget, the router Deployment with its Service
// and autoscaler, vLLM with the agent beside it, and the directory's
// NetworkPolicy.
func TestManifestsDecodeStrictly(t *testing.T) {
	k, objs, err := LoadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	if k.Namespace != "kvdir" {
		t.Errorf("kustomization namespace %q, want kvdir", k.Namespace)
	}
	have := map[string]bool{}
	for _, o := range objs {
		have[o.Kind+"/"+o.Name] = true
	}
	for _, want := range []string{
		"Namespace/kvdir",
		"StatefulSet/kvdir-directory", "Service/kvdir-directory-headless", "Service/kvdir-directory",
		"PodDisruptionBudget/kvdir-directory",
		"Deployment/kvdir-router", "Service/kvdir-router", "HorizontalPodAutoscaler/kvdir-router",
		"Deployment/vllm", "NetworkPolicy/kvdir-directory",
	} {
		if !have[want] {
			t.Errorf("no %s among the manifests", want)
		}
	}
	for _, o := range objs {
		if s, ok := o.Obj.(*appsv1.StatefulSet); ok && s.Name == "kvdir-directory" {
			if s.Spec.Replicas == nil || *s.Spec.Replicas != 3 || len(s.Spec.VolumeClaimTemplates) == 0 {
				t.Errorf("%s: want 3 replicas with a volume claim template", o)
			}
		}
	}
}

// TestManifestsCrossReferences runs Check on the manifests.
func TestManifestsCrossReferences(t *testing.T) {
	_, objs, err := LoadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(objs); err != nil {
		t.Fatal(err)
	}
}

// TestImagesAreBuilt checks that every kvdir image the manifests run is one
// deploy/images builds, runs as its non-root user, and is in the
// kustomization's image list (so an overlay can set its tag).
func TestImagesAreBuilt(t *testing.T) {
	k, objs, err := LoadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, im := range k.Images {
		listed[im.Name] = true
	}
	for _, w := range workloads(objs) {
		for _, c := range containers(&w.template.Spec) {
			name, bin, ok := kvdirImage(c.Image)
			if !ok {
				continue
			}
			if _, err := os.Stat(filepath.Join("..", "images", bin+".Dockerfile")); err != nil {
				t.Errorf("%s: container %s runs %s, which deploy/images does not build", w.obj, c.Name, c.Image)
			}
			if !listed[name] {
				t.Errorf("%s: image %s is not in kustomization.yaml's images", w.obj, name)
			}
			uid := w.template.Spec.SecurityContext
			var user *int64
			if uid != nil {
				user = uid.RunAsUser
			}
			if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
				user = c.SecurityContext.RunAsUser
			}
			if user == nil || *user != 65532 {
				t.Errorf("%s: container %s should run as user 65532, the images' user", w.obj, c.Name)
			}
		}
	}
}

// TestKustomizeBuild renders the manifests with `kubectl kustomize` (when
// kubectl is installed) and decodes and checks the result: what would be
// applied, namespace and labels included.
func TestKustomizeBuild(t *testing.T) {
	testkit.SkipIfShort(t, "runs kubectl kustomize")
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed; the manifests were still decoded by the other tests")
	}
	out, err := exec.Command(kubectl, "kustomize", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	objs, err := DecodeStream("kustomize-output", out)
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(objs); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if _, ok := o.Obj.(*corev1.Namespace); ok {
			continue
		}
		var ns string
		switch v := o.Obj.(type) {
		case interface{ GetNamespace() string }:
			ns = v.GetNamespace()
		}
		if ns != "kvdir" {
			t.Errorf("%s: namespace %q after kustomize, want kvdir", o, ns)
		}
	}
}

// TestChecksCatchMistakes makes one plausible mistake at a time in a copy
// of the manifests and expects Decode or Check to report it.
func TestChecksCatchMistakes(t *testing.T) {
	cases := []struct {
		name, file, old, new, want string
	}{
		{"misspelt field", "directory.yaml", "replicas: 3", "replica: 3", `unknown field "spec.replica"`},
		{"field in the wrong case", "directory.yaml", "replicas: 3", "Replicas: 3", `unknown field "spec.Replicas"`},
		{"field at the wrong level", "router.yaml", "      terminationGracePeriodSeconds: 40", "      terminationGracePeriod: 40", `unknown field "spec.template.spec.terminationGracePeriod"`},
		{"unknown apiVersion", "router.yaml", "apiVersion: autoscaling/v2\n", "apiVersion: autoscaling/v2beta3\n", "unknown apiVersion/kind autoscaling/v2beta3"},
		{"wrong value type", "directory.yaml", "maxUnavailable: 1", "maxUnavailable: [1]", "PodDisruptionBudget kvdir-directory"},
		{"service target port", "directory.yaml", "targetPort: api", "targetPort: apii", "targets apii"},
		{"service selector", "router.yaml", "  selector:\n    app.kubernetes.io/name: kvdir-router\n", "  selector:\n    app.kubernetes.io/name: kvdir-routr\n", "matches no workload"},
		{"probe port", "router.yaml", "path: /readyz\n              port: http", "path: /readyz\n              port: htp", "readinessProbe port htp"},
		{"undefined variable", "directory.yaml", "value: $(POD_NAME).kvdir-directory-headless:7000", "value: $(POD_NAM).kvdir-directory-headless:7000", "uses $(POD_NAM)"},
		{"ordered pods", "directory.yaml", "podManagementPolicy: Parallel", "podManagementPolicy: OrderedReady", "must be Parallel"},
		{"initial cluster", "directory.yaml", "kvdir-directory-2=kvdir-directory-2.kvdir-directory-headless:7000", "kvdir-directory-2=kvdir-directory-2.kvdir-directory:7000", "KVDIR_DIRECTORY_INITIAL_CLUSTER"},
		{"not headless", "directory.yaml", "clusterIP: None", "clusterIP: \"\"", "is not headless"},
		{"agent dials a non-member", "vllm.yaml", "kvdir-directory-2.kvdir-directory-headless:7001", "kvdir-directory-3.kvdir-directory-headless:7001", `"kvdir-directory-3.kvdir-directory-headless:7001", which is not a directory member`},
		{"router dials the client Service", "router.yaml", "kvdir-directory-0.kvdir-directory-headless:7001,", "kvdir-directory:7001,", "leaves out member kvdir-directory-0"},
		{"kv events topic", "vllm.yaml", `"topic":"kvdir"`, `"topic":"kv"`, `agent topic "kvdir", engine topic "kv"`},
		{"kv events config key", "vllm.yaml", `"publisher":"zmq"`, `"publsher":"zmq"`, `unknown field "publsher"`},
		{"kv events port", "vllm.yaml", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5559", "is not the engine's port 5557"},
		{"hash seed", "vllm.yaml", "name: PYTHONHASHSEED", "name: PYTHONHASHSED", "PYTHONHASHSEED must be set"},
		{"hash algorithm", "vllm.yaml", "--prefix-caching-hash-algo=sha256_cbor", "--prefix-caching-hash-algo=sha256", "use sha256_cbor"},
		{"served model", "vllm.yaml", "--served-model-name=llama3-8b", "--served-model-name=llama-3-8b", "--served-model-name"},
		{"hpa target", "router.yaml", "    kind: Deployment\n    name: kvdir-router", "    kind: Deployment\n    name: kvdir-routr", "scaleTargetRef Deployment/kvdir-routr does not exist"},
		{"tokenize url", "router.yaml", "http://vllm:8000/tokenize", "http://vllm:8001/tokenize", "has no port 8001"},
		{"variable of the old scheme", "directory.yaml", "name: KVDIR_DIRECTORY_LOG_FORMAT", "name: KVDIR_LOG_FORMAT", "KVDIR_LOG_FORMAT is not read by directory"},
		{"variable of another binary", "router.yaml", "name: KVDIR_ROUTER_POLICY", "name: KVDIR_AGENT_POLICY", "KVDIR_AGENT_POLICY is not read by router"},
		// Secure by default.
		{"no network policy", "networkpolicy.yaml", "  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: kvdir-directory\n", "  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: kvdir-directry\n", "no NetworkPolicy with Ingress selects the directory's pods"},
		{"raft open to clients", "networkpolicy.yaml", "      ports:\n        - port: api\n    - ports:", "      ports:\n        - port: api\n        - port: raft\n    - ports:", "admits router.yaml#1 Deployment/kvdir-router to the raft port"},
		{"raft open to everyone", "networkpolicy.yaml", "    - ports:\n        - port: http\n", "    - ports:\n        - port: http\n        - port: raft\n", "admits everyone to the raft port"},
		{"api open to another namespace", "networkpolicy.yaml", "    - from:\n        - podSelector:\n            matchExpressions:", "    - from:\n        - namespaceSelector: {}\n          podSelector:\n            matchExpressions:", "admits more than this namespace's pods to the api port"},
		{"router not admitted", "router.yaml", "kvdir.io/directory-client: router", "kvdir.io/directory-client: routr", "no NetworkPolicy rule admits router.yaml#1 Deployment/kvdir-router to the api port"},
		{"admin not admitted", "networkpolicy.yaml", "values: [agent, router, admin]", "values: [agent, router]", "kvdir.io/directory-client=admin"},
		{"wildcard kv events", "vllm.yaml", `"endpoint":"tcp://127.0.0.1:5557"`, `"endpoint":"tcp://*:5557"`, `KV-event endpoint "tcp://*:5557" is reachable from outside the pod`},
		{"replay on all interfaces", "vllm.yaml", `"replay_endpoint":"tcp://127.0.0.1:5558"`, `"replay_endpoint":"tcp://0.0.0.0:5558"`, `KV-event endpoint "tcp://0.0.0.0:5558"`},
		{"agent binds all interfaces", "vllm.yaml", "              value: tcp://127.0.0.1:5557\n", "              value: tcp://0.0.0.0:5557\n", "the agent binds KV-event endpoint"},
		{"raft without mutual TLS", "directory.yaml", "            - name: KVDIR_DIRECTORY_LOG_FORMAT\n", "            - name: KVDIR_DIRECTORY_INSECURE_RAFT\n              value: \"true\"\n            - name: KVDIR_DIRECTORY_LOG_FORMAT\n", "KVDIR_DIRECTORY_INSECURE_RAFT: the reference manifests run nothing insecurely"},
		{"no directory CA", "directory.yaml", "            - name: KVDIR_DIRECTORY_TLS_CA\n              value: /etc/kvdir/secrets/ca.crt\n", "", "KVDIR_DIRECTORY_TLS_CA is not set"},
		{"key outside the Secret", "directory.yaml", "value: /etc/kvdir/secrets/$(POD_NAME).key", "value: /data/$(POD_NAME).key", "KVDIR_DIRECTORY_TLS_KEY \"/data/$(POD_NAME).key\" is not in a mounted Secret"},
		{"token in the manifest", "router.yaml", "            - name: KVDIR_ROUTER_TOKEN\n              valueFrom:\n                secretKeyRef:\n                  name: kvdir-router-secrets\n                  key: token\n", "            - name: KVDIR_ROUTER_TOKEN\n              value: hunter2\n", "KVDIR_ROUTER_TOKEN must come from a Secret"},
		{"agent without a token", "vllm.yaml", "            - name: KVDIR_AGENT_TOKEN\n              valueFrom:\n                secretKeyRef:\n                  name: kvdir-agent-secrets\n                  key: vllm.token\n", "", "neither KVDIR_AGENT_TOKEN nor KVDIR_AGENT_TOKEN_FILE is set"},
		{"agent without TLS", "vllm.yaml", "            - name: KVDIR_AGENT_TLS_CA\n              value: /etc/kvdir/tls/ca.crt\n", "", "KVDIR_AGENT_TLS_CA is not set"},
		{"agent credentials outside the Secret", "directory.yaml", "              value: /etc/kvdir/secrets/agent-credentials\n", "              value: /data/agent-credentials\n", `KVDIR_DIRECTORY_AGENT_CREDENTIALS "/data/agent-credentials" is not in a mounted Secret`},
		{"directory without admin token", "directory.yaml", "            - name: KVDIR_DIRECTORY_ADMIN_TOKEN\n", "            - name: KVDIR_DIRECTORY_ADMIN_TOKN\n", "neither KVDIR_DIRECTORY_ADMIN_TOKEN nor"},
	}
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				if f == c.file {
					s := string(b)
					if !strings.Contains(s, c.old) {
						t.Fatalf("%s does not contain %q: update the test", f, c.old)
					}
					b = []byte(strings.Replace(s, c.old, c.new, 1))
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, objs, err := LoadDir(dir)
			if err == nil {
				err = Check(objs)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			if testing.Verbose() {
				t.Log(err)
			}
		})
	}
	t.Run("file not in kustomization", func(t *testing.T) {
		dir := t.TempDir()
		for _, f := range files {
			b, _ := os.ReadFile(f)
			if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "extra.yaml"), []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := LoadDir(dir); err == nil || !strings.Contains(err.Error(), "extra.yaml is not in kustomization.yaml's resources") {
			t.Fatalf("error %v", err)
		}
	})
}

func TestDocuments(t *testing.T) {
	in := "# only a comment\n---\na: 1\n--- \n\n---\nb: 2\n# trailing\n"
	docs := Documents([]byte(in))
	if len(docs) != 2 || !strings.Contains(string(docs[0]), "a: 1") || !strings.Contains(string(docs[1]), "b: 2") {
		t.Fatalf("documents %q", docs)
	}
	if _, err := Decode("x.yaml", []byte("kind: Service\nmetadata:\n  name: a\n")); err == nil || !strings.Contains(err.Error(), "apiVersion and kind are required") {
		t.Fatalf("no apiVersion: %v", err)
	}
	if _, err := Decode("x.yaml", []byte("apiVersion: v1\nkind: Service\nmetadata: {}\n")); err == nil || !strings.Contains(err.Error(), "without metadata.name") {
		t.Fatalf("no name: %v", err)
	}
	if _, err := Decode("x.yaml", []byte("apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  name: b\n")); err == nil || !strings.Contains(err.Error(), `key "name" already set`) {
		t.Fatalf("duplicate key: %v", err)
	}
}
