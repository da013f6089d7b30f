package k8s

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// workload is a Deployment or StatefulSet seen through its pod template.
type workload struct {
	obj      Object
	selector *metav1.LabelSelector
	template *corev1.PodTemplateSpec
}

func workloads(objs []Object) []workload {
	var out []workload
	for _, o := range objs {
		switch v := o.Obj.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{o, v.Spec.Selector, &v.Spec.Template})
		case *appsv1.StatefulSet:
			out = append(out, workload{o, v.Spec.Selector, &v.Spec.Template})
		}
	}
	return out
}

// containers returns the pod's init (sidecar) and regular containers.
func containers(spec *corev1.PodSpec) []*corev1.Container {
	var out []*corev1.Container
	for i := range spec.InitContainers {
		out = append(out, &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		out = append(out, &spec.Containers[i])
	}
	return out
}

// Check cross-references decoded manifests and returns every problem found:
// workload selectors that miss their own template; Services, PDBs and HPAs
// that select or target nothing; Service target ports and probe ports that
// no container declares; $(VAR) references to variables not defined before
// them; each directory StatefulSet's Raft membership; the directory
// groups agents and routers dial (groups.go); the vLLM flags the agent relies on;
// that kvdir containers set only their own binary's KVDIR_<NAME>_ variables;
// and the endpoint-picker objects: InferencePools, HTTPRoutes and
// ServiceMonitors (gateway.go).
func Check(objs []Object) error {
	var errs []error
	add := func(o Object, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", o, fmt.Sprintf(format, args...)))
	}
	ws := workloads(objs)
	for _, w := range ws {
		sel, err := metav1.LabelSelectorAsSelector(w.selector)
		switch {
		case err != nil:
			add(w.obj, "selector: %v", err)
		case w.selector == nil || sel.Empty():
			add(w.obj, "empty selector")
		case !sel.Matches(labels.Set(w.template.Labels)):
			add(w.obj, "selector %s does not match the pod template's labels %v", sel, w.template.Labels)
		}
		for _, c := range containers(&w.template.Spec) {
			checkContainer(w.obj, c, add)
		}
	}
	for _, o := range objs {
		switch v := o.Obj.(type) {
		case *corev1.Service:
			checkService(o, v, ws, add)
		case *policyv1.PodDisruptionBudget:
			if n := len(selected(v.Spec.Selector, ws)); n == 0 {
				add(o, "selector matches no workload")
			}
		case *autoscalingv2.HorizontalPodAutoscaler:
			checkHPA(o, v, ws, add)
		case *appsv1.StatefulSet:
			checkStatefulSet(o, v, objs, add)
		}
	}
	errs = append(errs, checkDirectoryGroups(objs, ws)...)
	errs = append(errs, checkEngines(ws)...)
	errs = append(errs, checkTokenizeURLs(objs, ws)...)
	errs = append(errs, checkEnvNames(objs)...)
	errs = append(errs, checkSecurity(objs, ws)...)
	errs = append(errs, checkGateway(objs, ws)...)
	return errors.Join(errs...)
}

// BinaryEnv names, for each kvdir image (kvdir/<binary>), the NAME of its
// binary's variables KVDIR_<NAME>_<FLAG> (internal/cli).
var BinaryEnv = map[string]string{
	"directory": "DIRECTORY", "agent": "AGENT", "router": "ROUTER", "enginesim": "ENGINESIM", "kvdirctl": "CTL",
}

// KVDIRVars returns, for every container running a kvdir image, its binary,
// the KVDIR_ variables the manifests set on it and the flags its arguments
// give.
func KVDIRVars(objs []Object) []ContainerVars {
	var out []ContainerVars
	for _, w := range workloads(objs) {
		for _, c := range containers(&w.template.Spec) {
			_, bin, ok := kvdirImage(c.Image)
			if !ok {
				continue
			}
			cv := ContainerVars{Obj: w.obj, Container: c.Name, Binary: bin}
			for _, e := range c.Env {
				if strings.HasPrefix(e.Name, "KVDIR_") {
					cv.Vars = append(cv.Vars, e.Name)
				}
			}
			for _, a := range c.Args {
				if name, ok := strings.CutPrefix(a, "--"); ok && name != "" {
					name, _, _ = strings.Cut(name, "=")
					cv.Flags = append(cv.Flags, name)
				}
			}
			out = append(out, cv)
		}
	}
	return out
}

// kvdirImage splits a kvdir image, kvdir/<binary>[:tag], into its name
// without the tag and the binary; ok is false for any other image.
func kvdirImage(image string) (name, binary string, ok bool) {
	name, _, _ = strings.Cut(image, ":")
	binary, ok = strings.CutPrefix(name, "kvdir/")
	return name, binary, ok
}

// ContainerVars is one container's kvdir binary, KVDIR_ variables and
// command-line flags.
type ContainerVars struct {
	Obj       Object
	Container string
	Binary    string
	Vars      []string
	Flags     []string // names of the --flags in its arguments, without the dashes
}

// checkEnvNames checks that every KVDIR_ variable of a kvdir container is
// one of its own binary's (KVDIR_<NAME>_...): a variable of another scheme
// is ignored by the binary (the directory only warns about it).
func checkEnvNames(objs []Object) []error {
	var errs []error
	for _, cv := range KVDIRVars(objs) {
		name, ok := BinaryEnv[cv.Binary]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: container %s runs kvdir/%s, which has no environment scheme here", cv.Obj, cv.Container, cv.Binary))
			continue
		}
		prefix := "KVDIR_" + name + "_"
		for _, v := range cv.Vars {
			if !strings.HasPrefix(v, prefix) {
				errs = append(errs, fmt.Errorf("%s: container %s: %s is not read by %s, whose variables are %s<FLAG>", cv.Obj, cv.Container, v, cv.Binary, prefix))
			}
		}
	}
	return errs
}

// selected returns the workloads whose pod templates sel matches.
func selected(sel *metav1.LabelSelector, ws []workload) []workload {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || sel == nil || s.Empty() {
		return nil
	}
	var out []workload
	for _, w := range ws {
		if s.Matches(labels.Set(w.template.Labels)) {
			out = append(out, w)
		}
	}
	return out
}

// portDeclared reports whether port (a name or a number) is a container
// port of c.
func portDeclared(c *corev1.Container, port intstr.IntOrString) bool {
	for _, p := range c.Ports {
		if (port.Type == intstr.String && p.Name == port.StrVal) || (port.Type == intstr.Int && p.ContainerPort == port.IntVal) {
			return true
		}
	}
	return false
}

func podDeclares(spec *corev1.PodSpec, port intstr.IntOrString) bool {
	for _, c := range containers(spec) {
		if portDeclared(c, port) {
			return true
		}
	}
	return false
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func checkContainer(o Object, c *corev1.Container, add func(Object, string, ...any)) {
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
	}{{"readinessProbe", c.ReadinessProbe}, {"livenessProbe", c.LivenessProbe}, {"startupProbe", c.StartupProbe}} {
		if p.probe == nil {
			continue
		}
		var port *intstr.IntOrString
		switch {
		case p.probe.HTTPGet != nil:
			port = &p.probe.HTTPGet.Port
		case p.probe.TCPSocket != nil:
			port = &p.probe.TCPSocket.Port
		}
		if port != nil && !portDeclared(c, *port) {
			add(o, "container %s: %s port %s is not one of its ports", c.Name, p.what, port.String())
		}
	}
	// Kubernetes expands $(VAR) only for variables defined earlier in the
	// same container; anything else stays literal.
	defined := map[string]bool{}
	for _, e := range c.Env {
		for _, m := range varRef.FindAllStringSubmatch(e.Value, -1) {
			if !defined[m[1]] {
				add(o, "container %s: env %s uses $(%s), which is not defined before it", c.Name, e.Name, m[1])
			}
		}
		if defined[e.Name] {
			add(o, "container %s: env %s is set twice", c.Name, e.Name)
		}
		defined[e.Name] = true
	}
	names := map[string]bool{}
	for _, p := range c.Ports {
		if p.Name != "" && names[p.Name] {
			add(o, "container %s: port name %s is used twice", c.Name, p.Name)
		}
		names[p.Name] = true
	}
}

func checkService(o Object, s *corev1.Service, ws []workload, add func(Object, string, ...any)) {
	if len(s.Spec.Selector) == 0 {
		add(o, "no selector")
		return
	}
	sel := &metav1.LabelSelector{MatchLabels: s.Spec.Selector}
	matched := selected(sel, ws)
	if len(matched) == 0 {
		add(o, "selector %v matches no workload's pods", s.Spec.Selector)
		return
	}
	for _, p := range s.Spec.Ports {
		target := p.TargetPort
		if target.Type == intstr.Int && target.IntVal == 0 {
			target = intstr.FromInt32(p.Port)
		}
		for _, w := range matched {
			if !podDeclares(&w.template.Spec, target) {
				add(o, "port %s targets %s, which %s's pods do not declare", p.Name, target.String(), w.obj.Name)
			}
		}
	}
}

func checkHPA(o Object, h *autoscalingv2.HorizontalPodAutoscaler, ws []workload, add func(Object, string, ...any)) {
	var target *workload
	for i, w := range ws {
		if w.obj.Kind == h.Spec.ScaleTargetRef.Kind && w.obj.Name == h.Spec.ScaleTargetRef.Name {
			target = &ws[i]
		}
	}
	if target == nil {
		add(o, "scaleTargetRef %s/%s does not exist", h.Spec.ScaleTargetRef.Kind, h.Spec.ScaleTargetRef.Name)
		return
	}
	if h.Spec.MinReplicas != nil && *h.Spec.MinReplicas > h.Spec.MaxReplicas {
		add(o, "minReplicas %d > maxReplicas %d", *h.Spec.MinReplicas, h.Spec.MaxReplicas)
	}
	for _, m := range h.Spec.Metrics {
		if m.Type != autoscalingv2.ResourceMetricSourceType || m.Resource == nil || m.Resource.Target.Type != autoscalingv2.UtilizationMetricType {
			continue
		}
		// Utilization is a percentage of the request: without one the HPA
		// cannot compute it.
		for _, c := range target.template.Spec.Containers {
			if _, ok := c.Resources.Requests[m.Resource.Name]; !ok {
				add(o, "scales on %s utilization but container %s of %s requests no %s", m.Resource.Name, c.Name, target.obj.Name, m.Resource.Name)
			}
		}
	}
}

// env returns the value of a container's environment variable.
func env(c *corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// fieldRefVar returns the name of the variable set from fieldPath, if any.
func fieldRefVar(c *corev1.Container, fieldPath string) string {
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == fieldPath {
			return e.Name
		}
	}
	return ""
}

func containerPort(c *corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func portOf(hostport string) int32 {
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return -1
	}
	return int32(n)
}

// directoryContainer finds the StatefulSet container running the directory
// (the one configured with KVDIR_DIRECTORY_INITIAL_CLUSTER).
func directoryContainer(s *appsv1.StatefulSet) *corev1.Container {
	for _, c := range containers(&s.Spec.Template.Spec) {
		if _, ok := env(c, "KVDIR_DIRECTORY_INITIAL_CLUSTER"); ok {
			return c
		}
	}
	return nil
}

func checkStatefulSet(o Object, s *appsv1.StatefulSet, objs []Object, add func(Object, string, ...any)) {
	var svc *corev1.Service
	for _, x := range objs {
		if v, ok := x.Obj.(*corev1.Service); ok && x.Name == s.Spec.ServiceName {
			svc = v
		}
	}
	switch {
	case svc == nil:
		add(o, "serviceName %q: no such Service", s.Spec.ServiceName)
	case svc.Spec.ClusterIP != corev1.ClusterIPNone:
		add(o, "serviceName %q is not headless (clusterIP: None)", s.Spec.ServiceName)
	case !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(s.Spec.Template.Labels)):
		add(o, "headless Service %q does not select its pods", s.Spec.ServiceName)
	}
	c := directoryContainer(s)
	if c == nil {
		return
	}
	// A Raft group: pods must find each other before any is ready.
	if svc != nil && !svc.Spec.PublishNotReadyAddresses {
		add(o, "headless Service %q must publishNotReadyAddresses: members must resolve each other before a leader exists", svc.Name)
	}
	if s.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		add(o, "podManagementPolicy must be Parallel: pod 0 cannot become ready before the others start")
	}
	replicas := int32(1)
	if s.Spec.Replicas != nil {
		replicas = *s.Spec.Replicas
	}
	podName := fieldRefVar(c, "metadata.name")
	if podName == "" {
		add(o, "container %s: no variable from fieldRef metadata.name (the node id)", c.Name)
		return
	}
	raftPort, apiPort := containerPort(c, "raft"), containerPort(c, "api")
	want := map[string]string{
		"KVDIR_DIRECTORY_NODE_ID":        "$(" + podName + ")",
		"KVDIR_DIRECTORY_RAFT_ADVERTISE": fmt.Sprintf("$(%s).%s:%d", podName, s.Spec.ServiceName, raftPort),
		"KVDIR_DIRECTORY_API_ADVERTISE":  fmt.Sprintf("$(%s).%s:%d", podName, s.Spec.ServiceName, apiPort),
	}
	for k, v := range want {
		if got, _ := env(c, k); got != v {
			add(o, "container %s: %s is %q, want %q", c.Name, k, got, v)
		}
	}
	if got, _ := env(c, "KVDIR_DIRECTORY_RAFT_ADDR"); portOf(got) != raftPort {
		add(o, "container %s: KVDIR_DIRECTORY_RAFT_ADDR %q is not on the raft port %d", c.Name, got, raftPort)
	}
	if got, _ := env(c, "KVDIR_DIRECTORY_API_ADDR"); portOf(got) != apiPort {
		add(o, "container %s: KVDIR_DIRECTORY_API_ADDR %q is not on the api port %d", c.Name, got, apiPort)
	}
	if got, _ := env(c, "KVDIR_DIRECTORY_HTTP_ADDR"); portOf(got) != containerPort(c, "http") {
		add(o, "container %s: KVDIR_DIRECTORY_HTTP_ADDR %q is not on the http port %d", c.Name, got, containerPort(c, "http"))
	}
	var members []string
	for i := range replicas {
		pod := fmt.Sprintf("%s-%d", s.Name, i)
		members = append(members, fmt.Sprintf("%s=%s.%s:%d", pod, pod, s.Spec.ServiceName, raftPort))
	}
	if got, _ := env(c, "KVDIR_DIRECTORY_INITIAL_CLUSTER"); got != strings.Join(members, ",") {
		add(o, "container %s: KVDIR_DIRECTORY_INITIAL_CLUSTER is %q, want every replica: %q", c.Name, got, strings.Join(members, ","))
	}
	// Data on the claim template's volume.
	dataDir, _ := env(c, "KVDIR_DIRECTORY_DATA_DIR")
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, t := range s.Spec.VolumeClaimTemplates {
			if m.Name == t.Name && m.MountPath == dataDir {
				mounted = true
			}
		}
	}
	if !mounted {
		add(o, "container %s: KVDIR_DIRECTORY_DATA_DIR %q is not a volumeClaimTemplate's mount", c.Name, dataDir)
	}
	// Leadership hand-over fits in the grace period.
	if v, ok := env(c, "KVDIR_DIRECTORY_SHUTDOWN_TIMEOUT"); ok {
		d, err := time.ParseDuration(v)
		grace := s.Spec.Template.Spec.TerminationGracePeriodSeconds
		if err != nil || grace == nil || time.Duration(*grace)*time.Second <= d {
			add(o, "terminationGracePeriodSeconds must exceed KVDIR_DIRECTORY_SHUTDOWN_TIMEOUT %s", v)
		}
	}
	// One member per node.
	aff := s.Spec.Template.Spec.Affinity
	ok := false
	if aff != nil && aff.PodAntiAffinity != nil {
		for _, t := range aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			sel, err := metav1.LabelSelectorAsSelector(t.LabelSelector)
			if err == nil && t.TopologyKey == "kubernetes.io/hostname" && sel.Matches(labels.Set(s.Spec.Template.Labels)) {
				ok = true
			}
		}
	}
	if !ok {
		add(o, "no required pod anti-affinity on kubernetes.io/hostname against its own pods")
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		add(o, "container %s: readiness must be GET /readyz", c.Name)
	}
}

// kvEventsConfig is vLLM's KVEventsConfig (vllm/config/kv_events.py);
// decoding it strictly catches a misspelt key, which vLLM would reject.
type kvEventsConfig struct {
	EnableKVCacheEvents *bool  `json:"enable_kv_cache_events"`
	Publisher           string `json:"publisher"`
	Endpoint            string `json:"endpoint"`
	ReplayEndpoint      string `json:"replay_endpoint"`
	BufferSteps         int    `json:"buffer_steps"`
	HWM                 int    `json:"hwm"`
	MaxQueueSize        int    `json:"max_queue_size"`
	Topic               string `json:"topic"`
}

// flagValue returns the value of --name given as "--name=v" or "--name v".
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			return args[i+1], true
		}
		if a == "--"+name {
			return "", true
		}
	}
	return "", false
}

// endpointPort returns the port of a ZMQ tcp:// endpoint.
func endpointPort(ep string) (host string, port int32, err error) {
	u, err := url.Parse(ep)
	if err != nil || u.Scheme != "tcp" {
		return "", 0, fmt.Errorf("%q is not a tcp:// endpoint", ep)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		return "", 0, fmt.Errorf("%q has no port", ep)
	}
	return u.Hostname(), int32(p), nil
}

// checkEngines checks each pod that runs an engine publishing KV events
// (a container with --kv-events-config) next to a kvdir agent: the agent
// must subscribe to the engine's endpoints in the same pod, with the same
// topic, model name and block size, and the engine must hash blocks
// reproducibly.
func checkEngines(ws []workload) []error {
	var errs []error
	for _, w := range ws {
		var engine, agent *corev1.Container
		for _, c := range containers(&w.template.Spec) {
			if _, ok := flagValue(append(slices.Clone(c.Command), c.Args...), "kv-events-config"); ok {
				engine = c
			}
			if _, ok := env(c, "KVDIR_AGENT_KV_EVENTS_ENDPOINT"); ok {
				agent = c
			}
		}
		if engine == nil && agent == nil {
			continue
		}
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: %s", w.obj, fmt.Sprintf(format, args...)))
		}
		if engine == nil || agent == nil {
			bad("an engine publishing KV events and a kvdir agent must share the pod (engine %v, agent %v)", engine != nil, agent != nil)
			continue
		}
		args := append(slices.Clone(engine.Command), engine.Args...)
		raw, _ := flagValue(args, "kv-events-config")
		var cfg kvEventsConfig
		dec := json.NewDecoder(strings.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			bad("container %s: --kv-events-config: %v", engine.Name, err)
			continue
		}
		if cfg.EnableKVCacheEvents == nil || !*cfg.EnableKVCacheEvents {
			bad("container %s: --kv-events-config must set enable_kv_cache_events true", engine.Name)
		}
		if cfg.Publisher != "zmq" {
			bad("container %s: --kv-events-config publisher %q, want zmq (the default was null up to vLLM 0.10)", engine.Name, cfg.Publisher)
		}
		for _, pair := range []struct{ engineEP, agentVar string }{
			{cfg.Endpoint, "KVDIR_AGENT_KV_EVENTS_ENDPOINT"},
			{cfg.ReplayEndpoint, "KVDIR_AGENT_KV_EVENTS_REPLAY_ENDPOINT"},
		} {
			agentEP, _ := env(agent, pair.agentVar)
			_, ep, err1 := endpointPort(pair.engineEP)
			ah, ap, err2 := endpointPort(agentEP)
			switch {
			case err1 != nil || err2 != nil:
				bad("endpoints: engine %q, agent %s %q: %v", pair.engineEP, pair.agentVar, agentEP, errors.Join(err1, err2))
			case ep != ap:
				bad("agent %s %q is not the engine's port %d", pair.agentVar, agentEP, ep)
			case ah != "127.0.0.1" && ah != "localhost":
				bad("agent %s %q must dial the engine in its own pod (127.0.0.1)", pair.agentVar, agentEP)
			}
		}
		if topic, _ := env(agent, "KVDIR_AGENT_TOPIC"); topic != cfg.Topic {
			bad("agent topic %q, engine topic %q", topic, cfg.Topic)
		}
		model, _ := env(agent, "KVDIR_AGENT_MODEL")
		if served, _ := flagValue(args, "served-model-name"); served == "" || served != model {
			bad("agent KVDIR_AGENT_MODEL %q must be the engine's --served-model-name %q (it is the hashing namespace and the requests' model)", model, served)
		}
		if bs, _ := env(agent, "KVDIR_AGENT_BLOCK_SIZE"); bs != "" {
			if ebs, _ := flagValue(args, "block-size"); ebs != bs {
				bad("agent block size %s, engine --block-size %q", bs, ebs)
			}
		}
		if _, ok := flagValue(args, "enable-prefix-caching"); !ok {
			bad("container %s: --enable-prefix-caching is missing", engine.Name)
		}
		switch algo, _ := flagValue(args, "prefix-caching-hash-algo"); algo {
		case "sha256_cbor", "xxhash_cbor":
		default:
			bad("container %s: --prefix-caching-hash-algo %q: use sha256_cbor (reproducible outside Python)", engine.Name, algo)
		}
		if v, _ := env(engine, "PYTHONHASHSEED"); v == "" {
			bad("container %s: PYTHONHASHSEED must be set (it seeds the root of every block hash)", engine.Name)
		}
		addr, _ := env(agent, "KVDIR_AGENT_WORKER_ADDRESS")
		u, err := url.Parse(strings.ReplaceAll(addr, "$(", "x")) // $(POD_IP) is not a URL host yet
		if err != nil || u.Port() == "" {
			bad("agent KVDIR_AGENT_WORKER_ADDRESS %q is not an http URL with a port", addr)
		} else if p, _ := strconv.Atoi(u.Port()); !portDeclared(engine, intstr.FromInt(p)) {
			bad("agent KVDIR_AGENT_WORKER_ADDRESS %q: port %s is not the engine's", addr, u.Port())
		}
		if ip := fieldRefVar(agent, "status.podIP"); ip == "" || !strings.Contains(addr, "$("+ip+")") {
			bad("agent KVDIR_AGENT_WORKER_ADDRESS %q should be the pod IP (fieldRef status.podIP), which routers dial", addr)
		}
	}
	return errs
}

// checkTokenizeURLs checks that a router's remote tokenizer URL names a
// Service port that exists.
func checkTokenizeURLs(objs []Object, ws []workload) []error {
	var errs []error
	services := map[string]*corev1.Service{}
	for _, o := range objs {
		if s, ok := o.Obj.(*corev1.Service); ok {
			services[o.Name] = s
		}
	}
	for _, w := range ws {
		for _, c := range containers(&w.template.Spec) {
			raw, ok := env(c, "KVDIR_ROUTER_TOKENIZE_URL")
			if !ok {
				continue
			}
			u, err := url.Parse(raw)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: KVDIR_ROUTER_TOKENIZE_URL %q: %v", w.obj, raw, err))
				continue
			}
			s := services[u.Hostname()]
			if s == nil {
				errs = append(errs, fmt.Errorf("%s: KVDIR_ROUTER_TOKENIZE_URL %q: no Service %q", w.obj, raw, u.Hostname()))
				continue
			}
			p, _ := strconv.Atoi(u.Port())
			if !slices.ContainsFunc(s.Spec.Ports, func(sp corev1.ServicePort) bool { return int(sp.Port) == p }) {
				errs = append(errs, fmt.Errorf("%s: KVDIR_ROUTER_TOKENIZE_URL %q: Service %s has no port %d", w.obj, raw, s.Name, p))
			}
		}
	}
	return errs
}
