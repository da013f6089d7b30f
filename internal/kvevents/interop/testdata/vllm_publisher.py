#!/usr/bin/python3
"""A vLLM-shaped KV event publisher for interoperability tests.

Written from docs/reference/vllm-kv-events.md (sections 1.2-1.6) on top of
Debian's python3-zmq (libzmq) and python3-msgpack.

Sockets: a PUB socket and a ROUTER replay socket, both bound on 127.0.0.1.
A port of 0 binds a free port. Once bound, the script prints
"READY <pub_port> <replay_port>" on stdout.

Handshake (to get past ZMQ's slow-joiner effect deterministically): until a
"start" line arrives on stdin, the script publishes probe messages on the
topic PROBE_TOPIC every 10 ms. A subscriber that sees a probe knows its
subscription reached the publisher and writes "start". The script then
publishes the fixed batches with sequence numbers 0..N-1 on the real topic,
each preceded by a message on OTHER_TOPIC (which a subscriber of a "kv@"
prefix must never receive), prints "PUBLISHED <n>", and keeps answering
replay requests until stdin is closed or says "quit".

Live message: [topic, seq (8 bytes, big-endian), msgpack([ts, events, dp_rank])].
Replay request (as seen by the ROUTER): [identity, "", seq8].
Replay reply, --replay-layout old: [identity, "", seq8, payload] per batch,
then [identity, "", END_SEQ, ""]; --replay-layout new: [identity, "", topic,
seq8, payload], then [identity, "", "", END_SEQ, ""]. END_SEQ is -1 as a
signed 8-byte big-endian integer.
"""

import argparse
import hashlib
import os
import struct
import sys

import msgpack
import zmq

PROBE_TOPIC = b"kv@probe"
OTHER_TOPIC = b"xx@other"
END_SEQ = struct.pack(">q", -1)
BLOCK_SIZE = 4

# Integer hashes: small, >= 2**63 (uint64 on the wire), negative (int16 and
# int64 on the wire), 2**64-1, and 2**63-1.
INT_HASHES = [0x1234, 2**63, -12345, 2**64 - 1, -(2**63), 2**63 - 1]


def bin_hashes():
    """Raw digests: 32-byte sha256 values, and one 16-byte (xxh3-128 size)."""
    hs = [hashlib.sha256(b"block-%d" % i).digest() for i in range(6)]
    hs[5] = hs[5][:16]
    return hs


def block_stored(form, hashes, parent, tokens, lora_id, medium, lora_name, extra_keys):
    if form == "array":
        return ["BlockStored", hashes, parent, tokens, BLOCK_SIZE, lora_id,
                medium, lora_name, extra_keys]
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": BLOCK_SIZE,
        "lora_id": lora_id,
        "medium": medium,
        "lora_name": lora_name,
        "extra_keys": extra_keys,
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
        "some_future_field": [1, 2],
    }


def block_removed(form, hashes, medium):
    if form == "array":
        return ["BlockRemoved", hashes, medium]
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium, "group_idx": 0}


def all_cleared(form):
    if form == "array":
        return ["AllBlocksCleared"]
    return {"type": "AllBlocksCleared"}


def batches(form, hash_kind, dp_rank):
    """The fixed event batches; the Go test builds the same ones."""
    h = INT_HASHES if hash_kind == "int" else bin_hashes()
    events = [
        [block_stored(form, [h[0], h[1]], None, list(range(8)), None, "GPU", None, None)],
        [block_stored(form, [h[2]], h[1], [8, 9, 10, 11], 7, "GPU", "adapter-a", [["adapter-a"]])],
        [block_removed(form, [h[0]], "GPU"),
         block_stored(form, [h[3]], h[2], [127, 128, 65535, 4294967295], None, "CPU", None, [None])],
        [all_cleared(form)],
        [block_stored(form, [h[4], h[5]], None, [100000, 70000, 255, 256, 0, 1, 2, 3],
                      None, None, None, [["salt-x"], None])],
        [block_removed(form, [h[4]], "GPU"), block_removed(form, [h[5]], None)],
    ]
    return [msgpack.packb([1700000000.5 + i, evs, dp_rank]) for i, evs in enumerate(events)]


def bind(sock, port):
    if port == 0:
        return sock.bind_to_random_port("tcp://127.0.0.1")
    sock.bind("tcp://127.0.0.1:%d" % port)
    return port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pub-port", type=int, default=0)
    ap.add_argument("--replay-port", type=int, default=0)
    ap.add_argument("--topic", default="kv@127.0.0.1@test-model")
    ap.add_argument("--form", choices=["array", "map"], default="array")
    ap.add_argument("--hashes", choices=["int", "bin"], default="int")
    ap.add_argument("--replay-layout", choices=["old", "new"], default="new")
    ap.add_argument("--dp-rank", type=int, default=0)
    args = ap.parse_args()

    topic = args.topic.encode()
    payloads = batches(args.form, args.hashes, args.dp_rank)

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    pub_port = bind(pub, args.pub_port)
    replay_port = bind(router, args.replay_port)
    print("READY %d %d" % (pub_port, replay_port), flush=True)

    stdin = sys.stdin.fileno()
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(stdin, zmq.POLLIN)

    started = False
    buffered = []  # (seq, payload) kept for replay
    inbuf = b""
    probe_seq = 0
    while True:
        ready = dict(poller.poll(10))
        if stdin in ready:
            chunk = os.read(stdin, 4096)
            if not chunk:
                break
            inbuf += chunk
            quit_ = False
            while b"\n" in inbuf:
                line, inbuf = inbuf.split(b"\n", 1)
                cmd = line.strip()
                if cmd == b"quit":
                    quit_ = True
                elif cmd == b"start" and not started:
                    started = True
                    for seq, payload in enumerate(payloads):
                        pub.send_multipart([OTHER_TOPIC, struct.pack(">Q", seq), b"\xc0"])
                        pub.send_multipart([topic, struct.pack(">Q", seq), payload])
                        buffered.append((seq, payload))
                    print("PUBLISHED %d" % len(payloads), flush=True)
            if quit_:
                break
        if router in ready:
            frames = router.recv_multipart()
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                print("bad replay request: %r" % (frames,), file=sys.stderr, flush=True)
                continue
            ident = frames[0]
            start = struct.unpack(">Q", frames[2])[0]
            for seq, payload in buffered:
                if seq < start:
                    continue
                if args.replay_layout == "old":
                    router.send_multipart([ident, b"", struct.pack(">Q", seq), payload])
                else:
                    router.send_multipart([ident, b"", topic, struct.pack(">Q", seq), payload])
            if args.replay_layout == "old":
                router.send_multipart([ident, b"", END_SEQ, b""])
            else:
                router.send_multipart([ident, b"", b"", END_SEQ, b""])
        if not started and not ready:
            pub.send_multipart([PROBE_TOPIC, struct.pack(">Q", probe_seq), b""])
            probe_seq += 1

    pub.close()
    router.close()
    ctx.term()


if __name__ == "__main__":
    main()
