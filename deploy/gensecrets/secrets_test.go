package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvdir/kvdir/deploy/helm"
	"github.com/kvdir/kvdir/deploy/k8s"
	"github.com/kvdir/kvdir/internal/testkit"
)

func generate(t *testing.T, dir string, force bool) Result {
	t.Helper()
	res, err := Generate(Options{Dir: dir, Force: force})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func readFile(t *testing.T, dir, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func parseCert(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCAVerifiesEachMemberForItsOwnNames checks that every member's
// certificate chains to the generated CA for its compose container name,
// its StatefulSet pod DNS name and the directory Service, for both server
// and client use (a member serves and dials with it), that it is not valid
// for another member's name (the directory tells members apart by the host
// of their Raft address), and that its key matches it.
func TestCAVerifiesEachMemberForItsOwnNames(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	generate(t, dir, false)
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(readFile(t, dir, CACert)) {
		t.Fatal("ca.crt holds no certificate")
	}
	for i, n := range Nodes {
		certPEM := readFile(t, dir, n.CertFile())
		if _, err := tls.X509KeyPair(certPEM, readFile(t, dir, n.KeyFile())); err != nil {
			t.Errorf("%s: key does not match certificate: %v", n.Compose, err)
		}
		c := parseCert(t, certPEM)
		own := []string{n.Compose, n.Pod + "." + n.Headless(), n.Pod + "." + n.Headless() + ".kvdir.svc.cluster.local", n.Set, "localhost", "127.0.0.1"}
		for _, name := range own {
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				if _, err := c.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
					t.Errorf("%s: not valid for %s (usage %v): %v", n.Compose, name, usage, err)
				}
			}
		}
		other := Nodes[(i+1)%len(Nodes)]
		for _, name := range []string{other.Compose, other.Pod + "." + other.Headless()} {
			if err := c.VerifyHostname(name); err == nil {
				t.Errorf("%s: valid for another member's name %s", n.Compose, name)
			}
		}
	}
	// A CA generated elsewhere does not verify these certificates.
	elsewhere := filepath.Join(t.TempDir(), "other")
	generate(t, elsewhere, false)
	foreign := x509.NewCertPool()
	foreign.AppendCertsFromPEM(readFile(t, elsewhere, CACert))
	if _, err := parseCert(t, readFile(t, dir, Nodes[0].CertFile())).Verify(x509.VerifyOptions{DNSName: Nodes[0].Compose, Roots: foreign}); err == nil {
		t.Error("another CA verifies kvdir-dir1's certificate")
	}
}

// TestTokensAreDistinctAndRandom checks that the role and agent tokens are
// 64 hex digits, all different, different again in another directory, and
// that agent-credentials binds each agent token to its worker ids.
func TestTokensAreDistinctAndRandom(t *testing.T) {
	seen := map[string]string{}
	for _, d := range []string{"a", "b"} {
		dir := filepath.Join(t.TempDir(), d)
		generate(t, dir, false)
		files := []string{AgentToken, RouterToken, AdminToken}
		for _, a := range Agents {
			files = append(files, a.TokenFile())
		}
		for _, f := range files {
			tok := strings.TrimSpace(string(readFile(t, dir, f)))
			if len(tok) != 64 || strings.Trim(tok, "0123456789abcdef") != "" {
				t.Errorf("%s/%s: %q is not 64 hex digits", d, f, tok)
			}
			if prev, ok := seen[tok]; ok {
				t.Errorf("%s/%s has the same token as %s", d, f, prev)
			}
			seen[tok] = d + "/" + f
		}
		sc := bufio.NewScanner(bytes.NewReader(readFile(t, dir, AgentCredentials)))
		var lines int
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			a := Agents[lines]
			lines++
			if len(fields) != 3 || fields[0] != a.Name || fields[2] != strings.Join(a.Patterns, ",") {
				t.Errorf("%s: agent-credentials line %q, want NAME TOKEN PATTERNS for %s", d, sc.Text(), a.Name)
				continue
			}
			if want := strings.TrimSpace(string(readFile(t, dir, a.TokenFile()))); fields[1] != want {
				t.Errorf("%s: agent-credentials gives %s a token other than %s's", d, a.Name, a.TokenFile())
			}
		}
		if lines != len(Agents) {
			t.Errorf("%s: agent-credentials has %d lines, want %d", d, lines, len(Agents))
		}
	}
}

// TestGenerateKeepsWhatExists checks that a second run writes nothing,
// that a deleted token comes back alone (certificates unchanged), that a
// new CA reissues the members' certificates, that --force replaces every
// secret, and the modes: the directory 0700, keys and tokens 0600.
func TestGenerateKeepsWhatExists(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	generate(t, dir, false)
	snapshot := func() map[string]string {
		m := map[string]string{}
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			m[e.Name()] = string(readFile(t, dir, e.Name()))
		}
		return m
	}
	first := snapshot()
	if res := generate(t, dir, false); len(res.Written) != 0 {
		t.Errorf("second run wrote %v, want nothing", res.Written)
	}
	if err := os.Remove(filepath.Join(dir, RouterToken)); err != nil {
		t.Fatal(err)
	}
	generate(t, dir, false)
	after := snapshot()
	for name, v := range first {
		changed := after[name] != v
		want := name == RouterToken || name == KubernetesYAML
		if changed != want {
			t.Errorf("after deleting router.token: %s changed=%v, want %v", name, changed, want)
		}
	}
	for _, f := range []string{CACert, CAKey} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	generate(t, dir, false)
	newCA := snapshot()
	if newCA[Nodes[0].CertFile()] == after[Nodes[0].CertFile()] || newCA[AdminToken] != after[AdminToken] {
		t.Error("a new CA must reissue the members' certificates and keep the tokens")
	}
	generate(t, dir, true)
	forced := snapshot()
	for _, f := range []string{CACert, Nodes[1].KeyFile(), AdminToken, Agents[0].TokenFile()} {
		if forced[f] == newCA[f] {
			t.Errorf("--force kept %s", f)
		}
	}
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != DirMode {
		t.Errorf("directory mode %v, want %v", st.Mode().Perm(), DirMode)
	}
	for name := range forced {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		want := SecretMode
		if strings.HasSuffix(name, ".crt") {
			want = PublicMode
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", name, st.Mode().Perm(), want)
		}
	}
}

// TestKubernetesSecrets decodes kubernetes.yaml strictly and checks that
// each Secret holds what deploy/k8s mounts from it, byte for byte.
func TestKubernetesSecrets(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	generate(t, dir, false)
	objs, err := k8s.DecodeStream(KubernetesYAML, readFile(t, dir, KubernetesYAML))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*corev1.Secret{}
	for _, o := range objs {
		s, ok := o.Obj.(*corev1.Secret)
		if !ok {
			t.Fatalf("%s: not a Secret", o)
		}
		if s.Namespace != Namespace {
			t.Errorf("%s: namespace %q, want %q", o, s.Namespace, Namespace)
		}
		got[s.Name] = s
	}
	want := map[string]map[string]string{
		SecretDirectory: {"ca.crt": CACert, "agent.token": AgentToken, "router.token": RouterToken, "admin.token": AdminToken,
			"agent-credentials": AgentCredentials, "kvdir-directory-1.crt": Nodes[1].CertFile(), "kvdir-directory-2.key": Nodes[2].KeyFile()},
		SecretAgent:  {"ca.crt": CACert, "token": AgentToken, "vllm.token": "agent-vllm.token"},
		SecretRouter: {"ca.crt": CACert, "token": RouterToken},
		SecretAdmin:  {"ca.crt": CACert, "token": AdminToken},
	}
	for name, keys := range want {
		s := got[name]
		if s == nil {
			t.Errorf("no Secret %s", name)
			continue
		}
		for key, file := range keys {
			if !bytes.Equal(s.Data[key], readFile(t, dir, file)) {
				t.Errorf("Secret %s key %s is not %s", name, key, file)
			}
		}
	}
	if _, ok := got[SecretAgent].Data["ca.key"]; ok {
		t.Error("the agents' Secret holds the CA key")
	}
	for name, s := range got {
		if _, ok := s.Data["ca.key"]; ok {
			t.Errorf("Secret %s holds the CA key: nothing in the cluster needs it", name)
		}
	}
}

// TestRunFlags checks the command's usage errors and its summary line.
func TestRunFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"extra"}, &out, &errb); code != 2 {
		t.Errorf("run extra: exit %d, want 2", code)
	}
	if code := run([]string{"--owner", "x"}, &out, &errb); code != 2 {
		t.Errorf("run --owner x: exit %d, want 2", code)
	}
	dir := filepath.Join(t.TempDir(), "s")
	if code := run([]string{"--out", dir, "--owner", "none"}, &out, &errb); code != 0 {
		t.Fatalf("run --out: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "wrote 25 files, kept 0 existing") {
		t.Errorf("summary %q", out.String())
	}
}

// TestOwner checks --owner's forms and, as root, that the files are given
// to the images' user.
func TestOwner(t *testing.T) {
	for _, c := range []struct {
		in       string
		euid     int
		uid, gid int
		bad      bool
	}{
		{"auto", 0, ImageUser, ImageUser, false}, {"auto", 1000, -1, -1, false}, {"none", 0, -1, -1, false},
		{"10:20", 1000, 10, 20, false}, {"10", 0, 0, 0, true}, {"a:b", 0, 0, 0, true}, {"-1:2", 0, 0, 0, true},
	} {
		own, err := parseOwner(c.in, c.euid)
		uid, gid := -1, -1
		if own != nil {
			uid, gid = own.UID, own.GID
		}
		if (err != nil) != c.bad || (!c.bad && (uid != c.uid || gid != c.gid)) {
			t.Errorf("parseOwner(%q, euid %d) = %+v, %v", c.in, c.euid, own, err)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	dir := filepath.Join(t.TempDir(), "s")
	if _, err := Generate(Options{Dir: dir, Owner: &Owner{UID: ImageUser, GID: ImageUser}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{".", CAKey, AdminToken, KubernetesYAML} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if sys := st.Sys().(*syscall.Stat_t); sys.Uid != ImageUser || sys.Gid != ImageUser {
			t.Errorf("%s owned by %d:%d, want %d:%d", name, sys.Uid, sys.Gid, ImageUser, ImageUser)
		}
	}
}

// TestKubernetesSecretsCoverTheManifests checks that every Secret key the
// manifests in deploy/k8s and the Helm chart's two-group rendering
// (ci/two-groups-values.yaml, when helm is installed) mount or read
// (secretKeyRef, secret volumes and their items, each directory pod's
// certificate, keyed by pod name) is one the generated kubernetes.yaml
// provides, so that applying both starts the pods.
func TestKubernetesSecretsCoverTheManifests(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	generate(t, dir, false)
	gen, err := k8s.DecodeStream(KubernetesYAML, readFile(t, dir, KubernetesYAML))
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]map[string][]byte{}
	for _, o := range gen {
		s := o.Obj.(*corev1.Secret)
		have[s.Name] = s.Data
	}
	_, kust, err := k8s.LoadDir("../k8s")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("k8s", func(t *testing.T) { secretsCover(t, have, kust) })
	t.Run("helm two groups", func(t *testing.T) {
		testkit.SkipIfShort(t, "runs helm template")
		h := helm.Binary()
		if h == "" {
			t.Skip("no helm: make helm-install")
		}
		out, err := helm.Template(h, []string{"ci/two-groups-values.yaml"})
		if err != nil {
			t.Fatal(err)
		}
		objs, err := k8s.DecodeStream("helm-template", out)
		if err != nil {
			t.Fatal(err)
		}
		secretsCover(t, have, objs)
	})
}

// secretsCover checks that every Secret key objs need is in have.
func secretsCover(t *testing.T, have map[string]map[string][]byte, objs []k8s.Object) {
	t.Helper()
	need := func(where, secret, key string) {
		t.Helper()
		if _, ok := have[secret]; !ok {
			t.Errorf("%s: Secret %s is not generated", where, secret)
		} else if _, ok := have[secret][key]; key != "" && !ok {
			t.Errorf("%s: Secret %s has no key %s", where, secret, key)
		}
	}
	refs := 0
	for _, o := range objs {
		var spec *corev1.PodSpec
		switch v := o.Obj.(type) {
		case *appsv1.Deployment:
			spec = &v.Spec.Template.Spec
		case *appsv1.StatefulSet:
			spec = &v.Spec.Template.Spec
			// KVDIR_DIRECTORY_TLS_CERT is /etc/kvdir/secrets/$(POD_NAME).crt.
			replicas := int32(1)
			if v.Spec.Replicas != nil {
				replicas = *v.Spec.Replicas
			}
			for i := range replicas {
				pod := fmt.Sprintf("%s-%d", v.Name, i)
				need(o.String(), SecretDirectory, pod+".crt")
				need(o.String(), SecretDirectory, pod+".key")
			}
		default:
			continue
		}
		for _, v := range spec.Volumes {
			if v.Secret == nil {
				continue
			}
			refs++
			need(o.String(), v.Secret.SecretName, "")
			for _, it := range v.Secret.Items {
				need(o.String(), v.Secret.SecretName, it.Key)
			}
		}
		for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.Name != "HF_TOKEN" {
					refs++
					need(o.String()+" "+e.Name, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
				}
			}
		}
	}
	if refs < 6 {
		t.Errorf("only %d Secret references: the manifests should mount the generated Secrets", refs)
	}
}
