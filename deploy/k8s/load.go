// Package k8s holds kvdir's Kubernetes manifests (plain YAML, assembled by
// kustomize: `kubectl apply -k deploy/k8s`) and the checks that keep them
// honest. Decode reads every document strictly into its Kubernetes API type,
// so a misspelt field or an unknown kind is an error, not a silently ignored
// key; Check cross-references the objects (Service selectors and ports, probe
// ports, StatefulSet membership and the directory addresses agents and
// routers dial, the vLLM flags the agent depends on).
package k8s

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Object is one decoded manifest document.
type Object struct {
	File  string // file it came from
	Index int    // document number in the file, from 0
	Kind  string // e.g. StatefulSet
	Name  string // metadata.name
	Obj   any    // *appsv1.StatefulSet, *corev1.Service, ...
}

// String names the object for messages: directory.yaml#3 StatefulSet/kvdir-directory.
func (o Object) String() string {
	return fmt.Sprintf("%s#%d %s/%s", filepath.Base(o.File), o.Index, o.Kind, o.Name)
}

// kinds maps "apiVersion/kind" to a new value of its Go type. A kind not
// listed is an error: add it here when a manifest needs it.
var kinds = map[string]func() any{
	"v1/Namespace":                           func() any { return &corev1.Namespace{} },
	"v1/Service":                             func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                      func() any { return &corev1.ServiceAccount{} },
	"v1/ConfigMap":                           func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                              func() any { return &corev1.Secret{} },
	"apps/v1/StatefulSet":                    func() any { return &appsv1.StatefulSet{} },
	"apps/v1/Deployment":                     func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":          func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler": func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"networking.k8s.io/v1/NetworkPolicy":     func() any { return &networkingv1.NetworkPolicy{} },
}

// typeMeta is what a document must say about itself.
type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// Documents splits a multi-document YAML stream at its "---" lines and
// drops documents that hold only comments or blank lines.
func Documents(data []byte) [][]byte {
	var out [][]byte
	for _, d := range docSeparator.Split(string(data), -1) {
		empty := true
		for _, line := range strings.Split(d, "\n") {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
				empty = false
				break
			}
		}
		if !empty {
			out = append(out, []byte(d))
		}
	}
	return out
}

// Decode decodes every document of one manifest file strictly into its
// Kubernetes API type: unknown or duplicate fields, an unknown
// apiVersion/kind and a missing name are errors. file names the source in
// messages.
func Decode(file string, data []byte) ([]Object, error) {
	var objs []Object
	var errs []error
	for i, doc := range Documents(data) {
		o, err := decodeOne(doc)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s#%d: %w", filepath.Base(file), i, err))
			continue
		}
		o.File, o.Index = file, i
		objs = append(objs, o)
	}
	return objs, errors.Join(errs...)
}

func decodeOne(doc []byte) (Object, error) {
	var tm typeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return Object{}, fmt.Errorf("not YAML: %w", err)
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		return Object{}, errors.New("apiVersion and kind are required")
	}
	newObj, ok := kinds[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return Object{}, fmt.Errorf("unknown apiVersion/kind %s %s (known: %s)", tm.APIVersion, tm.Kind, knownKinds())
	}
	obj := newObj()
	if err := strictUnmarshal(doc, obj); err != nil {
		return Object{}, fmt.Errorf("%s %s: %w", tm.Kind, tm.Metadata.Name, err)
	}
	if tm.Metadata.Name == "" {
		return Object{}, fmt.Errorf("%s without metadata.name", tm.Kind)
	}
	return Object{Kind: tm.Kind, Name: tm.Metadata.Name, Obj: obj}, nil
}

// strictUnmarshal decodes YAML into obj as the API server does in strict
// mode: duplicate keys, unknown fields (named by their path, e.g.
// "spec.replica") and keys whose case differs from the field's are errors.
func strictUnmarshal(doc []byte, obj any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	strict, err := kjson.UnmarshalStrict(j, obj)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	return errors.Join(strict...)
}

func knownKinds() string {
	var k []string
	for n := range kinds {
		k = append(k, n)
	}
	sort.Strings(k)
	return strings.Join(k, ", ")
}

// Kustomization is the part of kustomize's Kustomization type these
// manifests use; decoding it strictly catches a misspelt key, and a key
// kustomize knows but this type does not must be added here first.
type Kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	NamePrefix string `json:"namePrefix,omitempty"`
	Labels     []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors,omitempty"`
		IncludeTemplates bool              `json:"includeTemplates,omitempty"`
	} `json:"labels,omitempty"`
	Resources []string `json:"resources"`
	Images    []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// DecodeKustomization decodes a kustomization.yaml strictly.
func DecodeKustomization(data []byte) (*Kustomization, error) {
	var k Kustomization
	if err := strictUnmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("kustomization: %w", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		return nil, fmt.Errorf("kustomization: apiVersion/kind %s %s, want kustomize.config.k8s.io/v1beta1 Kustomization", k.APIVersion, k.Kind)
	}
	return &k, nil
}

// LoadDir reads dir's kustomization.yaml and decodes every resource it
// lists. It fails if a YAML file in dir is not listed, or a listed one is
// missing, so that no manifest escapes the checks or the deployment.
func LoadDir(dir string) (*Kustomization, []Object, error) {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, nil, fmt.Errorf("read kustomization: %w", err)
	}
	k, err := DecodeKustomization(data)
	if err != nil {
		return nil, nil, err
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, nil, fmt.Errorf("list manifests: %w", err)
	}
	listed := map[string]bool{}
	for _, r := range k.Resources {
		listed[r] = true
	}
	var errs []error
	for _, f := range files {
		base := filepath.Base(f)
		if base != "kustomization.yaml" && !listed[base] {
			errs = append(errs, fmt.Errorf("%s is not in kustomization.yaml's resources", base))
		}
	}
	var objs []Object
	for _, r := range k.Resources {
		b, err := os.ReadFile(filepath.Join(dir, r))
		if err != nil {
			errs = append(errs, fmt.Errorf("resource %s: %w", r, err))
			continue
		}
		o, err := Decode(filepath.Join(dir, r), b)
		if err != nil {
			errs = append(errs, err)
		}
		objs = append(objs, o...)
	}
	return k, objs, errors.Join(errs...)
}

// DecodeStream decodes a multi-document stream, e.g. `kubectl kustomize`'s
// output, strictly.
func DecodeStream(name string, data []byte) ([]Object, error) {
	return Decode(name, bytes.TrimSpace(data))
}
