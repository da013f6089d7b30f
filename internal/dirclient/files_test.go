package dirclient

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/testkit"
)

// TestLoadTLSVerifiesTheDirectory completes a real TLS handshake with a
// server whose certificate the CA in the file signed, for the name asked
// for, and fails one for another name and one against another CA.
func TestLoadTLSVerifiesTheDirectory(t *testing.T) {
	dir := t.TempDir()
	ca := testkit.MustCA(t, "dir-ca")
	caFile, err := ca.WriteCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	srv := ca.MustIssue(t, []string{"kvdir-dir1"})
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{srv.TLS}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	dial := func(serverName, caPath string) error {
		tc, err := LoadTLS(caPath, serverName)
		if err != nil {
			return err
		}
		c, err := tls.DialWithDialer(&net.Dialer{}, "tcp", ln.Addr().String(), tc)
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial("kvdir-dir1", caFile); err != nil {
		t.Errorf("handshake for kvdir-dir1: %v", err)
	}
	if err := dial("kvdir-dir2", caFile); err == nil {
		t.Error("handshake for kvdir-dir2 succeeded with kvdir-dir1's certificate")
	}
	otherFile, err := testkit.MustCA(t, "other").WriteCA(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	if err := dial("kvdir-dir1", otherFile); err == nil {
		t.Error("handshake succeeded against another CA")
	}
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("no pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTLS(empty, ""); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("LoadTLS of a file without PEM: %v", err)
	}
}

// TestReadToken trims white space and refuses an empty or missing file.
func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "t")
	if err := os.WriteFile(f, []byte("  abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := ReadToken(f); err != nil || tok != "abc" {
		t.Errorf("ReadToken = %q, %v; want abc", tok, err)
	}
	if err := os.WriteFile(f, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadToken(f); err == nil {
		t.Error("empty token file accepted")
	}
	if _, err := ReadToken(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing token file accepted")
	}
}
