#!/usr/bin/python3
"""KV event payloads of several engines and model families, for interop tests.

Written on Debian's python3-msgpack (no msgspec, no engine installed): each
payload reproduces what msgspec makes of the upstream event classes, with
the field order they declare. Fields a class declares with a default are
left out when they hold it where the class sets omit_defaults, as msgspec
does; the tag goes first as "type" in map-form events.

  vllm_*    vllm-project/vllm vllm/distributed/kv_events.py at 0181ea31
            (EventBatch and events as maps, omit_defaults); spec kinds from
            vllm/v1/kv_cache_interface.py (KVCacheSpecKind, newer than
            bc8282e6); re-reported
            stores as block_pool.emit_cached_block_events builds them for
            kv_cache_report_mode="full" (identical to the first store).
  sglang_*  sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py,
            the revision with StorageMedium and BlockStoredWithMetadata (no
            commit known; 612d5790 and 006d053f predate it)
            (array_like, no omit_defaults; metadata is kw_only and follows
            medium); bigram pages as KVCacheEventMixin._record_store_event
            builds them under EAGLE/NEXTN/MTP; a map-form event with a
            top-level cache_salt.
  trtllm_*  NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/kv_cache_events.py
            at 13599e98 (EventBatch array_like, events as maps with
            omit_defaults; token_ids list[int | str]; locality and mm_keys
            after the vLLM fields; MultimodalKey tagged "mm_key").

Prints one line per payload: "<name> <hex>".
"""

import msgpack

TS = 1700000000.25


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def vllm_stored(hashes, parent, tokens, block_size=4, medium="GPU", group=None, kind=None, window=None):
    ev = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
    }
    for key, value in (("group_idx", group), ("kv_cache_spec_kind", kind), ("kv_cache_spec_sliding_window", window)):
        if value is not None:
            ev[key] = value
    return ev


def vllm_removed(hashes, medium="GPU", group=None):
    ev = {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
    if group is not None:
        ev["group_idx"] = group
    return ev


def vllm_batch(events):
    return {"ts": TS, "events": events, "data_parallel_rank": 0}


def sglang_stored(hashes, parent, tokens, block_size, medium="GPU", cache_salt=None):
    ev = ["BlockStored", hashes, parent, tokens, block_size, None, medium]
    if cache_salt is not None:
        ev.append({"cache_salt": cache_salt})
    return ev


def sglang_batch(events):
    return [TS, events, 0]


def bigram_pages(raw, page_size):
    """One event per page, pairs (raw[j], raw[j+1]); raw has one extra token."""
    pages = []
    for start in range(0, len(raw) - 1, page_size):
        end = min(start + page_size, len(raw) - 1)
        pages.append([[raw[j], raw[j + 1]] for j in range(start, end)])
    return pages


def trtllm_stored(hashes, parent, tokens, locality=None, mm_keys=None):
    ev = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    if locality is not None:
        ev["locality"] = locality
    if mm_keys is not None:
        ev["mm_keys"] = mm_keys
    return ev


def payloads():
    out = {}
    toks = list(range(100, 108))
    # Hybrid model: sliding-window group 0, MLA group 1 (layer order).
    out["vllm_hybrid_mla"] = vllm_batch([
        vllm_stored([11, 12], None, toks, group=0, kind="sliding_window", window=128),
        vllm_stored([11, 12], None, toks, group=1, kind="mla_attention"),
        vllm_removed([12], group=0),
        vllm_removed([12], group=1),
    ])
    out["vllm_sink"] = vllm_batch([
        vllm_stored([21], None, toks[:4], group=0, kind="sink_full_attention"),
        vllm_stored([22], None, toks[:4], group=1, kind="mamba"),
    ])
    # kv_cache_report_mode="full": the reused prefix is announced again.
    out["vllm_report_full"] = vllm_batch([
        vllm_stored([31, 32], None, toks, group=0, kind="full_attention"),
        vllm_stored([31, 32], None, toks, group=0, kind="full_attention"),
        vllm_removed([31, 32], group=0),
    ])
    out["vllm_offload_media"] = vllm_batch([
        vllm_stored([41], None, toks[:4], medium="STORAGE"),
        vllm_stored([42], None, toks[:4], medium="FS"),
        vllm_stored([43], None, toks[:4], medium="OBJ"),
    ])
    raw = list(range(200, 209))  # 8 tokens and the token after them
    p0, p1 = bigram_pages(raw, 4)
    out["sglang_eagle_salted"] = sglang_batch([
        sglang_stored([51], None, p0, len(p0), cache_salt="tenant-a"),
        sglang_stored([52], 51, p1, len(p1), medium="CPU_PINNED", cache_salt="tenant-a"),
    ])
    out["sglang_eagle"] = sglang_batch([
        sglang_stored([53], None, p0, len(p0)),
        sglang_stored([54], 53, p1, len(p1), medium="EXTERNAL"),
    ])
    out["sglang_map_salt"] = [TS, [{
        "type": "BlockStored", "block_hashes": [55], "parent_block_hash": None,
        "token_ids": toks[:4], "block_size": 4, "lora_id": None, "medium": "CPU_TIER1",
        "cache_salt": "tenant-b",
    }], 0]
    # SGLang hashes are int64: negative ones are msgpack negative ints.
    out["sglang_removed"] = sglang_batch([
        sglang_stored([-5], None, toks[:4], 4),
        ["BlockRemoved", [-5, 2**63 - 1], "GPU"],
        ["AllBlocksCleared"],
    ])
    out["sglang_map_removed"] = [TS, [
        {"type": "BlockStored", "block_hashes": [-5], "parent_block_hash": None,
         "token_ids": toks[:4], "block_size": 4, "lora_id": None},
        {"type": "BlockRemoved", "block_hashes": [-5], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
    ], 0]
    mm = ["<mm:9f2c>"] * 2
    out["trtllm_strings"] = [TS, [
        trtllm_stored([61, 62, 63], None, toks[:4] + [104, mm[0], mm[1], 107] + toks[:4], locality="LOCAL"),
        trtllm_stored([64], None, toks[:4], locality="REMOTE"),
        {"type": "BlockRemoved", "block_hashes": [64], "medium": "GPU", "locality": "REMOTE"},
    ], 0]
    out["trtllm_mm_keys"] = [TS, [
        trtllm_stored([65], None, toks[:4], mm_keys=[[{"type": "mm_key", "hash": "9f2c", "start_offset": 1}]]),
    ], 0]
    return out


def main():
    for name, obj in payloads().items():
        print(name, pack(obj).hex())


if __name__ == "__main__":
    main()
