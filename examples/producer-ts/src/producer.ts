// A minimal Breakwater producer in TypeScript.
//
// It encodes a protobuf `bw.v1.SendRequest` (schema read from proto/bw/v1/send.proto), sends it to ingest with
// NATS request/reply on `bw.send.v1.<phone_number_id>`, and prints the `IntakeReply`. On a timeout or "no
// responders" (or REJECT_REASON_UNAVAILABLE) it retries with the SAME operation id: ingest stores each operation
// id of a tenant once, so retrying can never send a message twice.
//
// Then it follows the operation's outcomes: it binds its tenant's durable consumer feed-<tenant> on the outcome
// feed (stream BW_FEED, subject bw.feed.v1.<tenant>.<phone_number_id>.>, one bw.v1.OutcomeEvent per state change)
// and prints the events of this operation until a final one (or FOLLOW_SECONDS), and asks the status query
// (bw.status.v1.<phone>).
//
// It runs as a tenant of the sender registry (BW_TENANT, default "default"): the number must be registered to it
// (bwctl senders add), it connects as the tenant's NATS user producer-<tenant> with NATS_PASSWORD (none: no
// credentials, a local server without accounts) and takes replies on the tenant's inbox prefix _INBOX_<tenant>,
// the only one its user may read and the only one ingest answers to.
//
// Usage: NATS_URL=nats://127.0.0.1:4222 BW_TENANT=crm NATS_PASSWORD=... npm run --silent send -- <operation_id> <waba_id> <phone_number_id> <+recipient> <text>

import { AckPolicy, DeliverPolicy, connect, headers, type NatsConnection } from "nats";
import protobuf from "protobufjs";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const protoFile = path.resolve(here, "../../../proto/bw/v1/send.proto");
const feedProtoFile = path.resolve(here, "../../../proto/bw/v1/feed.proto");
const protoRoot = path.resolve(here, "../../../proto");

// Loads the feed schema; its imports ("bw/v1/ledger.proto") resolve against proto/.
async function loadFeed(): Promise<protobuf.Root> {
  const root = new protobuf.Root();
  root.resolvePath = (_origin, target) => (path.isAbsolute(target) ? target : path.join(protoRoot, target));
  return root.load(feedProtoFile);
}

interface OutcomeEvent {
  operationId: string;
  revision: string;
  kind: string;
  state: string;
  wamid: string;
  metaCode: string;
  reason: string;
  attempts: number;
  atUnixMs: string;
}

const FINAL = new Set(["OUTCOME_KIND_DELIVERED", "OUTCOME_KIND_READ", "OUTCOME_KIND_FAILED",
  "OUTCOME_KIND_QUARANTINED", "OUTCOME_KIND_EXPIRED"]);

// Prints the feed events of one operation, through the tenant's durable consumer, until a final one.
async function follow(nc: NatsConnection, tenant: string, phoneNumberId: string, operationId: string,
  seconds: number): Promise<void> {
  const root = await loadFeed();
  const Event = root.lookupType("bw.v1.OutcomeEvent");
  const jsm = await nc.jetstreamManager();
  // With a `name` the client creates the consumer through the subject that carries its filter
  // ($JS.API.CONSUMER.CREATE.BW_FEED.feed-<tenant>.<filter>), the only create a tenant's user may use; nothing
  // reads BW_FEED's stream info, which a tenant may not.
  const durable = `feed-${tenant}`;
  const filter = `bw.feed.v1.${tenant}.${phoneNumberId}.>`;
  try {
    await jsm.consumers.add("BW_FEED", {
      name: durable,
      durable_name: durable,
      filter_subject: filter,
      ack_policy: AckPolicy.Explicit,
      deliver_policy: DeliverPolicy.All,
    });
  } catch (e) {
    // The tenant's consumer exists with another number's filter: moved to this one (it keeps its position).
    if (!String(e).includes("already exists")) throw e;
    await jsm.consumers.update("BW_FEED", durable, { filter_subject: filter });
  }
  const consumer = await nc.jetstream().consumers.get("BW_FEED", durable);
  const deadline = Date.now() + seconds * 1000;
  while (Date.now() < deadline) {
    const batch = await consumer.fetch({ max_messages: 16, expires: 2000 });
    for await (const m of batch) {
      const ev = Event.toObject(Event.decode(m.data), { enums: String, longs: String, defaults: true }) as OutcomeEvent;
      m.ack();
      if (ev.operationId !== operationId) continue;
      console.log(JSON.stringify({ event: ev.kind, state: ev.state, wamid: ev.wamid, metaCode: ev.metaCode,
        reason: ev.reason, attempts: ev.attempts, atUnixMs: ev.atUnixMs }));
      if (FINAL.has(ev.kind)) return;
    }
  }
}

// Asks ingest where the operation is and how it got there.
async function status(nc: NatsConnection, phoneNumberId: string, operationId: string): Promise<unknown> {
  const root = await loadFeed();
  const Query = root.lookupType("bw.v1.StatusQuery");
  const Reply = root.lookupType("bw.v1.StatusReply");
  const msg = await nc.request(`bw.status.v1.${phoneNumberId}`, Query.encode({ operationId }).finish(), { timeout: 5000 });
  return Reply.toObject(Reply.decode(msg.data), { enums: String, longs: String, defaults: true });
}

interface Reply {
  accepted: boolean;
  operationId: string;
  duplicate: boolean;
  reason: string;
  error: string;
}

async function send(nc: NatsConnection, request: Record<string, unknown>, tries = 5): Promise<Reply> {
  const root = await protobuf.load(protoFile);
  const SendRequest = root.lookupType("bw.v1.SendRequest");
  const IntakeReply = root.lookupType("bw.v1.IntakeReply");
  // fromObject converts enum names ("CATEGORY_TRANSACTIONAL") and throws on fields of the wrong type.
  const bytes = SendRequest.encode(SendRequest.fromObject(request)).finish();
  const subject = `bw.send.v1.${request.phoneNumberId}`;
  let backoffMs = 100;
  let last = "";
  for (let attempt = 1; attempt <= tries; attempt++) {
    try {
      // A `traceparent` header here would make ingest's span a child of the producer's trace.
      const msg = await nc.request(subject, bytes, { timeout: 5000, headers: headers() });
      const reply = IntakeReply.toObject(IntakeReply.decode(msg.data), { enums: String, defaults: true }) as Reply;
      if (reply.accepted || reply.reason !== "REJECT_REASON_UNAVAILABLE") return reply;
      last = `ingest unavailable: ${reply.error}`;
    } catch (e) {
      // Timeouts and "no responders" are safe to retry with the same operation id; anything else is not ours.
      const code = (e as { code?: string }).code;
      if (code !== "TIMEOUT" && code !== "503") throw e;
      last = String(e);
    }
    await new Promise((r) => setTimeout(r, backoffMs));
    backoffMs = Math.min(backoffMs * 2, 2000);
  }
  throw new Error(`no answer for ${request.operationId} after ${tries} tries: ${last}`);
}

async function main(): Promise<void> {
  const [operationId, wabaId, phoneNumberId, recipient, body] = process.argv.slice(2);
  if (!operationId || !wabaId || !phoneNumberId || !recipient || !body) {
    console.error("usage: npm run --silent send -- <operation_id> <waba_id> <phone_number_id> <+recipient> <text>");
    process.exit(64);
  }
  const tenant = process.env.BW_TENANT ?? "default";
  const password = process.env.NATS_PASSWORD;
  const nc = await connect({
    servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222",
    inboxPrefix: `_INBOX_${tenant}`,
    ...(password ? { user: `producer-${tenant}`, pass: password } : {}),
  });
  try {
    const reply = await send(nc, {
      operationId,
      wabaId,
      phoneNumberId,
      recipient,
      category: "CATEGORY_TRANSACTIONAL",
      text: { body },
      labels: { source: "producer-ts" },
    });
    console.log(JSON.stringify(reply));
    process.exitCode = reply.accepted ? 0 : 1;
    if (reply.accepted) {
      const seconds = Number(process.env.FOLLOW_SECONDS ?? "60");
      await follow(nc, tenant, phoneNumberId, operationId, seconds);
      console.log(JSON.stringify(await status(nc, phoneNumberId, operationId)));
    }
  } finally {
    await nc.close();
  }
}

await main();
