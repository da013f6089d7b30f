package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Modes of what Generate writes: keys and tokens are readable by their
// owner only (the directory warns about a token file others may read), the
// directory holding them is its owner's alone.
const (
	DirMode    fs.FileMode = 0o700
	SecretMode fs.FileMode = 0o600
	PublicMode fs.FileMode = 0o644
)

// ImageUser is the user (and group) kvdir's container images run as: the
// owner a root user gives the files, so that the compose containers can
// read them through their bind mounts.
const ImageUser = 65532

// Validity of the certificates Generate issues.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	nodeValidity = 825 * 24 * time.Hour
)

// Files Generate writes, relative to its output directory.
const (
	CACert           = "ca.crt"
	CAKey            = "ca.key"
	AgentToken       = "agent.token"
	RouterToken      = "router.token"
	AdminToken       = "admin.token"
	AgentCredentials = "agent-credentials"
	KubernetesYAML   = "kubernetes.yaml"
)

// Node is one directory member: its certificate is valid for its compose
// container name and for its Kubernetes StatefulSet pod, and for the names
// every member of its group answers to (the group's Service, loopback).
type Node struct {
	Compose string // container name, kvdir-dir1
	Pod     string // StatefulSet pod name, kvdir-directory-0
	Set     string // the group's StatefulSet and Service name, kvdir-directory
}

// Headless names the node's headless Service (its StatefulSet's serviceName).
func (n Node) Headless() string { return n.Set + "-headless" }

// CertFile and KeyFile name the node's certificate and key files.
func (n Node) CertFile() string { return n.Compose + ".crt" }

// KeyFile names the node's private key file.
func (n Node) KeyFile() string { return n.Compose + ".key" }

// Agent is one agent credential: the token in TokenFile lets its holder
// register only the worker ids Patterns match (path.Match globs).
type Agent struct {
	Name     string
	Patterns []string
}

// TokenFile names the agent's own token file.
func (a Agent) TokenFile() string { return "agent-" + a.Name + ".token" }

// The Kubernetes names the manifests in deploy/k8s refer to.
const (
	Namespace       = "kvdir"
	K8sStatefulSet  = "kvdir-directory"
	K8sHeadless     = "kvdir-directory-headless"
	K8sService      = "kvdir-directory"
	SecretDirectory = "kvdir-directory-secrets" // CA, members' certificates and keys, role tokens, agent credentials
	SecretAgent     = "kvdir-agent-secrets"     // CA and the agent token
	SecretRouter    = "kvdir-router-secrets"    // CA and the router token
	SecretAdmin     = "kvdir-admin-secrets"     // CA and the admin token, for kvdirctl
)

// LargeGroup is the StatefulSet of the second directory group the Helm
// chart's ci/two-groups-values.yaml deploys (group large); its compose
// counterpart is kvdir-dir4..6 (deploy/compose/groups.yml).
const LargeGroup = K8sStatefulSet + "-large"

// Nodes are the directory members of the compose cluster and of deploy/k8s
// (kvdir-dir1..3, the pods kvdir-directory-0..2), and of the second group of
// the compose cluster's groups.yml and the chart's two-group values
// (kvdir-dir4..6, the pods kvdir-directory-large-0..2).
var Nodes = []Node{
	{Compose: "kvdir-dir1", Pod: K8sStatefulSet + "-0", Set: K8sStatefulSet},
	{Compose: "kvdir-dir2", Pod: K8sStatefulSet + "-1", Set: K8sStatefulSet},
	{Compose: "kvdir-dir3", Pod: K8sStatefulSet + "-2", Set: K8sStatefulSet},
	{Compose: "kvdir-dir4", Pod: LargeGroup + "-0", Set: LargeGroup},
	{Compose: "kvdir-dir5", Pod: LargeGroup + "-1", Set: LargeGroup},
	{Compose: "kvdir-dir6", Pod: LargeGroup + "-2", Set: LargeGroup},
}

// Agents are the agent credentials: one per compose engine (its worker id
// is the engine's container name; engine5 is groups.yml's) and one for the vLLM pods of deploy/k8s
// (worker id = pod name, vllm-<replicaset hash>-<suffix>).
var Agents = []Agent{
	{Name: "engine1", Patterns: []string{"kvdir-engine1"}},
	{Name: "engine2", Patterns: []string{"kvdir-engine2"}},
	{Name: "engine3", Patterns: []string{"kvdir-engine3"}},
	{Name: "engine4", Patterns: []string{"kvdir-engine4"}},
	{Name: "engine5", Patterns: []string{"kvdir-engine5"}},
	{Name: "vllm", Patterns: []string{"vllm-*"}},
}

// DNSNames returns the names the node's certificate is valid for.
func (n Node) DNSNames() []string {
	names := []string{n.Compose, n.Pod}
	for _, suffix := range []string{"", "." + Namespace, "." + Namespace + ".svc", "." + Namespace + ".svc.cluster.local"} {
		names = append(names, n.Pod+"."+n.Headless()+suffix)
	}
	for _, suffix := range []string{"", "." + Namespace, "." + Namespace + ".svc", "." + Namespace + ".svc.cluster.local"} {
		names = append(names, n.Set+suffix)
	}
	return append(names, "localhost")
}

// Options says what to generate.
type Options struct {
	Dir   string // output directory
	Force bool   // replace existing files instead of keeping them
	// Owner, if set, is given the directory and every file (chown: needs
	// root), kept files included.
	Owner *Owner
	Now   time.Time
}

// Owner is a numeric user and group.
type Owner struct{ UID, GID int }

// Result lists what Generate wrote and what it kept.
type Result struct {
	Written, Kept []string
}

// Generate writes the CA, one certificate per directory member, the role
// tokens, one token per agent credential, the agent-credentials file and
// the Kubernetes Secrets holding them into o.Dir. A file that exists is
// kept unless o.Force, so running it again changes nothing and deleting
// one file regenerates only that file (and what is derived from it: the
// members' certificates when the CA is new, agent-credentials and
// kubernetes.yaml always).
func Generate(o Options) (Result, error) {
	var res Result
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if err := os.MkdirAll(o.Dir, DirMode); err != nil {
		return res, fmt.Errorf("create %s: %w", o.Dir, err)
	}
	if err := os.Chmod(o.Dir, DirMode); err != nil {
		return res, fmt.Errorf("chmod %s: %w", o.Dir, err)
	}
	g := &gen{dir: o.Dir, force: o.Force, res: &res}

	ca, caKey, fresh, err := g.ca(o.Now)
	if err != nil {
		return res, err
	}
	for _, n := range Nodes {
		if err := g.node(n, ca, caKey, fresh, o.Now); err != nil {
			return res, err
		}
	}
	tokens := map[string]string{}
	files := []string{AgentToken, RouterToken, AdminToken}
	for _, a := range Agents {
		files = append(files, a.TokenFile())
	}
	for _, f := range files {
		t, err := g.token(f)
		if err != nil {
			return res, err
		}
		tokens[f] = t
	}
	var creds bytes.Buffer
	for _, a := range Agents {
		fmt.Fprintf(&creds, "%s %s %s\n", a.Name, tokens[a.TokenFile()], strings.Join(a.Patterns, ","))
	}
	if err := g.update(AgentCredentials, creds.Bytes(), SecretMode); err != nil {
		return res, err
	}
	k8s, err := kubernetesSecrets(o.Dir)
	if err != nil {
		return res, err
	}
	if err := g.update(KubernetesYAML, k8s, SecretMode); err != nil {
		return res, err
	}
	if o.Owner != nil {
		if err := chownAll(o.Dir, o.Owner.UID, o.Owner.GID); err != nil {
			return res, err
		}
	}
	return res, nil
}

// chownAll gives dir and the files in it to uid:gid.
func chownAll(dir string, uid, gid int) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	paths := []string{dir}
	for _, e := range ents {
		paths = append(paths, filepath.Join(dir, e.Name()))
	}
	for _, p := range paths {
		if err := os.Lchown(p, uid, gid); err != nil {
			return fmt.Errorf("chown %s to %d:%d (only root may; give --owner none to keep the files yours): %w", p, uid, gid, err)
		}
	}
	return nil
}

type gen struct {
	dir   string
	force bool
	res   *Result
}

func (g *gen) path(name string) string { return filepath.Join(g.dir, name) }

// keep reports whether name exists and is to be kept.
func (g *gen) keep(names ...string) bool {
	if g.force {
		return false
	}
	for _, n := range names {
		if _, err := os.Stat(g.path(n)); err != nil {
			return false
		}
	}
	g.res.Kept = append(g.res.Kept, names...)
	return true
}

// update writes a derived file unless it already holds data.
func (g *gen) update(name string, data []byte, mode fs.FileMode) error {
	if old, err := os.ReadFile(g.path(name)); err == nil && bytes.Equal(old, data) {
		g.res.Kept = append(g.res.Kept, name)
		return nil
	}
	return g.write(name, data, mode)
}

// write replaces name atomically with data at mode.
func (g *gen) write(name string, data []byte, mode fs.FileMode) error {
	tmp, err := os.CreateTemp(g.dir, "."+name+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), g.path(name)); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	g.res.Written = append(g.res.Written, name)
	return nil
}

// ca loads the CA or creates it; fresh says it was created.
func (g *gen) ca(now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, bool, error) {
	if g.keep(CACert, CAKey) {
		cert, key, err := loadPair(g.path(CACert), g.path(CAKey))
		if err != nil {
			return nil, nil, false, fmt.Errorf("load the CA (delete %s and %s to make a new one): %w", CACert, CAKey, err)
		}
		return cert, key, false, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, false, fmt.Errorf("CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "kvdir directory CA", Organization: []string{"kvdir"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, false, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, false, fmt.Errorf("CA certificate: %w", err)
	}
	if err := g.writePair(CACert, CAKey, der, key); err != nil {
		return nil, nil, false, err
	}
	return cert, key, true, nil
}

// node issues the member's certificate unless it exists and the CA is not new.
func (g *gen) node(n Node, ca *x509.Certificate, caKey *ecdsa.PrivateKey, freshCA bool, now time.Time) error {
	if !freshCA && g.keep(n.CertFile(), n.KeyFile()) {
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("%s key: %w", n.Compose, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: n.Compose, Organization: []string{"kvdir"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(nodeValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// A member serves its certificate and dials the others with it.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    n.DNSNames(),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("%s certificate: %w", n.Compose, err)
	}
	return g.writePair(n.CertFile(), n.KeyFile(), der, key)
}

func (g *gen) writePair(certName, keyName string, der []byte, key *ecdsa.PrivateKey) error {
	kd, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("%s: %w", keyName, err)
	}
	if err := g.write(keyName, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd}), SecretMode); err != nil {
		return err
	}
	return g.write(certName, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), PublicMode)
}

// token returns the token in name, creating it (32 random bytes, hex) if needed.
func (g *gen) token(name string) (string, error) {
	if g.keep(name) {
		b, err := os.ReadFile(g.path(name))
		if err != nil {
			return "", fmt.Errorf("read %s: %w", name, err)
		}
		t := strings.TrimSpace(string(b))
		if t == "" || strings.ContainsAny(t, " \t\n") {
			return "", fmt.Errorf("%s: not one token (delete it to make a new one)", name)
		}
		return t, nil
	}
	t, err := NewToken()
	if err != nil {
		return "", err
	}
	return t, g.write(name, []byte(t+"\n"), SecretMode)
}

// NewToken returns 32 random bytes in hex.
func NewToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		// crypto/rand does not fail on supported platforms.
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func loadPair(certFile, keyFile string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, err := os.ReadFile(certFile)
	if err != nil {
		return nil, nil, err
	}
	kb, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, err
	}
	cblk, _ := pem.Decode(cb)
	kblk, _ := pem.Decode(kb)
	if cblk == nil || kblk == nil {
		return nil, nil, errors.New("no PEM block")
	}
	cert, err := x509.ParseCertificate(cblk.Bytes)
	if err != nil {
		return nil, nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(kblk.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, fmt.Errorf("%s: not an ECDSA key", keyFile)
	}
	return cert, key, nil
}

// secretManifest is the subset of a v1 Secret kubernetes.yaml writes.
type secretManifest struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   secretMeta        `json:"metadata"`
	Type       string            `json:"type"`
	Data       map[string]string `json:"data"`
}

type secretMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Labels    map[string]string `json:"labels"`
}

// kubernetesSecrets renders the Secrets deploy/k8s mounts from the files in dir:
// each workload gets only what it needs.
func kubernetesSecrets(dir string) ([]byte, error) {
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("kubernetes.yaml: %w", err)
		}
		return base64.StdEncoding.EncodeToString(b), nil
	}
	type item struct{ key, file string }
	dirItems := []item{{"ca.crt", CACert}, {"agent.token", AgentToken}, {"router.token", RouterToken},
		{"admin.token", AdminToken}, {"agent-credentials", AgentCredentials}}
	for _, n := range Nodes {
		// Keyed by pod name: each pod picks its own with $(POD_NAME).
		dirItems = append(dirItems, item{n.Pod + ".crt", n.CertFile()}, item{n.Pod + ".key", n.KeyFile()})
	}
	specs := []struct {
		name  string
		items []item
	}{
		{SecretDirectory, dirItems},
		{SecretAgent, []item{{"ca.crt", CACert}, {"token", AgentToken}, {"vllm.token", Agent{Name: "vllm"}.TokenFile()}}},
		{SecretRouter, []item{{"ca.crt", CACert}, {"token", RouterToken}}},
		{SecretAdmin, []item{{"ca.crt", CACert}, {"token", AdminToken}}},
	}
	var out bytes.Buffer
	out.WriteString("# Generated by deploy/gensecrets (make deploy-secrets) from the files beside it: do not edit.\n" +
		"# kubectl apply -f kubernetes.yaml (after kubectl apply -k deploy/k8s has created the namespace).\n")
	for _, s := range specs {
		m := secretManifest{APIVersion: "v1", Kind: "Secret", Type: "Opaque", Data: map[string]string{},
			Metadata: secretMeta{Name: s.name, Namespace: Namespace, Labels: map[string]string{"app.kubernetes.io/part-of": "kvdir"}}}
		sort.Slice(s.items, func(i, j int) bool { return s.items[i].key < s.items[j].key })
		for _, it := range s.items {
			v, err := read(it.file)
			if err != nil {
				return nil, err
			}
			m.Data[it.key] = v
		}
		b, err := yaml.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("kubernetes.yaml: %w", err)
		}
		out.WriteString("---\n")
		out.Write(b)
	}
	return out.Bytes(), nil
}
