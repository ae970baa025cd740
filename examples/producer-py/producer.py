#!/usr/bin/env python3
"""A small Breakwater producer in Python with the official NATS client (nats-py).

It sends one bw.v1.SendRequest to ingest by NATS request/reply on bw.send.v1.<phone_number_id>, retrying
timeouts and REJECT_REASON_UNAVAILABLE with the SAME operation id (ingest stores each operation id of a tenant
once, so a retry can never send twice), then follows the operation's outcomes: it binds its tenant's durable
consumer feed-<tenant> on the outcome feed (stream BW_FEED, subject bw.feed.v1.<tenant>.<phone_number_id>.>) and
prints each event of this operation until a final one, and finally asks the status query
(bw.status.v1.<phone_number_id>) for the journey.

It runs as a tenant of the sender registry (BW_TENANT, default "default"): the number must be registered to it
(bwctl senders add); it connects as the tenant's NATS user producer-<tenant> with NATS_PASSWORD (unset: no
credentials, a local server without accounts) and takes replies on the tenant's inbox prefix _INBOX_<tenant>, the
only one its user may read and the only one ingest answers to.

The few protobuf messages are encoded by hand below (proto/bw/v1/send.proto and feed.proto are the schema),
so the only dependency is nats-py (requirements.txt).

Usage:
  NATS_URL=nats://127.0.0.1:4222 BW_TENANT=crm NATS_PASSWORD=... .venv/bin/python producer.py <operation_id> <waba_id> <phone_number_id> <+recipient> <text>
"""

import asyncio
import os
import sys

import nats
from nats.errors import NoRespondersError, TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

# ---- minimal protobuf wire format ----


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, value) -> bytes:
    if isinstance(value, bool) or isinstance(value, int):
        return _varint(num << 3) + _varint(int(value))
    data = value.encode() if isinstance(value, str) else value
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def _decode(buf: bytes) -> dict:
    """Top-level fields of a message: {number: [values]} (varints as int, length-delimited as bytes)."""
    fields, i = {}, 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(buf, i)
        elif wire == 2:
            size, i = _read_varint(buf, i)
            value, i = buf[i : i + size], i + size
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        fields.setdefault(num, []).append(value)
    return fields


def _read_varint(buf: bytes, i: int):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _str(fields, num):
    return fields.get(num, [b""])[0].decode()


def _int(fields, num):
    return fields.get(num, [0])[0]


CATEGORY_TRANSACTIONAL = 2  # bw.v1.Category
REJECT_REASONS = {10: "REJECT_REASON_UNAVAILABLE"}
KINDS = ["unspecified", "accepted", "sending", "retrying", "sent", "delivered", "read", "failed",
         "dead_lettered", "replayed", "quarantined", "expired", "unknown", "resolved"]
FINAL = {"delivered", "read", "failed", "quarantined", "expired"}


def send_request(op, waba, phone, recipient, body) -> bytes:
    text = _field(1, body)  # TextPayload.body
    return (_field(1, op) + _field(2, waba) + _field(3, phone) + _field(4, recipient)
            + _field(5, CATEGORY_TRANSACTIONAL) + _field(6, text) + _field(12, _field(1, "source") + _field(2, "producer-py")))


def intake_reply(data: bytes) -> dict:
    f = _decode(data)
    return {"accepted": bool(_int(f, 1)), "operation_id": _str(f, 2), "duplicate": bool(_int(f, 3)),
            "reason": _int(f, 4), "error": _str(f, 5)}


def outcome_event(data: bytes) -> dict:
    f = _decode(data)
    kind = _int(f, 3)
    return {"operation_id": _str(f, 1), "revision": _int(f, 2), "event": KINDS[kind] if kind < len(KINDS) else kind,
            "wamid": _str(f, 8), "meta_code": _int(f, 9), "reason": _str(f, 10), "attempts": _int(f, 12),
            "at_unix_ms": _int(f, 16)}


# ---- the producer ----


async def send(nc, op, waba, phone, recipient, body, tries=5) -> dict:
    payload, backoff, last = send_request(op, waba, phone, recipient, body), 0.1, ""
    for _ in range(tries):
        try:
            msg = await nc.request(f"bw.send.v1.{phone}", payload, timeout=5)
            reply = intake_reply(msg.data)
            if reply["accepted"] or reply["reason"] != 10:
                return reply
            last = "ingest unavailable: " + reply["error"]
        except (NatsTimeout, NoRespondersError) as e:  # safe to retry with the same operation id
            last = repr(e)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 2)
    raise RuntimeError(f"no answer for {op} after {tries} tries: {last}")


async def follow(nc, tenant, phone, op, timeout_s):
    js = nc.jetstream()
    # The tenant's durable consumer: after a restart it resumes where it left off. With a `name` the client
    # creates (or updates) it through the subject that carries its filter
    # ($JS.API.CONSUMER.CREATE.BW_FEED.feed-<tenant>.<filter>), the only create a tenant's user may use; binding
    # reads no stream info, which a tenant may not.
    durable = f"feed-{tenant}"
    config = ConsumerConfig(name=durable, durable_name=durable, filter_subject=f"bw.feed.v1.{tenant}.{phone}.>",
                            ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL)
    await js.add_consumer("BW_FEED", config)
    sub = await js.pull_subscribe_bind(durable, stream="BW_FEED")
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        try:
            msgs = await sub.fetch(16, timeout=2)
        except NatsTimeout:
            continue
        for m in msgs:
            event = outcome_event(m.data)
            await m.ack()
            if event["operation_id"] == op:
                print("event", event, flush=True)
                if event["event"] in FINAL:
                    return event
    return None


async def status(nc, phone, op):
    msg = await nc.request(f"bw.status.v1.{phone}", _field(1, op), timeout=5)
    f = _decode(msg.data)
    current = outcome_event(f[3][0]) if 3 in f else None
    journey = [outcome_event(e)["event"] for e in f.get(4, [])]
    return {"found": bool(_int(f, 1)), "current": current, "journey": journey, "error": _str(f, 5)}


async def main():
    if len(sys.argv) != 6:
        print(__doc__, file=sys.stderr)
        sys.exit(64)
    op, waba, phone, recipient, body = sys.argv[1:]
    tenant = os.environ.get("BW_TENANT", "default")
    credentials = {}
    if os.environ.get("NATS_PASSWORD"):
        credentials = {"user": f"producer-{tenant}", "password": os.environ["NATS_PASSWORD"]}
    nc = await nats.connect(os.environ.get("NATS_URL", "nats://127.0.0.1:4222"),
                            inbox_prefix=f"_INBOX_{tenant}".encode(), **credentials)
    try:
        reply = await send(nc, op, waba, phone, recipient, body)
        print("reply", reply, flush=True)
        if not reply["accepted"]:
            sys.exit(1)
        timeout_s = float(os.environ.get("FOLLOW_SECONDS", "60"))
        await follow(nc, tenant, phone, op, timeout_s)
        print("status", await status(nc, phone, op), flush=True)
    finally:
        await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
