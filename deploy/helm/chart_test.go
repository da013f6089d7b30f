package helm

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvdir/kvdir/deploy/k8s"
	"github.com/kvdir/kvdir/internal/testkit"
)

// helmOrSkip returns the helm binary, skipping under -short (it runs a
// child process) and when none is installed (make helm-install; make
// test-e2e installs it first).
func helmOrSkip(t *testing.T) string {
	t.Helper()
	testkit.SkipIfShort(t, "runs helm template")
	h := Binary()
	if h == "" {
		t.Skip("no helm: make helm-install puts the pinned one in bin/ (make test-e2e does it first)")
	}
	return h
}

// render runs helm template and decodes its output strictly.
func render(t *testing.T, h string, values []string, set ...string) []k8s.Object {
	t.Helper()
	out, err := Template(h, values, set...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := k8s.DecodeStream("helm-template", out)
	if err != nil {
		t.Fatalf("%v: %v", values, err)
	}
	return objs
}

func find[T any](objs []k8s.Object, kind, name string) T {
	var zero T
	for _, o := range objs {
		if o.Kind == kind && o.Name == name {
			if v, ok := o.Obj.(T); ok {
				return v
			}
		}
	}
	return zero
}

func kindsOf(objs []k8s.Object) map[string]bool {
	m := map[string]bool{}
	for _, o := range objs {
		m[o.Kind+"/"+o.Name] = true
	}
	return m
}

// TestChartRendersStrictly renders the chart with its default values and
// with each values file in ci/, decodes every object strictly into its
// Kubernetes type (the CRD kinds into deploy/k8s's types for them), runs
// deploy/k8s's cross-reference and security checks on the result, and
// checks each variant's own objects.
func TestChartRendersStrictly(t *testing.T) {
	h := helmOrSkip(t)
	base := []string{
		"Service/kvdir-directory-headless", "Service/kvdir-directory", "PodDisruptionBudget/kvdir-directory",
		"StatefulSet/kvdir-directory", "Service/kvdir-router", "Deployment/kvdir-router", "PodDisruptionBudget/kvdir-router",
	}
	cases := []struct {
		values       string
		want, absent []string
		// allow are the findings of k8s.Check that the values file
		// chooses: the relaxations values.yaml documents.
		allow []string
		check func(t *testing.T, objs []k8s.Object)
	}{
		{values: "", want: append(slices.Clone(base), "Deployment/vllm", "Service/vllm", "NetworkPolicy/kvdir-directory",
			"HorizontalPodAutoscaler/kvdir-router", "ConfigMap/kvdir-dashboard"),
			absent: []string{"InferencePool/vllm", "HTTPRoute/vllm", "ServiceMonitor/kvdir"},
			check: func(t *testing.T, objs []k8s.Object) {
				d := find[*appsv1.Deployment](objs, "Deployment", "kvdir-router")
				if args := d.Spec.Template.Spec.Containers[0].Args; len(args) != 0 {
					t.Errorf("proxy mode router has args %v, want none", args)
				}
				dash := find[*corev1.ConfigMap](objs, "ConfigMap", "kvdir-dashboard")
				want, err := os.ReadFile(filepath.Join("..", "grafana", "kvdir-dashboard.json"))
				if err != nil {
					t.Fatal(err)
				}
				if got := dash.Data["kvdir-dashboard.json"]; got != strings.TrimRight(string(want), "\n") {
					t.Errorf("ConfigMap kvdir-dashboard differs from deploy/grafana/kvdir-dashboard.json (%d vs %d bytes): copy it to deploy/helm/kvdir/dashboards/", len(got), len(want))
				}
			}},
		{values: "ci/epp-values.yaml", want: append(slices.Clone(base), "InferencePool/vllm", "HTTPRoute/vllm", "Deployment/vllm"),
			check: func(t *testing.T, objs []k8s.Object) {
				c := find[*appsv1.Deployment](objs, "Deployment", "kvdir-router").Spec.Template.Spec.Containers[0]
				if !slices.Equal(c.Args, []string{"--mode", "epp"}) {
					t.Errorf("epp router args %v, want [--mode epp]", c.Args)
				}
				env := map[string]string{}
				for _, e := range c.Env {
					env[e.Name] = e.Value
				}
				if env["KVDIR_ROUTER_EPP_ADDR"] != "0.0.0.0:9002" || env["KVDIR_ROUTER_EPP_TLS_CERT"] != "/etc/kvdir/epp-tls/tls.crt" {
					t.Errorf("epp router: KVDIR_ROUTER_EPP_ADDR %q, KVDIR_ROUTER_EPP_TLS_CERT %q; want the gRPC port on the pod's interfaces, over TLS", env["KVDIR_ROUTER_EPP_ADDR"], env["KVDIR_ROUTER_EPP_TLS_CERT"])
				}
				// The picker's candidates are the pool's workers: the
				// label its selector names is the one the pool's agents
				// register.
				var agentLabels string
				for _, ic := range find[*appsv1.Deployment](objs, "Deployment", "vllm").Spec.Template.Spec.InitContainers {
					for _, e := range ic.Env {
						if ic.Name == "kvdir-agent" && e.Name == "KVDIR_AGENT_LABELS" {
							agentLabels = e.Value
						}
					}
				}
				if want := "kvdir.io/inference-pool=vllm"; env["KVDIR_ROUTER_WORKER_SELECTOR"] != want || agentLabels != want {
					t.Errorf("epp router KVDIR_ROUTER_WORKER_SELECTOR %q, vLLM agents' KVDIR_AGENT_LABELS %q; want both %q", env["KVDIR_ROUTER_WORKER_SELECTOR"], agentLabels, want)
				}
				p := find[*k8s.InferencePool](objs, "InferencePool", "vllm")
				if p.Spec.EndpointPickerRef.Name != "kvdir-router" || p.Spec.EndpointPickerRef.Port == nil || p.Spec.EndpointPickerRef.Port.Number != 9002 ||
					p.Spec.EndpointPickerRef.FailureMode != "FailOpen" {
					t.Errorf("InferencePool endpointPickerRef %+v, want kvdir-router port 9002 FailOpen", p.Spec.EndpointPickerRef)
				}
				if p.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "vllm" || len(p.Spec.TargetPorts) != 1 || p.Spec.TargetPorts[0].Number != 8000 {
					t.Errorf("InferencePool selects %v port %v, want the vLLM pods on 8000", p.Spec.Selector.MatchLabels, p.Spec.TargetPorts)
				}
				r := find[*k8s.HTTPRoute](objs, "HTTPRoute", "vllm")
				b := r.Spec.Rules[0].BackendRefs[0]
				if b.Kind == nil || *b.Kind != "InferencePool" || b.Name != "vllm" || r.Spec.Rules[0].Timeouts == nil {
					t.Errorf("HTTPRoute backend %+v, want InferencePool vllm with timeouts", b)
				}
			}},
		{values: "ci/monitoring-values.yaml", want: append(slices.Clone(base), "ServiceMonitor/kvdir", "ConfigMap/kvdir-dashboard"),
			check: func(t *testing.T, objs []k8s.Object) {
				m := find[*k8s.ServiceMonitor](objs, "ServiceMonitor", "kvdir")
				if m.Labels["release"] != "prometheus" || m.Spec.Endpoints[0].Interval != "15s" {
					t.Errorf("ServiceMonitor labels %v endpoints %+v", m.Labels, m.Spec.Endpoints)
				}
				s := find[*appsv1.StatefulSet](objs, "StatefulSet", "kvdir-directory").Spec.Template.Spec
				if len(s.ImagePullSecrets) != 1 || s.ImagePullSecrets[0].Name != "registry-credentials" ||
					s.Containers[0].Image != "kvdir/directory:v0.1.0" || s.Containers[0].ImagePullPolicy != corev1.PullIfNotPresent {
					t.Errorf("directory pod: pull secrets %v, image %s %s", s.ImagePullSecrets, s.Containers[0].Image, s.Containers[0].ImagePullPolicy)
				}
			}},
		{values: "ci/single-node-values.yaml", want: base, absent: []string{"HorizontalPodAutoscaler/kvdir-router"},
			allow: []string{"no required pod anti-affinity on kubernetes.io/hostname"},
			check: func(t *testing.T, objs []k8s.Object) {
				s := find[*appsv1.StatefulSet](objs, "StatefulSet", "kvdir-directory")
				aff := s.Spec.Template.Spec.Affinity.PodAntiAffinity
				if len(aff.RequiredDuringSchedulingIgnoredDuringExecution) != 0 || len(aff.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
					t.Errorf("single-node anti-affinity %+v, want preferred only", aff)
				}
				if sc := s.Spec.VolumeClaimTemplates[0].Spec.StorageClassName; sc == nil || *sc != "standard" {
					t.Errorf("storageClassName %v, want standard", sc)
				}
				if d := find[*appsv1.Deployment](objs, "Deployment", "kvdir-router"); d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
					t.Errorf("router replicas %v without autoscaling, want 1", d.Spec.Replicas)
				}
			}},
		{values: "ci/two-groups-values.yaml", want: append(slices.Clone(base), "StatefulSet/kvdir-directory-large",
			"Service/kvdir-directory-large-headless", "Service/kvdir-directory-large", "PodDisruptionBudget/kvdir-directory-large",
			"NetworkPolicy/kvdir-directory", "NetworkPolicy/kvdir-directory-large", "Deployment/vllm"),
			check: checkTwoGroups},
		{values: "ci/external-engines-values.yaml", want: append(slices.Clone(base), "InferencePool/llama3"),
			absent: []string{"Deployment/vllm", "HTTPRoute/llama3", "ConfigMap/kvdir-dashboard", "NetworkPolicy/kvdir-directory"},
			allow:  []string{"no NetworkPolicy with Ingress selects the directory's pods"},
			check: func(t *testing.T, objs []k8s.Object) {
				c := find[*appsv1.Deployment](objs, "Deployment", "kvdir-router").Spec.Template.Spec.Containers[0]
				for _, e := range c.Env {
					if e.Name == "KVDIR_ROUTER_TOKENIZE_URL" {
						t.Errorf("local tokenizer, yet %s=%s", e.Name, e.Value)
					}
				}
				svc := find[*corev1.Service](objs, "Service", "kvdir-router")
				if p := svc.Spec.Ports[len(svc.Spec.Ports)-1]; p.Name != "grpc" || p.AppProtocol == nil || *p.AppProtocol != "kubernetes.io/h2c" {
					t.Errorf("plaintext picker port %+v, want grpc with appProtocol kubernetes.io/h2c", p)
				}
			}},
	}
	for _, tc := range cases {
		name := tc.values
		if name == "" {
			name = "defaults"
		}
		t.Run(filepath.Base(name), func(t *testing.T) {
			var values []string
			if tc.values != "" {
				values = []string{tc.values}
			}
			objs := render(t, h, values)
			checkAllowing(t, objs, tc.allow)
			have := kindsOf(objs)
			for _, w := range tc.want {
				if !have[w] {
					t.Errorf("no %s in the output", w)
				}
			}
			for _, a := range tc.absent {
				if have[a] {
					t.Errorf("%s in the output, want none", a)
				}
			}
			for _, o := range objs {
				if ns := reflect.ValueOf(o.Obj).Elem().FieldByName("Namespace"); ns.IsValid() && ns.String() != Namespace {
					t.Errorf("%s: namespace %q, want %s", o, ns.String(), Namespace)
				}
			}
			tc.check(t, objs)
		})
	}
}

// checkAllowing runs k8s.Check and fails on every finding but the allowed
// ones, each of which must be found (so that an allowance does not outlive
// its reason).
func checkAllowing(t *testing.T, objs []k8s.Object, allow []string) {
	t.Helper()
	var findings []error
	if err := k8s.Check(objs); err != nil {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			findings = j.Unwrap()
		} else {
			findings = []error{err}
		}
	}
	seen := make([]bool, len(allow))
	for _, f := range findings {
		i := slices.IndexFunc(allow, func(a string) bool { return strings.Contains(f.Error(), a) })
		if i < 0 {
			t.Error(f)
			continue
		}
		seen[i] = true
	}
	for i, a := range allow {
		if !seen[i] {
			t.Errorf("allowed finding %q was not reported: drop the allowance", a)
		}
	}
}

// TestChartCoversEveryValuesFile fails when a values file in ci/ is not
// among TestChartRendersStrictly's cases, so none goes unchecked.
func TestChartCoversEveryValuesFile(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(ChartDir(), "ci", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("chart_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !bytes.Contains(src, []byte(`"ci/`+filepath.Base(f)+`"`)) {
			t.Errorf("ci/%s is not rendered by TestChartRendersStrictly", filepath.Base(f))
		}
	}
	if len(files) == 0 {
		t.Fatal("no values files in ci/")
	}
}

// TestChartMatchesKustomize renders the defaults and compares them with
// deploy/k8s: the pod specs of the directory, the router and vLLM (every
// flag, port, probe, volume and security context) and the Services', PDBs'
// and NetworkPolicy's specs must be the same; only labels and the router's
// replica count (the autoscaler's) may differ.
func TestChartMatchesKustomize(t *testing.T) {
	h := helmOrSkip(t)
	chart := render(t, h, nil)
	_, kust, err := k8s.LoadDir(filepath.Join("..", "k8s"))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]k8s.Object{}
	for _, o := range chart {
		byName[o.Kind+"/"+o.Name] = o
	}
	compared := 0
	for _, o := range kust {
		if o.Kind == "Namespace" {
			continue
		}
		c, ok := byName[o.Kind+"/"+o.Name]
		if !ok {
			t.Errorf("deploy/k8s has %s/%s, the chart does not", o.Kind, o.Name)
			continue
		}
		var a, b any
		switch v := o.Obj.(type) {
		case *appsv1.StatefulSet:
			w := c.Obj.(*appsv1.StatefulSet)
			a, b = v.Spec.Template.Spec, w.Spec.Template.Spec
			if !reflect.DeepEqual(v.Spec.VolumeClaimTemplates, w.Spec.VolumeClaimTemplates) || !reflect.DeepEqual(v.Spec.Replicas, w.Spec.Replicas) ||
				v.Spec.PodManagementPolicy != w.Spec.PodManagementPolicy {
				t.Errorf("%s: replicas, policy or volume claims differ", o)
			}
		case *appsv1.Deployment:
			a, b = v.Spec.Template.Spec, c.Obj.(*appsv1.Deployment).Spec.Template.Spec
		default:
			a = reflect.ValueOf(o.Obj).Elem().FieldByName("Spec").Interface()
			b = reflect.ValueOf(c.Obj).Elem().FieldByName("Spec").Interface()
		}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: the chart's spec differs from deploy/k8s's:\nk8s:   %+v\nchart: %+v", o, a, b)
		}
		compared++
	}
	t.Logf("%d objects of deploy/k8s compared with the chart's", compared)
}

// TestChartVariablesAreFlags builds each kvdir binary the chart runs, in
// every variant, and checks that its --help names every KVDIR_ variable the
// chart sets on it (a variable that is no flag's would be ignored) and every
// flag its arguments give (an unknown flag stops the binary).
func TestChartVariablesAreFlags(t *testing.T) {
	h := helmOrSkip(t)
	ci, err := CIValues()
	if err != nil {
		t.Fatal(err)
	}
	help := map[string]string{}
	checked := 0
	for _, v := range append([]string{""}, ci...) {
		var values []string
		if v != "" {
			values = []string{v}
		}
		for _, cv := range k8s.KVDIRVars(render(t, h, values)) {
			if _, ok := help[cv.Binary]; !ok {
				bin := testkit.Binary(t, cv.Binary)
				out, err := exec.Command(bin, "--help").Output()
				if err != nil {
					t.Fatalf("%s --help: %v", cv.Binary, err)
				}
				help[cv.Binary] = string(out)
			}
			for _, name := range cv.Vars {
				if !strings.Contains(help[cv.Binary], "("+name+")") {
					t.Errorf("%v: %s: container %s sets %s, which %s --help does not list", values, cv.Obj, cv.Container, name, cv.Binary)
				}
				checked++
			}
			for _, name := range cv.Flags {
				if !strings.Contains(help[cv.Binary], "--"+name+" ") {
					t.Errorf("%v: %s: container %s gives --%s, which %s --help does not list", values, cv.Obj, cv.Container, name, cv.Binary)
				}
				checked++
			}
		}
	}
	t.Logf("%d variables and flags of %d binaries checked", checked, len(help))
}

// TestGatewayExample decodes the example Gateway (deploy/gateway) strictly
// and checks it with the chart rendered in endpoint-picker mode, both with
// the default parentRef (no listener named) and with ci/epp-values.yaml's
// (listener http): the route must attach. Then it makes the mistakes that
// would leave the route unattached, one at a time, and expects each to be
// reported.
func TestGatewayExample(t *testing.T) {
	h := helmOrSkip(t)
	data, err := os.ReadFile(GatewayExample())
	if err != nil {
		t.Fatal(err)
	}
	decode := func(t *testing.T, values []string, set ...string) []k8s.Object {
		t.Helper()
		gw, err := k8s.Decode(GatewayExample(), data)
		if err != nil {
			t.Fatal(err)
		}
		if len(gw) != 1 || gw[0].Kind != "Gateway" || gw[0].Name != "inference-gateway" {
			t.Fatalf("example: %v, want one Gateway inference-gateway", gw)
		}
		return append(render(t, h, values, set...), gw...)
	}
	t.Run("attaches", func(t *testing.T) {
		checkAllowing(t, decode(t, []string{"ci/epp-values.yaml"}), nil)
		objs := decode(t, nil, "router.mode=epp")
		checkAllowing(t, objs, nil)
		g := find[*k8s.Gateway](objs, "Gateway", "inference-gateway")
		if g.Spec.GatewayClassName != "istio" {
			t.Errorf("gatewayClassName %q, want istio", g.Spec.GatewayClassName)
		}
	})
	str := func(s string) *string { return &s }
	for _, tc := range []struct {
		name   string
		mutate func(r *k8s.HTTPRoute, g *k8s.Gateway)
		want   string
	}{
		{"no such listener", func(r *k8s.HTTPRoute, g *k8s.Gateway) { r.Spec.ParentRefs[0].SectionName = str("https") },
			`no listener "https"`},
		{"other port", func(r *k8s.HTTPRoute, g *k8s.Gateway) { p := int32(8080); r.Spec.ParentRefs[0].Port = &p },
			"listener http is on port 80, not 8080"},
		{"not HTTP", func(r *k8s.HTTPRoute, g *k8s.Gateway) { g.Spec.Listeners[0].Protocol = "TCP" },
			"listener http has protocol TCP, not HTTP or HTTPS"},
		{"other kinds", func(r *k8s.HTTPRoute, g *k8s.Gateway) { g.Spec.Listeners[0].AllowedRoutes.Kinds[0].Kind = "GRPCRoute" },
			"listener http does not admit kind HTTPRoute"},
		{"namespace selector", func(r *k8s.HTTPRoute, g *k8s.Gateway) { g.Spec.Listeners[0].AllowedRoutes.Namespaces.From = "Selector" },
			"listener http admits only namespaces its selector picks"},
		{"listener twice", func(r *k8s.HTTPRoute, g *k8s.Gateway) {
			g.Spec.Listeners = append(g.Spec.Listeners, g.Spec.Listeners[0])
		}, `listener name "http" twice`},
		{"no class", func(r *k8s.HTTPRoute, g *k8s.Gateway) { g.Spec.GatewayClassName = "" }, "no gatewayClassName"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := decode(t, []string{"ci/epp-values.yaml"})
			tc.mutate(find[*k8s.HTTPRoute](objs, "HTTPRoute", "vllm"), find[*k8s.Gateway](objs, "Gateway", "inference-gateway"))
			err := k8s.Check(objs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("k8s.Check: %v, want a finding saying %q", err, tc.want)
			}
		})
	}
}

// TestChartRefusesBadValues expects helm template to fail, saying why, on
// values that would deploy a broken directory or router.
func TestChartRefusesBadValues(t *testing.T) {
	h := helmOrSkip(t)
	for _, tc := range []struct{ set, want string }{
		{"directory.replicas=2", "directory.replicas must be odd"},
		{"router.mode=sidecar", `router.mode must be proxy or epp, not "sidecar"`},
		{"directory.podAntiAffinity=soft", "directory.podAntiAffinity must be required or preferred"},
		{"directory.groups=null", "directory.groups must list at least one group"},
		{"directory.groups[0].name=Main", `directory.groups[0].name "Main" must be a DNS label`},
		{"directory.groups[0]=x", "directory.groups[0] must be a mapping"},
		{"directory.groups[0].name=main,directory.groups[1].name=main", `group name "main" is used twice`},
		{"directory.groups[0].name=main,directory.groups[0].models={llama3-8b},directory.groups[1].name=large,directory.groups[1].replicas=4",
			"directory.replicas must be odd and at least 1 (a Raft quorum), not 4 (group large)"},
		{"directory.groups[0].name=main,directory.groups[1].name=large", "groups main and large both list no models"},
		{"directory.groups[0].name=main,directory.groups[0].models={llama3-8b},directory.groups[1].name=large,directory.groups[1].models={llama3-8b}",
			`model "llama3-8b" is in groups main and large`},
		{"directory.groups[0].name=main,directory.groups[0].models={llama3-70b}", `no directory group serves model "llama3-8b" (vllm.servedModelName)`},
	} {
		_, err := Template(h, nil, tc.set)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--set %s: %v, want an error saying %q", tc.set, err, tc.want)
		}
	}
}

// envOf returns a container's variables by name.
func envOf(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

// checkTwoGroups checks ci/two-groups-values.yaml's rendering: two Raft
// groups, each listing its own members only in its initial cluster and
// serving its model; routers given a --directory-group per group and no
// single --directory; the vLLM pods' agents (model llama3-70b) dialling
// group large. k8s.Check has checked the same generally; this pins the
// values' meaning.
func checkTwoGroups(t *testing.T, objs []k8s.Object) {
	t.Helper()
	members := func(set string, port int) string {
		var m []string
		for i := range 3 {
			m = append(m, fmt.Sprintf("%s-%d.%s-headless:%d", set, i, set, port))
		}
		return strings.Join(m, ",")
	}
	for _, g := range []struct{ set, model, size string }{
		{"kvdir-directory", "llama3-8b", "2Gi"}, {"kvdir-directory-large", "llama3-70b", "8Gi"},
	} {
		s := find[*appsv1.StatefulSet](objs, "StatefulSet", g.set)
		if s == nil {
			t.Fatalf("no StatefulSet %s", g.set)
		}
		env := envOf(s.Spec.Template.Spec.Containers[0])
		var cluster []string
		for i := range 3 {
			cluster = append(cluster, fmt.Sprintf("%s-%d=%s-%d.%s-headless:7000", g.set, i, g.set, i, g.set))
		}
		if got := env["KVDIR_DIRECTORY_INITIAL_CLUSTER"]; got != strings.Join(cluster, ",") {
			t.Errorf("%s: initial cluster %q, want its own members %q", g.set, got, strings.Join(cluster, ","))
		}
		if got := env["KVDIR_DIRECTORY_MODELS"]; got != g.model {
			t.Errorf("%s: KVDIR_DIRECTORY_MODELS %q, want %s", g.set, got, g.model)
		}
		if s.Spec.ServiceName != g.set+"-headless" || s.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != g.set {
			t.Errorf("%s: serviceName %s, selector %v: want its own headless Service and pods", g.set, s.Spec.ServiceName, s.Spec.Selector.MatchLabels)
		}
		if q := s.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage]; q.String() != g.size {
			t.Errorf("%s: volume %s, want %s", g.set, q.String(), g.size)
		}
	}
	r := find[*appsv1.Deployment](objs, "Deployment", "kvdir-router").Spec.Template.Spec.Containers[0]
	want := []string{"--directory-group", "main=" + members("kvdir-directory", 7001), "--directory-group", "large=" + members("kvdir-directory-large", 7001)}
	if !slices.Equal(r.Args, want) {
		t.Errorf("router args %q, want %q", r.Args, want)
	}
	if v, ok := envOf(r)["KVDIR_ROUTER_DIRECTORY"]; ok {
		t.Errorf("router has KVDIR_ROUTER_DIRECTORY=%s beside --directory-group", v)
	}
	a := find[*appsv1.Deployment](objs, "Deployment", "vllm").Spec.Template.Spec.InitContainers[0]
	if got := envOf(a)["KVDIR_AGENT_DIRECTORY"]; got != members("kvdir-directory-large", 7001) {
		t.Errorf("vLLM agents dial %q, want group large's members (model llama3-70b)", got)
	}
}

// TestChartGroupChecks renders ci/two-groups-values.yaml, makes the
// mistakes a two-group deployment can make one at a time, and expects
// k8s.Check to report each: a router leaving a group out, an agent dialling
// the group of another model, a list mixing the groups' members, a group
// whose initial cluster names the other's member.
func TestChartGroupChecks(t *testing.T) {
	h := helmOrSkip(t)
	router := func(objs []k8s.Object) *corev1.Container {
		return &find[*appsv1.Deployment](objs, "Deployment", "kvdir-router").Spec.Template.Spec.Containers[0]
	}
	setEnv := func(c *corev1.Container, name, value string) {
		for i := range c.Env {
			if c.Env[i].Name == name {
				c.Env[i].Value = value
				return
			}
		}
		c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
	}
	for _, tc := range []struct {
		name   string
		mutate func(objs []k8s.Object)
		want   string
	}{
		{"router leaves a group out", func(objs []k8s.Object) { r := router(objs); r.Args = r.Args[:2] },
			"no --directory-group names directory group kvdir-directory-large"},
		{"router with one list", func(objs []k8s.Object) {
			r := router(objs)
			r.Args = nil
			setEnv(r, "KVDIR_ROUTER_DIRECTORY", "kvdir-directory-0.kvdir-directory-headless:7001,kvdir-directory-1.kvdir-directory-headless:7001,kvdir-directory-2.kvdir-directory-headless:7001")
		}, "KVDIR_ROUTER_DIRECTORY names kvdir-directory only, of 2 directory groups"},
		{"agent in the other model's group", func(objs []k8s.Object) {
			a := &find[*appsv1.Deployment](objs, "Deployment", "vllm").Spec.Template.Spec.InitContainers[0]
			setEnv(a, "KVDIR_AGENT_DIRECTORY", "kvdir-directory-0.kvdir-directory-headless:7001,kvdir-directory-1.kvdir-directory-headless:7001,kvdir-directory-2.kvdir-directory-headless:7001")
		}, `which does not serve the agent's model "llama3-70b"`},
		{"mixed members", func(objs []k8s.Object) {
			r := router(objs)
			r.Args[3] = "large=kvdir-directory-large-0.kvdir-directory-large-headless:7001,kvdir-directory-1.kvdir-directory-headless:7001,kvdir-directory-large-2.kvdir-directory-large-headless:7001"
		}, "mixes members of kvdir-directory-large and kvdir-directory"},
		{"initial cluster across groups", func(objs []k8s.Object) {
			c := &find[*appsv1.StatefulSet](objs, "StatefulSet", "kvdir-directory-large").Spec.Template.Spec.Containers[0]
			setEnv(c, "KVDIR_DIRECTORY_INITIAL_CLUSTER", "kvdir-directory-0=kvdir-directory-0.kvdir-directory-headless:7000,kvdir-directory-large-1=kvdir-directory-large-1.kvdir-directory-large-headless:7000,kvdir-directory-large-2=kvdir-directory-large-2.kvdir-directory-large-headless:7000")
		}, "KVDIR_DIRECTORY_INITIAL_CLUSTER is"},
		{"model in two groups", func(objs []k8s.Object) {
			c := &find[*appsv1.StatefulSet](objs, "StatefulSet", "kvdir-directory").Spec.Template.Spec.Containers[0]
			setEnv(c, "KVDIR_DIRECTORY_MODELS", "llama3-8b,llama3-70b")
		}, "model llama3-70b is also served by kvdir-directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, h, []string{"ci/two-groups-values.yaml"})
			if err := k8s.Check(objs); err != nil {
				t.Fatalf("before the mistake: %v", err)
			}
			tc.mutate(objs)
			err := k8s.Check(objs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("k8s.Check: %v, want a finding saying %q", err, tc.want)
			}
		})
	}
}
