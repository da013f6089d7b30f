package testkit

import (
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
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority made for a test or a benchmark run (ECDSA
// P-256, valid for a day).
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     *ecdsa.PrivateKey
	serial  atomic.Int64
}

// Cert is a certificate issued by a CA, with its key.
type Cert struct {
	CertPEM, KeyPEM []byte
	TLS             tls.Certificate
}

// NewCA makes a self-signed CA named name.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	ca := &CA{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}
	ca.serial.Store(1)
	return ca, nil
}

// MustCA is NewCA for tests: it fails t on error.
func MustCA(t testing.TB, name string) *CA {
	t.Helper()
	ca, err := NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// Pool is a pool holding the CA's certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue makes a certificate for hosts (IP addresses or DNS names, as
// subject alternative names) allowing extKeyUsage (both server and client
// authentication when none is given), with its CommonName the first host.
func (ca *CA) Issue(hosts []string, extKeyUsage ...x509.ExtKeyUsage) (*Cert, error) {
	if len(extKeyUsage) == 0 {
		extKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  extKeyUsage,
	}
	if len(hosts) > 0 {
		tmpl.Subject.CommonName = hosts[0]
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	c := &Cert{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}
	if c.TLS, err = tls.X509KeyPair(c.CertPEM, c.KeyPEM); err != nil {
		return nil, fmt.Errorf("key pair: %w", err)
	}
	return c, nil
}

// MustIssue is Issue for tests: it fails t on error.
func (ca *CA) MustIssue(t testing.TB, hosts []string, extKeyUsage ...x509.ExtKeyUsage) *Cert {
	t.Helper()
	c, err := ca.Issue(hosts, extKeyUsage...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// WriteCA writes the CA's certificate to dir/name and returns the path.
func (ca *CA) WriteCA(dir, name string) (string, error) {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, ca.CertPEM, 0o644); err != nil {
		return "", fmt.Errorf("write CA certificate: %w", err)
	}
	return p, nil
}

// Write writes the certificate and key to dir/name.crt and dir/name.key
// (mode 0600) and returns their paths.
func (c *Cert) Write(dir, name string) (certPath, keyPath string, err error) {
	certPath, keyPath = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certPath, c.CertPEM, 0o644); err != nil {
		return "", "", fmt.Errorf("write certificate: %w", err)
	}
	if err := os.WriteFile(keyPath, c.KeyPEM, 0o600); err != nil {
		return "", "", fmt.Errorf("write key: %w", err)
	}
	return certPath, keyPath, nil
}
