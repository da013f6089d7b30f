package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			_, _ = w.Write([]byte("ready\n"))
		case "/slow":
			time.Sleep(500 * time.Millisecond)
		default:
			http.Error(w, "no leader", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()

	cases := []struct {
		name   string
		args   []string
		env    string
		status int
		stderr string
	}{
		{"ready", []string{srv.URL + "/readyz"}, "", statusHealthy, ""},
		{"url from environment", nil, srv.URL + "/readyz", statusHealthy, ""},
		{"argument beats environment", []string{srv.URL + "/readyz"}, srv.URL + "/down", statusHealthy, ""},
		{"503", []string{srv.URL + "/down"}, "", statusUnhealthy, "503 Service Unavailable: no leader"},
		{"timeout", []string{"--timeout", "50ms", srv.URL + "/slow"}, "", statusUnhealthy, "deadline exceeded"},
		{"refused", []string{closedURL + "/readyz"}, "", statusUnhealthy, "connection refused"},
		{"no url", nil, "", statusUsage, "no URL"},
		{"two urls", []string{srv.URL, srv.URL}, "", statusUsage, "give one URL"},
		{"not http", []string{"ftp://x/readyz"}, "", statusUsage, "not an http(s) URL"},
		{"bad timeout", []string{"--timeout", "0s", srv.URL}, "", statusUsage, "--timeout must be positive"},
		{"bad flag", []string{"--nope"}, "", statusUsage, "flag provided but not defined"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			env := func(k string) string {
				if k == "HEALTHCHECK_URL" {
					return c.env
				}
				return ""
			}
			got := run(c.args, env, &stdout, &stderr)
			if got != c.status {
				t.Fatalf("status %d, want %d (stderr %q)", got, c.status, stderr.String())
			}
			if !strings.Contains(stderr.String(), c.stderr) {
				t.Fatalf("stderr %q, want it to contain %q", stderr.String(), c.stderr)
			}
			if c.status == statusHealthy && stdout.String() != "ready\n" {
				t.Fatalf("stdout %q, want the body", stdout.String())
			}
		})
	}
}
