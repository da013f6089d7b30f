package dirclient

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSecurityLoad(t *testing.T) {
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte(" s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	tok, tc, err := Security{TokenFile: tokFile}.Load()
	if err != nil || tok != "s3cret" || tc != nil {
		t.Fatalf("token file: got %q, %v, %v; want s3cret, plaintext", tok, tc, err)
	}
	for _, c := range []struct {
		name string
		s    Security
		want string
	}{
		{"token twice", Security{Token: "a", TokenFile: tokFile}, "not both"},
		{"server name without CA", Security{ServerName: "kvdir-dir1"}, "--tls-server-name needs --tls-ca"},
		{"CA without a certificate", Security{CAFile: notPEM}, "--tls-ca: "},
		{"missing token file", Security{TokenFile: filepath.Join(dir, "none")}, "--token-file: "},
	} {
		if _, _, err := c.s.Load(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one containing %q", c.name, err, c.want)
		}
	}
}
