// Package kubeapi runs a real Kubernetes API server (kube-apiserver over
// etcd, both built by make test-apiserver from deploy/tools/kubeapi) on
// loopback and applies manifests to it with server-side apply, so that
// kvdir's Kubernetes manifests and Helm chart are proven against the API's
// own validation, not only against the Go types. It speaks plain HTTPS
// (discovery, PATCH with application/apply-patch+yaml), with no client
// library. The CustomResourceDefinitions it loads are the upstream ones,
// read from the module cache (ModuleDir).
package kubeapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// FieldManager is the field manager of every apply.
const FieldManager = "kvdir-test"

// Client talks to one API server.
type Client struct {
	base string
	http *http.Client

	mu        sync.Mutex
	resources map[string]resource // "apiVersion/kind" -> resource
}

type resource struct {
	name       string // plural, e.g. statefulsets
	namespaced bool
}

// NewClient returns a client for the API server at base (https://host:port)
// that authenticates with cert and trusts only roots.
func NewClient(base string, tlsConfig *tls.Config) *Client {
	return &Client{base: strings.TrimRight(base, "/"), http: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: tlsConfig},
	}}
}

// StatusError is a request the API server refused: its HTTP status and its
// metav1.Status reason and message.
type StatusError struct {
	Code    int
	Reason  string
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("API server: %d %s: %s", e.Code, e.Reason, e.Message)
}

func (c *Client) do(ctx context.Context, method, path, contentType string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: read: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var st metav1.Status
		if json.Unmarshal(b, &st) == nil && st.Kind == "Status" {
			return nil, &StatusError{Code: resp.StatusCode, Reason: string(st.Reason), Message: st.Message}
		}
		return nil, &StatusError{Code: resp.StatusCode, Message: strings.TrimSpace(string(b))}
	}
	return b, nil
}

// Ready reports whether the server's /readyz answers ok, and what it said.
func (c *Client) Ready(ctx context.Context) (bool, string) {
	b, err := c.do(ctx, http.MethodGet, "/readyz", "", nil)
	if err != nil {
		return false, err.Error()
	}
	return strings.TrimSpace(string(b)) == "ok", string(b)
}

// Version returns the server's gitVersion.
func (c *Client) Version(ctx context.Context) (string, error) {
	b, err := c.do(ctx, http.MethodGet, "/version", "", nil)
	if err != nil {
		return "", err
	}
	var v struct {
		GitVersion string `json:"gitVersion"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return "", fmt.Errorf("version: %w", err)
	}
	return v.GitVersion, nil
}

// typeMeta is what every manifest says about itself.
type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

// groupVersionPath is the discovery path of an apiVersion.
func groupVersionPath(apiVersion string) string {
	if !strings.Contains(apiVersion, "/") {
		return "/api/" + apiVersion
	}
	return "/apis/" + apiVersion
}

// lookup finds the resource serving apiVersion/kind by discovery (cached;
// a miss asks again, as after a CRD is established).
func (c *Client) lookup(ctx context.Context, apiVersion, kind string) (resource, error) {
	key := apiVersion + "/" + kind
	c.mu.Lock()
	r, ok := c.resources[key]
	c.mu.Unlock()
	if ok {
		return r, nil
	}
	b, err := c.do(ctx, http.MethodGet, groupVersionPath(apiVersion), "", nil)
	if err != nil {
		return resource{}, fmt.Errorf("discover %s: %w", apiVersion, err)
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(b, &list); err != nil {
		return resource{}, fmt.Errorf("discover %s: %w", apiVersion, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.resources == nil {
		c.resources = map[string]resource{}
	}
	for _, res := range list.APIResources {
		if !strings.Contains(res.Name, "/") { // not a subresource
			c.resources[apiVersion+"/"+res.Kind] = resource{name: res.Name, namespaced: res.Namespaced}
		}
	}
	r, ok = c.resources[key]
	if !ok {
		return resource{}, fmt.Errorf("the API server serves no %s in %s", kind, apiVersion)
	}
	return r, nil
}

// Apply server-side applies one YAML document (forcing conflicts, with
// strict field validation: an unknown or duplicate field is refused) in
// namespace ns unless the document names its own; it returns the object
// the server stored, as JSON.
func (c *Client) Apply(ctx context.Context, ns string, doc []byte) ([]byte, error) {
	var tm typeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, fmt.Errorf("apply: not YAML: %w", err)
	}
	if tm.APIVersion == "" || tm.Kind == "" || tm.Metadata.Name == "" {
		return nil, errors.New("apply: apiVersion, kind and metadata.name are required")
	}
	r, err := c.lookup(ctx, tm.APIVersion, tm.Kind)
	if err != nil {
		return nil, fmt.Errorf("apply %s/%s: %w", tm.Kind, tm.Metadata.Name, err)
	}
	path := groupVersionPath(tm.APIVersion)
	if r.namespaced {
		if tm.Metadata.Namespace != "" {
			ns = tm.Metadata.Namespace
		}
		path += "/namespaces/" + url.PathEscape(ns)
	}
	path += "/" + r.name + "/" + url.PathEscape(tm.Metadata.Name) +
		"?fieldManager=" + FieldManager + "&fieldValidation=Strict&force=true"
	b, err := c.do(ctx, http.MethodPatch, path, "application/apply-patch+yaml", doc)
	if err != nil {
		return nil, fmt.Errorf("apply %s/%s: %w", tm.Kind, tm.Metadata.Name, err)
	}
	return b, nil
}

// Get reads an object as JSON; path is relative to the server, e.g.
// /apis/apiextensions.k8s.io/v1/customresourcedefinitions/x.
func (c *Client) Get(ctx context.Context, path string) ([]byte, error) {
	return c.do(ctx, http.MethodGet, path, "", nil)
}

// Established reports whether the CustomResourceDefinition name is
// established (its resources served), and what its conditions say.
func (c *Client) Established(ctx context.Context, name string) (bool, string) {
	b, err := c.Get(ctx, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"+name)
	if err != nil {
		return false, err.Error()
	}
	var crd struct {
		Status struct {
			Conditions []struct {
				Type, Status, Message string
			} `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(b, &crd); err != nil {
		return false, err.Error()
	}
	for _, cond := range crd.Status.Conditions {
		if cond.Type == "Established" && cond.Status == "True" {
			return true, ""
		}
	}
	return false, fmt.Sprintf("conditions %+v", crd.Status.Conditions)
}

// ModuleDir returns the module-cache folder of module at the version that
// the go.mod in modDir requires, and that version, downloading the module
// from the module proxy first if it is not in the cache (go mod download,
// which checks the zip against modDir's go.sum).
func ModuleDir(ctx context.Context, modDir, module string) (dir, version string, err error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module)
	cmd.Dir = modDir
	// modDir's own go.mod decides, whatever workspace is around it.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	var m struct {
		Version, Dir, Error string
	}
	if err := json.Unmarshal(out, &m); err != nil {
		return "", "", fmt.Errorf("go mod download %s in %s: %v: %w\n%s", module, modDir, runErr, err, stderr.Bytes())
	}
	if m.Error != "" || runErr != nil || m.Dir == "" {
		return "", "", fmt.Errorf("go mod download %s in %s: %v: %s\n%s", module, modDir, runErr, m.Error, stderr.Bytes())
	}
	return m.Dir, m.Version, nil
}
