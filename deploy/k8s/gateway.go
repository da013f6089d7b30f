package k8s

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The kinds below are not in k8s.io/api: they come with CRDs (the Gateway
// API Inference Extension, Gateway API, the Prometheus Operator). Each type
// holds the fields the Helm chart (deploy/helm/kvdir) renders and the gateway
// example (deploy/gateway) uses, so that
// strict decoding catches a misspelt one; a field a manifest needs that is
// missing here must be added first, as the CRD names it.

// InferencePool is an inference.networking.k8s.io/v1 InferencePool: the
// pods a gateway balances over with an endpoint picker's help.
type InferencePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              InferencePoolSpec `json:"spec"`
}

// InferencePoolSpec is the pool's pods, their port and its endpoint picker.
type InferencePoolSpec struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	TargetPorts       []PoolPort        `json:"targetPorts"`
	EndpointPickerRef EndpointPickerRef `json:"endpointPickerRef"`
}

// PoolPort is a port number.
type PoolPort struct {
	Number int32 `json:"number"`
}

// EndpointPickerRef names the endpoint picker's Service and port.
type EndpointPickerRef struct {
	Group       *string   `json:"group,omitempty"`
	Kind        string    `json:"kind,omitempty"`
	Name        string    `json:"name"`
	Port        *PoolPort `json:"port,omitempty"`
	FailureMode string    `json:"failureMode,omitempty"`
}

// HTTPRoute is a gateway.networking.k8s.io/v1 HTTPRoute.
type HTTPRoute struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ParentRefs []struct {
			Group       *string `json:"group,omitempty"`
			Kind        *string `json:"kind,omitempty"`
			Namespace   *string `json:"namespace,omitempty"`
			Name        string  `json:"name"`
			SectionName *string `json:"sectionName,omitempty"`
			Port        *int32  `json:"port,omitempty"`
		} `json:"parentRefs"`
		Hostnames []string        `json:"hostnames,omitempty"`
		Rules     []HTTPRouteRule `json:"rules"`
	} `json:"spec"`
}

// HTTPRouteRule is one rule: matches, backends and timeouts.
type HTTPRouteRule struct {
	Matches []struct {
		Path *struct {
			Type  string `json:"type"`
			Value string `json:"value"`
		} `json:"path,omitempty"`
	} `json:"matches,omitempty"`
	BackendRefs []struct {
		Group     *string `json:"group,omitempty"`
		Kind      *string `json:"kind,omitempty"`
		Name      string  `json:"name"`
		Namespace *string `json:"namespace,omitempty"`
		Port      *int32  `json:"port,omitempty"`
		Weight    *int32  `json:"weight,omitempty"`
	} `json:"backendRefs"`
	Timeouts *struct {
		Request        string `json:"request,omitempty"`
		BackendRequest string `json:"backendRequest,omitempty"`
	} `json:"timeouts,omitempty"`
}

// Gateway is a gateway.networking.k8s.io/v1 Gateway: the listeners an
// HTTPRoute attaches to, served by the implementation its class names.
type Gateway struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		GatewayClassName string     `json:"gatewayClassName"`
		Listeners        []Listener `json:"listeners"`
	} `json:"spec"`
}

// Listener is one of a Gateway's listeners.
type Listener struct {
	Name          string  `json:"name"`
	Hostname      *string `json:"hostname,omitempty"`
	Port          int32   `json:"port"`
	Protocol      string  `json:"protocol"`
	AllowedRoutes *struct {
		Namespaces *struct {
			From     string                `json:"from,omitempty"`
			Selector *metav1.LabelSelector `json:"selector,omitempty"`
		} `json:"namespaces,omitempty"`
		Kinds []struct {
			Group *string `json:"group,omitempty"`
			Kind  string  `json:"kind"`
		} `json:"kinds,omitempty"`
	} `json:"allowedRoutes,omitempty"`
}

// allowsHTTPRoute reports whether an HTTPRoute in the Gateway's own
// namespace may attach to l, and if not, why.
func (l Listener) allowsHTTPRoute() (bool, string) {
	if l.Protocol != "HTTP" && l.Protocol != "HTTPS" {
		return false, fmt.Sprintf("listener %s has protocol %s, not HTTP or HTTPS", l.Name, l.Protocol)
	}
	a := l.AllowedRoutes
	if a == nil {
		return true, ""
	}
	if a.Namespaces != nil && a.Namespaces.From == "Selector" {
		return false, fmt.Sprintf("listener %s admits only namespaces its selector picks", l.Name)
	}
	if len(a.Kinds) == 0 {
		return true, ""
	}
	for _, k := range a.Kinds {
		if k.Kind == "HTTPRoute" && (k.Group == nil || *k.Group == "gateway.networking.k8s.io") {
			return true, ""
		}
	}
	return false, fmt.Sprintf("listener %s does not admit kind HTTPRoute", l.Name)
}

// ServiceMonitor is a monitoring.coreos.com/v1 ServiceMonitor.
type ServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

func init() {
	kinds["inference.networking.k8s.io/v1/InferencePool"] = func() any { return &InferencePool{} }
	kinds["gateway.networking.k8s.io/v1/HTTPRoute"] = func() any { return &HTTPRoute{} }
	kinds["gateway.networking.k8s.io/v1/Gateway"] = func() any { return &Gateway{} }
	kinds["monitoring.coreos.com/v1/ServiceMonitor"] = func() any { return &ServiceMonitor{} }
}

// checkGateway cross-references the endpoint-picker objects: a pool selects
// pods that declare its target port; its endpoint picker is a Service whose
// pods run the router with --mode epp and declare the picker's port; an
// HTTPRoute's InferencePool backends exist, and when its parent Gateway is
// among objs, the listener it names (by sectionName and port) exists and
// admits it; a Gateway's listeners have distinct names; and a
// ServiceMonitor selects Services that have the ports it scrapes.
func checkGateway(objs []Object, ws []workload) []error {
	var errs []error
	bad := func(o Object, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", o, fmt.Sprintf(format, args...)))
	}
	services := map[string]*corev1.Service{}
	pools := map[string]bool{}
	gateways := map[string]*Gateway{}
	for _, o := range objs {
		switch v := o.Obj.(type) {
		case *corev1.Service:
			services[o.Name] = v
		case *InferencePool:
			pools[o.Name] = true
		case *Gateway:
			gateways[o.Name] = v
		}
	}
	for _, o := range objs {
		switch v := o.Obj.(type) {
		case *InferencePool:
			checkPool(o, v, services, ws, bad)
		case *HTTPRoute:
			if len(v.Spec.ParentRefs) == 0 {
				bad(o, "no parentRefs: the route attaches to no gateway")
			}
			for _, p := range v.Spec.ParentRefs {
				isGateway := (p.Kind == nil || *p.Kind == "Gateway") && (p.Group == nil || *p.Group == "gateway.networking.k8s.io")
				if g := gateways[p.Name]; isGateway && p.Namespace == nil && g != nil {
					if why := attaches(g, p.SectionName, p.Port); why != "" {
						bad(o, "parentRef Gateway %s: %s", p.Name, why)
					}
				}
			}
			for _, r := range v.Spec.Rules {
				for _, b := range r.BackendRefs {
					if b.Kind != nil && *b.Kind == "InferencePool" {
						if b.Group == nil || *b.Group != "inference.networking.k8s.io" {
							bad(o, "backendRef %s: an InferencePool's group is inference.networking.k8s.io", b.Name)
						}
						if !pools[b.Name] {
							bad(o, "backendRef InferencePool %q does not exist", b.Name)
						}
					}
				}
			}
		case *Gateway:
			if v.Spec.GatewayClassName == "" {
				bad(o, "no gatewayClassName")
			}
			names := map[string]bool{}
			for _, l := range v.Spec.Listeners {
				if names[l.Name] {
					bad(o, "listener name %q twice", l.Name)
				}
				names[l.Name] = true
			}
		case *ServiceMonitor:
			sel, err := metav1.LabelSelectorAsSelector(&v.Spec.Selector)
			if err != nil || sel.Empty() {
				bad(o, "selector %v: %v", v.Spec.Selector, err)
				continue
			}
			ports := map[string]bool{}
			n := 0
			for _, s := range services {
				if sel.Matches(labels.Set(s.Labels)) {
					n++
					for _, p := range s.Spec.Ports {
						ports[p.Name] = true
					}
				}
			}
			if n == 0 {
				bad(o, "selector %s matches no Service", sel)
			}
			for _, e := range v.Spec.Endpoints {
				if !ports[e.Port] {
					bad(o, "endpoint port %q is no selected Service's port", e.Port)
				}
			}
		}
	}
	return errs
}

// attaches says why a route's parentRef to g with sectionName and port does
// not attach to any of g's listeners, or "" when it attaches to one.
func attaches(g *Gateway, sectionName *string, port *int32) string {
	var whys []string
	for _, l := range g.Spec.Listeners {
		if sectionName != nil && l.Name != *sectionName {
			continue
		}
		if port != nil && l.Port != *port {
			whys = append(whys, fmt.Sprintf("listener %s is on port %d, not %d", l.Name, l.Port, *port))
			continue
		}
		ok, why := l.allowsHTTPRoute()
		if ok {
			return ""
		}
		whys = append(whys, why)
	}
	if len(whys) == 0 {
		if sectionName != nil {
			return fmt.Sprintf("no listener %q", *sectionName)
		}
		return "no listeners"
	}
	return strings.Join(whys, "; ")
}

func checkPool(o Object, p *InferencePool, services map[string]*corev1.Service, ws []workload, bad func(Object, string, ...any)) {
	if len(p.Spec.TargetPorts) != 1 {
		bad(o, "targetPorts must hold exactly one port")
	}
	if len(p.Spec.Selector.MatchLabels) == 0 {
		bad(o, "empty selector")
	}
	// A selector that matches none of these workloads may select engines
	// deployed apart from them; the ones it matches must serve the port.
	members := selected(&metav1.LabelSelector{MatchLabels: p.Spec.Selector.MatchLabels}, ws)
	for _, w := range members {
		for _, tp := range p.Spec.TargetPorts {
			if !podDeclares(&w.template.Spec, intstr.FromInt32(tp.Number)) {
				bad(o, "target port %d is not declared by %s's pods", tp.Number, w.obj.Name)
			}
		}
	}
	ref := p.Spec.EndpointPickerRef
	if ref.Kind != "" && ref.Kind != "Service" {
		return
	}
	if ref.Port == nil {
		bad(o, "endpointPickerRef %s: a Service reference needs port.number", ref.Name)
		return
	}
	switch ref.FailureMode {
	case "", "FailOpen", "FailClose":
	default:
		bad(o, "endpointPickerRef failureMode %q: FailOpen or FailClose", ref.FailureMode)
	}
	svc := services[ref.Name]
	if svc == nil {
		bad(o, "endpointPickerRef: no Service %q", ref.Name)
		return
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Port == ref.Port.Number {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		bad(o, "endpointPickerRef: Service %s has no port %d", ref.Name, ref.Port.Number)
		return
	}
	pickers := selected(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, ws)
	if len(pickers) == 0 {
		bad(o, "endpointPickerRef: Service %s selects no workload", ref.Name)
	}
	for _, w := range pickers {
		epp := false
		for _, c := range containers(&w.template.Spec) {
			if _, bin, ok := kvdirImage(c.Image); ok && bin == "router" && isEPP(c) {
				epp = true
			}
		}
		if !epp {
			bad(o, "endpointPickerRef: %s runs no router with --mode epp", w.obj.Name)
		}
		if !podDeclares(&w.template.Spec, sp.TargetPort) {
			bad(o, "endpointPickerRef: Service %s port %d targets %s, which %s's pods do not declare", ref.Name, ref.Port.Number, sp.TargetPort.String(), w.obj.Name)
		}
	}
}

// isEPP reports whether a router container runs in endpoint-picker mode.
func isEPP(c *corev1.Container) bool {
	args := append(slices.Clone(c.Command), c.Args...)
	if v, ok := flagValue(args, "mode"); ok {
		return v == "epp"
	}
	v, _ := env(c, "KVDIR_ROUTER_MODE")
	return v == "epp"
}
