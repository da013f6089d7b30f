package chaos

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"
)

// Addrs dials containers by name on Network, looking each one's address up
// (docker inspect, a process and a daemon round trip) at most once per TTL
// rather than at every dial: under a hundred requests a second a fault
// that breaks connections would otherwise fork an inspect per new
// connection and slow the very calls that check the cluster. A dial that
// fails at a remembered address looks the address up again and retries
// once, so a container restarted at a new address costs no failed dial.
type Addrs struct {
	d   Docker
	ttl time.Duration

	mu sync.Mutex
	m  map[string]*addrEntry
}

type addrEntry struct {
	mu sync.Mutex // held while looking up, so concurrent dials share one inspect
	ip string
	at time.Time
}

// NewAddrs returns an Addrs over d remembering addresses for ttl.
func NewAddrs(d Docker, ttl time.Duration) *Addrs {
	return &Addrs{d: d, ttl: ttl, m: map[string]*addrEntry{}}
}

// ip returns container's address, looked up when none is remembered from
// the last ttl or when fresh is set.
func (a *Addrs) ip(ctx context.Context, container string, fresh bool) (string, error) {
	a.mu.Lock()
	e := a.m[container]
	if e == nil {
		e = &addrEntry{}
		a.m[container] = e
	}
	a.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !fresh && e.ip != "" && time.Since(e.at) < a.ttl {
		return e.ip, nil
	}
	ip, err := a.d.IP(ctx, container)
	if err != nil || ip == "" {
		e.ip = ""
		return "", fmt.Errorf("address of %s: %q %v", container, ip, err)
	}
	e.ip, e.at = ip, time.Now()
	return ip, nil
}

// Dial dials addr, whose host is an IP address or a container's name on
// Network, with timeout.
func (a *Addrs) Dial(ctx context.Context, network, addr string, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || net.ParseIP(host) != nil {
		return d.DialContext(ctx, network, addr)
	}
	ip, err := a.ip(ctx, host, false)
	if err != nil {
		return nil, err
	}
	c, err := d.DialContext(ctx, network, net.JoinHostPort(ip, port))
	if err == nil || ctx.Err() != nil {
		return c, err
	}
	fresh, ferr := a.ip(ctx, host, true)
	if ferr != nil || fresh == ip {
		return nil, err
	}
	return d.DialContext(ctx, network, net.JoinHostPort(fresh, port))
}
