package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// selfSigned makes a certificate for 127.0.0.1 that is its own CA.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kvdir test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// TestRunTLSAndTokens runs the command in this process: a one-node
// cluster serving TLS with role tokens from files and the environment;
// checks that Status needs a token, then stops it with a signal.
func TestRunTLSAndTokens(t *testing.T) {
	dir := t.TempDir()
	certPEM, keyPEM := selfSigned(t)
	cert := writeFile(t, dir, "cert.pem", string(certPEM), 0o600)
	key := writeFile(t, dir, "key.pem", string(keyPEM), 0o600)
	admin := writeFile(t, dir, "admin", "admin-secret\n", 0o600)
	cfg := writeFile(t, dir, "n1.yaml", fmt.Sprintf("node-id: n1\nbootstrap: true\ntls-cert: %s\ntls-key: %s\ntls-ca: %s\n", cert, key, cert), 0o600)
	addrs := testkit.FreeAddrs(t, 3)
	args := []string{"--config", cfg, "--data-dir", dir + "/data", "--raft-addr", addrs[0], "--api-addr", addrs[1], "--http-addr", addrs[2],
		"--heartbeat-timeout", "100ms", "--election-timeout", "100ms", "--log-level", "debug"}
	env := []string{"KVDIR_DIRECTORY_AGENT_TOKEN=agent-secret", "KVDIR_DIRECTORY_ROUTER_TOKEN=router-secret", "KVDIR_DIRECTORY_ADMIN_TOKEN_FILE=" + admin}

	sigs := make(chan os.Signal, 2)
	var stdout, stderr testkit.Buffer
	exit := make(chan int, 1)
	go func() { exit <- run(args, env, &stdout, &stderr, sigs) }()
	defer func() {
		if t.Failed() {
			t.Logf("node output:\n%s%s", stdout.String(), stderr.String())
		}
	}()

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	cc, err := grpc.NewClient(addrs[1], grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	admin1 := kvdirv1.NewAdminServiceClient(cc)
	withToken := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
	}
	testkit.Eventually(t, 15*time.Second, "the node to lead", func() (bool, string) {
		select {
		case code := <-exit:
			t.Fatalf("run returned %d early", code)
		default:
		}
		ctx, cancel := context.WithTimeout(withToken("router-secret"), time.Second)
		defer cancel()
		st, err := admin1.Status(ctx, &kvdirv1.StatusRequest{})
		if err != nil {
			return false, err.Error()
		}
		return st.State == "Leader" && st.LeaderAddress != "", st.String()
	})
	if _, err := admin1.Status(context.Background(), &kvdirv1.StatusRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Status without a token: %v, want Unauthenticated", err)
	}
	if _, err := admin1.Snapshot(withToken("router-secret"), &kvdirv1.SnapshotRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Snapshot with the router token: %v, want PermissionDenied", err)
	}
	if _, err := admin1.Status(withToken("admin-secret"), &kvdirv1.StatusRequest{}); err != nil {
		t.Errorf("Status with the admin token (from a file): %v", err)
	}

	// Twice at once, as a terminal's Ctrl-C under `go run` delivers it: still
	// a clean stop.
	sigs <- syscall.SIGTERM
	sigs <- syscall.SIGINT
	select {
	case code := <-exit:
		if code != exitOK {
			t.Errorf("exit %d after SIGTERM, want 0", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return within 20s of SIGTERM")
	}
	for _, want := range []string{"msg=listening", "tls=true", "raft_tls=true", "auth=true", "stopped cleanly"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("log lacks %q", want)
		}
	}
}
