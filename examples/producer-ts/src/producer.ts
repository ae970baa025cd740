// A minimal Breakwater producer in TypeScript.
//
// It encodes a protobuf `bw.v1.SendRequest` (schema read from proto/bw/v1/send.proto), sends it to ingest with
// NATS request/reply on `bw.send.v1.<phone_number_id>`, and prints the `IntakeReply`. On a timeout or "no
// responders" (or REJECT_REASON_UNAVAILABLE) it retries with the SAME operation id: ingest deduplicates by
// operation id, so retrying can never send a message twice.
//
// Usage: NATS_URL=nats://127.0.0.1:4222 npm run send -- <operation_id> <waba_id> <phone_number_id> <+recipient> <text>

import { connect, headers, type NatsConnection } from "nats";
import protobuf from "protobufjs";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const protoFile = path.resolve(here, "../../../proto/bw/v1/send.proto");

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
    console.error("usage: npm run send -- <operation_id> <waba_id> <phone_number_id> <+recipient> <text>");
    process.exit(64);
  }
  const nc = await connect({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" });
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
  } finally {
    await nc.close();
  }
}

await main();
