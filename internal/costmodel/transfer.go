package costmodel

import "math"

// Tier is where a cached KV block must be loaded from before an engine can
// use it: the GPU itself (no load), host memory or disk.
type Tier uint8

// Tiers, fastest first.
const (
	TierGPU  Tier = iota // already in GPU memory: no transfer
	TierHost             // host (CPU) memory, over the host↔GPU link
	TierDisk             // local disk or anything slower, read into the GPU
)

// String returns the tier's name.
func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierHost:
		return "host"
	case TierDisk:
		return "disk"
	}
	return "tier?"
}

// Default link bandwidths of an H200 server, in GB/s (10⁹ bytes per
// second), used when a profile leaves them at zero.
//
// Host to GPU: an H200 sits on a PCIe Gen5 x16 link, 32 GT/s × 16 lanes
// with 128b/130b coding, about 63 GB/s per direction before packet
// overhead; pinned cudaMemcpy from host memory reaches 50 to 55 GB/s on
// Gen5 Hopper boards. We take 50: an offloading connector copies many
// block-sized pieces (one block of llama3-8b is 2 MiB across all layers,
// split per layer), which does not beat a single large copy.
//
// Disk to GPU: one data-centre NVMe drive (PCIe Gen4 x4, or Gen5 x4) reads
// sequentially at 7 (or 12 to 14) GB/s by its data sheet; through the
// file system and a host bounce buffer 5 to 7 GB/s is what one drive gives
// a reader. We take 6, one drive's worth: a KV store spread over a RAID of
// several drives should say so in its profile.
const (
	DefaultHostToGPUGBps = 50.0
	DefaultDiskToGPUGBps = 6.0
)

// HostBandwidth returns the host-to-GPU bandwidth in GB/s (the profile's,
// or DefaultHostToGPUGBps when it has none).
func (p Profile) HostBandwidth() float64 {
	if p.HostToGPUGBps > 0 {
		return p.HostToGPUGBps
	}
	return DefaultHostToGPUGBps
}

// DiskBandwidth returns the disk-to-GPU bandwidth in GB/s (the profile's,
// or DefaultDiskToGPUGBps when it has none).
func (p Profile) DiskBandwidth() float64 {
	if p.DiskToGPUGBps > 0 {
		return p.DiskToGPUGBps
	}
	return DefaultDiskToGPUGBps
}

// TransferMillis returns the modelled time in milliseconds to load the KV
// of tokens tokens from tier t into GPU memory:
// tokens × KVBytesPerToken / bandwidth. It is 0 for TierGPU and for
// tokens ≤ 0.
func (p Profile) TransferMillis(tokens int, t Tier) float64 {
	if tokens <= 0 {
		return 0
	}
	var gbps float64
	switch t {
	case TierHost:
		gbps = p.HostBandwidth()
	case TierDisk:
		gbps = p.DiskBandwidth()
	default:
		return 0
	}
	ms := float64(tokens) * float64(p.KVBytesPerToken) / (gbps * 1e6) // GB/s = 10⁶ bytes/ms
	if math.IsInf(ms, 0) || math.IsNaN(ms) {
		return math.MaxFloat64
	}
	return ms
}
