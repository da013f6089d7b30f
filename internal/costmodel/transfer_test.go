package costmodel

import (
	"math"
	"strings"
	"testing"
)

func TestTransferMillis(t *testing.T) {
	p := mustProfile(t, "llama3-8b") // 131072 bytes per token, default links
	cases := []struct {
		tokens int
		tier   Tier
		want   float64
	}{
		{1000, TierHost, 1000 * 131072 / 50e6}, // 2.62 ms
		{1000, TierDisk, 1000 * 131072 / 6e6},  // 21.8 ms
		{1000, TierGPU, 0},
		{0, TierHost, 0},
		{-5, TierDisk, 0},
	}
	for _, c := range cases {
		if got := p.TransferMillis(c.tokens, c.tier); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("TransferMillis(%d, %v) = %v, want %v", c.tokens, c.tier, got, c.want)
		}
	}
	p.HostToGPUGBps, p.DiskToGPUGBps = 25, 3
	if got, want := p.TransferMillis(1000, TierHost), 1000*131072/25e6; math.Abs(got-want) > 1e-9 {
		t.Errorf("host at 25 GB/s: %v, want %v", got, want)
	}
	if got, want := p.TransferMillis(1000, TierDisk), 1000*131072/3e6; math.Abs(got-want) > 1e-9 {
		t.Errorf("disk at 3 GB/s: %v, want %v", got, want)
	}
}

// TestTransferVersusRecompute pins the relation the placement policy and
// the simulator rely on: with the default links, loading from host memory
// is far cheaper than recomputing, and loading from disk is about even
// with recomputing on the 8B model (99 against 90 ms for 4,096 tokens) but
// several times cheaper on the 70B one.
func TestTransferVersusRecompute(t *testing.T) {
	for _, c := range []struct {
		name           string
		hostRatio      float64 // recompute / host load, at least
		diskLo, diskHi float64 // recompute / disk load, between
	}{{"llama3-8b", 5, 0.7, 1.5}, {"llama3-70b", 20, 2, 20}} {
		p := mustProfile(t, c.name)
		const n = 4096
		recompute := p.Prefill.Millis(n, 0) - p.Prefill.Millis(0, n)
		if host := p.TransferMillis(n, TierHost); recompute/host < c.hostRatio {
			t.Errorf("%s: recompute %.1f ms vs host load %.1f ms", c.name, recompute, host)
		}
		if disk := p.TransferMillis(n, TierDisk); recompute/disk < c.diskLo || recompute/disk > c.diskHi {
			t.Errorf("%s: recompute %.1f ms vs disk load %.1f ms", c.name, recompute, disk)
		}
	}
}

func TestLoadProfileBandwidths(t *testing.T) {
	const base = `{"name": "x", "prefill": {"a_ms": 1, "b_ms_per_token": 0.01, "c_ms_per_token2": 0, "d_ms_per_prefix_token": 0},
	  "decode": {"floor_ms": 5, "per_seq_ms": 0, "per_context_token_ms": 0}, "kv_bytes_per_token": 1000`
	p, err := LoadProfile(strings.NewReader(base + `, "host_to_gpu_gb_per_s": 25, "disk_to_gpu_gb_per_s": 2.5}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.HostBandwidth() != 25 || p.DiskBandwidth() != 2.5 {
		t.Fatalf("bandwidths %v %v, want 25 2.5", p.HostBandwidth(), p.DiskBandwidth())
	}
	p, err = LoadProfile(strings.NewReader(base + `}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.HostBandwidth() != DefaultHostToGPUGBps || p.DiskBandwidth() != DefaultDiskToGPUGBps {
		t.Fatalf("missing bandwidths: %v %v, want the defaults", p.HostBandwidth(), p.DiskBandwidth())
	}
	if _, err := LoadProfile(strings.NewReader(base + `, "disk_to_gpu_gb_per_s": -1}`)); err == nil || !strings.Contains(err.Error(), "disk_to_gpu_gb_per_s") {
		t.Fatalf("negative bandwidth: %v", err)
	}
}
