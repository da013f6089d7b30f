package placement

import "github.com/kvdir/kvdir/internal/costmodel"

// Pricing the KV tiers (kvdir).
//
// An engine with an offloading tier serves a matched prefix in up to three
// parts: the leading blocks still on the GPU, then blocks it copies back
// from host memory, then blocks it reads from disk. vLLM's offloading
// connector loads the blocks before the request's prefill starts; the
// load takes bytes / bandwidth ([costmodel.Profile.TransferMillis]) and
// the request waits for it. The loaded tokens are then cached like any
// other, so the prefill is priced as before with them in the prefix, and
// the load (Score.TransferMs) is added to the request's time to first
// token. It is not part of PrefillMs, which the extra term charges to the
// requests queued behind us: the copy runs on the link while the engine
// computes other requests, so it delays only the request it loads for.
//
// Loading is not always worth it: reading 4,096 tokens of llama3-8b KV
// from one NVMe drive takes about as long as recomputing them. The engine
// could stop at any tier boundary and compute the rest, so the policy
// prices each of the three stopping points (GPU run only, GPU and host,
// all) and keeps the cheapest: cost = min over k of
// Prefill.Millis(P−c_k, c_k) + load(c_k), where c_k is the cached prefix
// up to boundary k and load(c_k) the transfer of its non-GPU part. The
// Retain discount applies to the whole match, taken from its end: the
// expected cached tokens are assigned to the GPU run first, then host,
// then disk.

// tieredCache returns how many of the cached (expected) leading tokens of
// c the request should use, how many of those are loaded from host memory
// or disk, and the load's time in milliseconds.
func (p *KVDir) tieredCache(req Request, c *Candidate, cached int) (use, loaded int, ms float64) {
	if c.HostBlocks == 0 && c.DiskBlocks == 0 {
		return cached, 0, 0
	}
	gpu := min(c.GPUBlocks()*req.BlockSize, cached)
	host := min(c.HostBlocks*req.BlockSize, cached-gpu)
	disk := cached - gpu - host
	pre := p.prof.Prefill
	use, best := gpu, pre.Millis(req.PromptTokens-gpu, gpu)
	hostMs := p.prof.TransferMillis(host, costmodel.TierHost)
	if host > 0 {
		if t := pre.Millis(req.PromptTokens-gpu-host, gpu+host) + hostMs; t < best {
			use, best, loaded, ms = gpu+host, t, host, hostMs
		}
	}
	if disk > 0 {
		load := hostMs + p.prof.TransferMillis(disk, costmodel.TierDisk)
		if t := pre.Millis(req.PromptTokens-cached, cached) + load; t < best {
			use, loaded, ms = cached, host+disk, load
		}
	}
	return use, loaded, ms
}
