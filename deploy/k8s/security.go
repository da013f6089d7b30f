package k8s

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// AdminLabel is the label (with value "admin") that admits a kvdirctl pod
// to the directory's API port; agents' and routers' pods carry it with
// "agent" and "router".
const AdminLabel = "kvdir.io/directory-client"

// checkSecurity checks that the manifests are secure by default: the
// directory serves TLS with Raft over mutual TLS from a mounted Secret and
// requires role tokens; every agent and router dials it with the CA and a
// token from a Secret; no container is told to run insecurely; no KV-event
// socket is bound on a wildcard address; and a NetworkPolicy admits only
// the members to the Raft port and only members, agents, routers and admin
// pods to the API port.
func checkSecurity(objs []Object, ws []workload) []error {
	var errs []error
	bad := func(o Object, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", o, fmt.Sprintf(format, args...)))
	}
	for _, w := range ws {
		spec := &w.template.Spec
		for _, c := range containers(spec) {
			checkNoInsecure(w.obj, c, bad)
			checkKVEventBinds(w.obj, c, bad)
			if _, ok := env(c, "KVDIR_DIRECTORY_INITIAL_CLUSTER"); ok {
				for _, v := range []string{"KVDIR_DIRECTORY_TLS_CERT", "KVDIR_DIRECTORY_TLS_KEY", "KVDIR_DIRECTORY_TLS_CA"} {
					checkSecretFile(w.obj, spec, c, v, bad)
				}
				for _, role := range []string{"AGENT", "ROUTER", "ADMIN"} {
					if creds, ok := env(c, "KVDIR_DIRECTORY_AGENT_CREDENTIALS"); ok && role == "AGENT" {
						// Per-agent credentials instead of the one agent token.
						if _, ok := secretMount(spec, c, creds); !ok {
							bad(w.obj, "container %s: KVDIR_DIRECTORY_AGENT_CREDENTIALS %q is not in a mounted Secret", c.Name, creds)
						}
						continue
					}
					checkSecretToken(w.obj, spec, c, "KVDIR_DIRECTORY_"+role+"_TOKEN", bad)
				}
			}
			for _, bin := range []string{"AGENT", "ROUTER", "CTL"} {
				if _, ok := env(c, "KVDIR_"+bin+"_DIRECTORY"); !ok {
					continue
				}
				checkSecretFile(w.obj, spec, c, "KVDIR_"+bin+"_TLS_CA", bad)
				checkSecretToken(w.obj, spec, c, "KVDIR_"+bin+"_TOKEN", bad)
			}
		}
	}
	return append(errs, checkNetworkPolicies(objs, ws)...)
}

// checkNoInsecure refuses --insecure* flags and KVDIR_*_INSECURE* variables.
func checkNoInsecure(o Object, c *corev1.Container, bad func(Object, string, ...any)) {
	for _, a := range append(slices.Clone(c.Command), c.Args...) {
		if strings.HasPrefix(a, "--insecure") || strings.HasPrefix(a, "--tls-insecure") {
			bad(o, "container %s: %s: the reference manifests run nothing insecurely", c.Name, a)
		}
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "KVDIR_") && strings.Contains(e.Name, "INSECURE") {
			bad(o, "container %s: %s: the reference manifests run nothing insecurely", c.Name, e.Name)
		}
	}
}

// loopback reports whether host is a loopback address or name.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// kvEndpointPrivate reports whether a ZMQ endpoint stays in the pod: a
// unix socket, inproc, or tcp on loopback (not *, ::, 0.0.0.0 or an
// interface's address).
func kvEndpointPrivate(ep string) bool {
	if strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://") {
		return true
	}
	hostport, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return false
	}
	host, _, err := net.SplitHostPort(hostport)
	return err == nil && loopback(host)
}

// checkKVEventBinds refuses KV-event endpoints outside the pod's loopback:
// vLLM's --kv-events-config endpoints (its replay socket always binds, its
// PUB binds a wildcard), the agent's endpoint when it binds, enginesim's.
func checkKVEventBinds(o Object, c *corev1.Container, bad func(Object, string, ...any)) {
	if raw, ok := flagValue(append(slices.Clone(c.Command), c.Args...), "kv-events-config"); ok {
		var cfg kvEventsConfig
		if err := decodeKVEventsConfig(raw, &cfg); err == nil {
			for _, ep := range []string{cfg.Endpoint, cfg.ReplayEndpoint} {
				if ep != "" && !kvEndpointPrivate(ep) {
					bad(o, "container %s: KV-event endpoint %q is reachable from outside the pod: bind it on 127.0.0.1 (the events carry users' prompts)", c.Name, ep)
				}
			}
		}
	}
	if v, _ := env(c, "KVDIR_AGENT_KV_EVENTS_BIND"); v == "true" {
		if ep, _ := env(c, "KVDIR_AGENT_KV_EVENTS_ENDPOINT"); !kvEndpointPrivate(ep) {
			bad(o, "container %s: the agent binds KV-event endpoint %q outside loopback", c.Name, ep)
		}
	}
	for _, v := range []string{"KVDIR_ENGINESIM_KV_EVENTS_ENDPOINT", "KVDIR_ENGINESIM_KV_EVENTS_REPLAY_ENDPOINT"} {
		if ep, ok := env(c, v); ok && ep != "" && !kvEndpointPrivate(ep) {
			bad(o, "container %s: %s %q is reachable from outside the pod", c.Name, v, ep)
		}
	}
}

// secretMount returns the Secret mounted at the directory holding file, if any.
func secretMount(spec *corev1.PodSpec, c *corev1.Container, file string) (string, bool) {
	for _, m := range c.VolumeMounts {
		if !strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return v.Secret.SecretName, true
			}
		}
	}
	return "", false
}

// checkSecretFile wants variable v to name a file in a mounted Secret.
func checkSecretFile(o Object, spec *corev1.PodSpec, c *corev1.Container, v string, bad func(Object, string, ...any)) {
	file, ok := env(c, v)
	if !ok || file == "" {
		bad(o, "container %s: %s is not set: TLS is required", c.Name, v)
		return
	}
	if _, ok := secretMount(spec, c, file); !ok {
		bad(o, "container %s: %s %q is not in a mounted Secret", c.Name, v, file)
	}
}

// checkSecretToken wants the token variable v from a Secret (secretKeyRef),
// or v_FILE naming a file in a mounted Secret.
func checkSecretToken(o Object, spec *corev1.PodSpec, c *corev1.Container, v string, bad func(Object, string, ...any)) {
	for _, e := range c.Env {
		switch e.Name {
		case v:
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.Value != "" {
				bad(o, "container %s: %s must come from a Secret (valueFrom.secretKeyRef), not the manifest", c.Name, v)
			}
			return
		case v + "_FILE":
			if _, ok := secretMount(spec, c, e.Value); !ok {
				bad(o, "container %s: %s %q is not in a mounted Secret", c.Name, e.Name, e.Value)
			}
			return
		}
	}
	bad(o, "container %s: neither %s nor %s_FILE is set: tokens are required", c.Name, v, v)
}

// policyRules are the ingress rules of the NetworkPolicies that select w.
func policyRules(objs []Object, w workload) (rules []networkingv1.NetworkPolicyIngressRule, any bool) {
	for _, o := range objs {
		np, ok := o.Obj.(*networkingv1.NetworkPolicy)
		if !ok || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(w.template.Labels)) {
			continue
		}
		any = true
		rules = append(rules, np.Spec.Ingress...)
	}
	return rules, any
}

// rulePorts reports whether the rule admits the container port named name
// (number num); a rule without ports admits every port.
func rulePorts(r networkingv1.NetworkPolicyIngressRule, name string, num int32) bool {
	if len(r.Ports) == 0 {
		return true
	}
	for _, p := range r.Ports {
		if p.Port == nil || (p.Port.Type == intstr.String && p.Port.StrVal == name) || (p.Port.Type == intstr.Int && p.Port.IntVal == num) {
			return true
		}
	}
	return false
}

// peerPods returns the workloads a peer admits, or ok false if it admits
// more than pods of this namespace's workloads (an ipBlock, a namespace
// selector, an empty pod selector).
func peerPods(p networkingv1.NetworkPolicyPeer, ws []workload) (out []workload, ok bool) {
	if p.IPBlock != nil || p.NamespaceSelector != nil || p.PodSelector == nil {
		return nil, false
	}
	sel, err := metav1.LabelSelectorAsSelector(p.PodSelector)
	if err != nil || sel.Empty() {
		return nil, false
	}
	for _, w := range ws {
		if sel.Matches(labels.Set(w.template.Labels)) {
			out = append(out, w)
		}
	}
	return out, true
}

// isClient reports whether a workload dials the directory (an agent or a router).
func isClient(w workload) bool {
	for _, c := range containers(&w.template.Spec) {
		for _, v := range directoryClientVars {
			if _, ok := env(c, v); ok {
				return true
			}
		}
		if len(groupArgs(c)) > 0 {
			return true
		}
	}
	return false
}

// checkNetworkPolicies checks, for the directory StatefulSet, that
// NetworkPolicies select its pods and admit: to the Raft port only its own
// pods, and at least them; to the API port only its own pods, directory
// clients and admin-labelled pods, and every client workload.
func checkNetworkPolicies(objs []Object, ws []workload) []error {
	var errs []error
	for _, w := range ws {
		s, ok := w.obj.Obj.(*appsv1.StatefulSet)
		if !ok || directoryContainer(s) == nil {
			continue
		}
		c := directoryContainer(s)
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: %s", w.obj, fmt.Sprintf(format, args...)))
		}
		rules, any := policyRules(objs, w)
		if !any {
			bad("no NetworkPolicy with Ingress selects the directory's pods: anyone in the cluster reaches Raft and the API")
			continue
		}
		self := labels.Set(w.template.Labels)
		for _, port := range []struct {
			name    string
			num     int32
			allowed func(workload) bool
			must    func(workload) bool
		}{
			{"raft", containerPort(c, "raft"), func(x workload) bool { return x.obj == w.obj }, func(x workload) bool { return x.obj == w.obj }},
			{"api", containerPort(c, "api"), func(x workload) bool { return x.obj == w.obj || isClient(x) }, func(x workload) bool { return x.obj == w.obj || isClient(x) }},
		} {
			admitted := map[string]bool{}
			for _, r := range rules {
				if !rulePorts(r, port.name, port.num) {
					continue
				}
				if len(r.From) == 0 {
					bad("a NetworkPolicy rule admits everyone to the %s port", port.name)
					continue
				}
				for _, p := range r.From {
					pods, ok := peerPods(p, ws)
					if !ok {
						bad("a NetworkPolicy rule admits more than this namespace's pods to the %s port", port.name)
						continue
					}
					for _, x := range pods {
						if !port.allowed(x) {
							bad("a NetworkPolicy rule admits %s to the %s port", x.obj, port.name)
						}
						admitted[x.obj.String()] = true
					}
					if sel, _ := metav1.LabelSelectorAsSelector(p.PodSelector); port.name == "raft" && !sel.Matches(self) {
						bad("a NetworkPolicy rule admits pods other than the members to the raft port")
					}
				}
			}
			for _, x := range ws {
				if port.must(x) && !admitted[x.obj.String()] {
					bad("no NetworkPolicy rule admits %s to the %s port", x.obj, port.name)
				}
			}
		}
		if !adminAdmitted(rules, containerPort(c, "api")) {
			bad("no NetworkPolicy rule admits pods labelled %s=admin (kvdirctl) to the api port", AdminLabel)
		}
	}
	return errs
}

// adminAdmitted reports whether a pod with only the admin label reaches the API port.
func adminAdmitted(rules []networkingv1.NetworkPolicyIngressRule, apiPort int32) bool {
	for _, r := range rules {
		if !rulePorts(r, "api", apiPort) {
			continue
		}
		for _, p := range r.From {
			if p.PodSelector == nil || p.NamespaceSelector != nil || p.IPBlock != nil {
				continue
			}
			if sel, err := metav1.LabelSelectorAsSelector(p.PodSelector); err == nil && !sel.Empty() && sel.Matches(labels.Set{AdminLabel: "admin"}) {
				return true
			}
		}
	}
	return false
}

// decodeKVEventsConfig decodes vLLM's --kv-events-config strictly.
func decodeKVEventsConfig(raw string, cfg *kvEventsConfig) error {
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(cfg)
}
