//! Every NATS subject, stream, consumer, KV bucket and Redis key name, in one place.
//!
//! Subjects follow `bw.<domain>.v1.<...>`; streams are `UPPER_SNAKE`; durable consumers are named after the
//! service that owns them. Service code never formats a name itself.

/// Producer intake (core NATS request/reply): `bw.send.v1.<phone_number_id>`.
pub fn intake_subject(phone_number_id: &str) -> String {
    format!("bw.send.v1.{phone_number_id}")
}
/// Wildcard ingest subscribes to.
pub const INTAKE_WILDCARD: &str = "bw.send.v1.*";
/// Queue group of ingest instances on the intake subjects.
pub const INTAKE_QUEUE_GROUP: &str = "bw-ingest";

/// Dispatch lanes inside BW_SEND, in serving order: priority replays and live priority traffic first, then
/// marketing, then marketing replays. Priority follows the message, not the lane it comes back through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Authentication, transactional, support messages replay put back from the DLQ; admitted as priority
    /// traffic (they may use the reserve) and served before everything else.
    PriorityReplay,
    /// Authentication, transactional, support.
    High,
    /// Marketing.
    Low,
    /// Marketing messages replay put back from the DLQ; sent only with the sender's spare rate.
    Replay,
}

impl Lane {
    /// All lanes in the order the dispatcher serves them.
    pub const ALL: [Lane; 4] = [Lane::PriorityReplay, Lane::High, Lane::Low, Lane::Replay];

    /// Subject token of the lane.
    pub fn token(self) -> &'static str {
        match self {
            Lane::PriorityReplay => "rh",
            Lane::High => "hi",
            Lane::Low => "lo",
            Lane::Replay => "rp",
        }
    }

    /// Lane for a fresh request of this category.
    pub fn for_category(category: bw_proto::v1::Category) -> Lane {
        if category.is_priority() { Lane::High } else { Lane::Low }
    }

    /// Lane a replayed DLQ (or quarantine) entry of this category goes back through.
    pub fn for_replay(category: bw_proto::v1::Category) -> Lane {
        if category.is_priority() { Lane::PriorityReplay } else { Lane::Replay }
    }

    /// True for the lanes replay feeds (`rh`, `rp`).
    pub fn is_replay(self) -> bool {
        matches!(self, Lane::PriorityReplay | Lane::Replay)
    }

    /// True for the lanes of marketing messages (`lo`, `rp`), the ones held back while the sender has a
    /// priority backlog.
    pub fn is_marketing(self) -> bool {
        matches!(self, Lane::Low | Lane::Replay)
    }

    /// Durable consumer name of the dispatcher for this lane.
    pub fn dispatcher_consumer(self) -> &'static str {
        match self {
            Lane::PriorityReplay => "dispatcher-rh",
            Lane::High => "dispatcher-hi",
            Lane::Low => "dispatcher-lo",
            Lane::Replay => "dispatcher-rp",
        }
    }

    /// Filter subject of this lane in BW_SEND (partition 0: [`SendPartitions::lane_filter`]).
    pub fn filter(self) -> String {
        SendPartitions::lane_filter(0, self)
    }
}

/// Stream holding accepted send requests (work queue); with several send partitions, partition 0
/// ([`SendPartitions`]).
pub const SEND_STREAM: &str = "BW_SEND";
/// Subject of an accepted request in BW_SEND (partition 0): `bw.outbox.v1.<lane>.<phone_number_id>`. With
/// several send partitions use [`SendPartitions::outbox_subject`].
pub fn outbox_subject(lane: Lane, phone_number_id: &str) -> String {
    SendPartitions::default().outbox_subject(lane, phone_number_id)
}

/// Most send partitions a deployment may have (`nats.send_partitions`).
pub const MAX_SEND_PARTITIONS: usize = 64;

/// How BW_SEND and the DLQ are split (`nats.send_partitions`): N work streams `BW_SEND` (partition 0),
/// `BW_SEND_1` … `BW_SEND_<N-1>`, and as many DLQ streams `BW_DLQ`, `BW_DLQ_1` …, each its own stream with its
/// own leader on a NATS cluster. A sender lives in one partition, FNV-1a(phone_number_id) mod N, in both: so
/// everything per sender (its lanes' order, the priority gate's counts, replay's consumers and backlog check)
/// stays inside one stream of each. Partition 0's subjects are the unpartitioned ones
/// (`bw.outbox.v1.<lane>.<phone>`, `bw.dlq.v1.<class>.<phone>`), so one partition is BW_SEND and BW_DLQ as they
/// always were; partition `i` > 0 uses `bw.outbox.p<i>.v1.<lane>.<phone>` and `bw.dlq.p<i>.v1.<class>.<phone>`
/// (streams may not share subjects; the phone stays the last token and the lane or class the one before it).
/// Every durable consumer has the same name on every partition's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendPartitions(usize);

impl Default for SendPartitions {
    fn default() -> Self {
        SendPartitions(1)
    }
}

impl SendPartitions {
    /// `count` partitions (0 counts as 1).
    pub fn new(count: usize) -> SendPartitions {
        SendPartitions(count.max(1))
    }

    /// How many partitions there are.
    pub fn count(self) -> usize {
        self.0
    }

    /// Every partition, in order.
    pub fn all(self) -> std::ops::Range<usize> {
        0..self.0
    }

    /// Every BW_SEND partition's stream, in order.
    pub fn streams(self) -> impl Iterator<Item = String> {
        self.all().map(Self::stream)
    }

    /// Every DLQ partition's stream, in order.
    pub fn dlq_streams(self) -> impl Iterator<Item = String> {
        self.all().map(Self::dlq_stream)
    }

    /// The partition of a sender: FNV-1a (64 bit) of its phone_number_id modulo the count, fixed across
    /// versions (see [`ledger_partition`]).
    pub fn of(self, phone_number_id: &str) -> usize {
        fnv1a_mod(phone_number_id, self.0)
    }

    /// The stream of partition `partition`: `BW_SEND`, `BW_SEND_1`, ….
    pub fn stream(partition: usize) -> String {
        partition_bucket(SEND_STREAM, partition)
    }

    /// The stream holding a sender's requests.
    pub fn stream_of(self, phone_number_id: &str) -> String {
        Self::stream(self.of(phone_number_id))
    }

    /// Every subject of partition `partition`'s stream.
    pub fn stream_subjects(partition: usize) -> String {
        format!("{}.>", outbox_prefix(partition))
    }

    /// Subject of an accepted request of a sender in its partition.
    pub fn outbox_subject(self, lane: Lane, phone_number_id: &str) -> String {
        format!("{}.{}.{phone_number_id}", outbox_prefix(self.of(phone_number_id)), lane.token())
    }

    /// Filter subject of a lane in partition `partition`'s stream.
    pub fn lane_filter(partition: usize, lane: Lane) -> String {
        format!("{}.{}.*", outbox_prefix(partition), lane.token())
    }

    /// Subject of a request its portfolio's messaging-limit budget holds, parked out of its lane's consumer:
    /// `<outbox>.held.<lane>.<phone_number_id>` in the sender's partition (the dispatcher's [`HELD_CONSUMER`]).
    pub fn held_subject(self, lane: Lane, phone_number_id: &str) -> String {
        format!("{}.{HELD_TOKEN}.{}.{phone_number_id}", outbox_prefix(self.of(phone_number_id)), lane.token())
    }

    /// Filter subject of every held request in partition `partition`'s stream.
    pub fn held_filter(partition: usize) -> String {
        format!("{}.{HELD_TOKEN}.>", outbox_prefix(partition))
    }

    /// The lane a held request's subject names; None for any other subject.
    pub fn held_lane(subject: &str) -> Option<Lane> {
        let mut tokens = subject.rsplit('.');
        let (_phone, lane, held) = (tokens.next()?, tokens.next()?, tokens.next()?);
        if held != HELD_TOKEN {
            return None;
        }
        Lane::ALL.into_iter().find(|l| l.token() == lane)
    }

    /// The DLQ stream of partition `partition`: `BW_DLQ`, `BW_DLQ_1`, ….
    pub fn dlq_stream(partition: usize) -> String {
        partition_bucket(DLQ_STREAM, partition)
    }

    /// The DLQ stream holding a sender's entries.
    pub fn dlq_stream_of(self, phone_number_id: &str) -> String {
        Self::dlq_stream(self.of(phone_number_id))
    }

    /// Every subject of partition `partition`'s DLQ stream (its per-sender counts, the senders with entries).
    pub fn dlq_all(partition: usize) -> String {
        format!("{}.>", dlq_prefix(partition))
    }

    /// Every priority entry of every sender in partition `partition`'s DLQ stream.
    pub fn dlq_priority_wildcard(partition: usize) -> String {
        format!("{}.{DLQ_PRIORITY_CLASS}.*", dlq_prefix(partition))
    }

    /// `…dlq….<class>.<phone_number_id>` of a sender's entry in its partition (class: [`dlq_class`]).
    pub fn dlq_subject(self, category: bw_proto::v1::Category, phone_number_id: &str) -> String {
        self.dlq_class_filter(dlq_class(category), phone_number_id)
    }

    /// A sender's DLQ entries of one class, in its partition.
    pub fn dlq_class_filter(self, class: &str, phone_number_id: &str) -> String {
        format!("{}.{class}.{phone_number_id}", dlq_prefix(self.of(phone_number_id)))
    }

    /// Every DLQ entry of a sender, whatever its class, in its partition.
    pub fn dlq_scope_filter(self, phone_number_id: &str) -> String {
        self.dlq_class_filter("*", phone_number_id)
    }

    /// The DLQ stream a DLQ subject of any partition belongs to (`bw.dlq.v1.…` → `BW_DLQ`, `bw.dlq.p2.v1.…` →
    /// `BW_DLQ_2`): where an entry read from a subject is deleted.
    pub fn dlq_stream_of_subject(subject: &str) -> String {
        let partition = subject
            .strip_prefix("bw.dlq.p")
            .and_then(|rest| rest.split_once(".v1."))
            .and_then(|(p, _)| p.parse().ok())
            .unwrap_or(0);
        Self::dlq_stream(partition)
    }
}

/// Subject token of the held requests in a BW_SEND partition (no lane has it).
const HELD_TOKEN: &str = "held";

/// Durable consumer of the held requests in each BW_SEND partition (the dispatcher's budget gate).
pub const HELD_CONSUMER: &str = "dispatcher-held";

/// `bw.outbox.v1` for partition 0, `bw.outbox.p<i>.v1` for the others.
fn outbox_prefix(partition: usize) -> String {
    if partition == 0 { "bw.outbox.v1".to_string() } else { format!("bw.outbox.p{partition}.v1") }
}

/// `bw.dlq.v1` for partition 0, `bw.dlq.p<i>.v1` for the others.
fn dlq_prefix(partition: usize) -> String {
    if partition == 0 { "bw.dlq.v1".to_string() } else { format!("bw.dlq.p{partition}.v1") }
}

/// Dead-letter stream.
pub const DLQ_STREAM: &str = "BW_DLQ";
/// Class token of a DLQ subject: `p` for priority categories (authentication, transactional, support), `m` for
/// the rest. The class is in the subject so the depth of a sender's priority backlog is one stream-info
/// request (per-subject counts) and replay can drain priority entries before marketing ones.
pub fn dlq_class(category: bw_proto::v1::Category) -> &'static str {
    if category.is_priority() { "p" } else { "m" }
}

/// `bw.dlq.v1.<class>.<phone_number_id>` (class: [`dlq_class`]; partition 0: [`SendPartitions::dlq_subject`]).
pub fn dlq_subject(category: bw_proto::v1::Category, phone_number_id: &str) -> String {
    SendPartitions::default().dlq_subject(category, phone_number_id)
}

/// Every DLQ entry (the DLQ stream's subjects; per-sender counts and the senders with entries).
pub const DLQ_ALL: &str = "bw.dlq.v1.>";

/// Class token of priority DLQ entries (see [`dlq_class`]).
pub const DLQ_PRIORITY_CLASS: &str = "p";
/// Class token of marketing DLQ entries (see [`dlq_class`]).
pub const DLQ_MARKETING_CLASS: &str = "m";
/// Every priority DLQ entry of every sender: one stream-info request with subjects gives each sender's
/// priority backlog.
pub const DLQ_PRIORITY_WILDCARD: &str = "bw.dlq.v1.p.*";

/// The DLQ entries of one class of one sender: `bw.dlq.v1.<class>.<phone_number_id>`.
pub fn dlq_class_filter(class: &str, phone_number_id: &str) -> String {
    SendPartitions::default().dlq_class_filter(class, phone_number_id)
}

/// Every DLQ entry of one sender, whatever its class: `bw.dlq.v1.*.<phone_number_id>`.
pub fn dlq_scope_filter(phone_number_id: &str) -> String {
    SendPartitions::default().dlq_scope_filter(phone_number_id)
}

/// Quarantine stream (permanent errors and poison messages).
pub const QUARANTINE_STREAM: &str = "BW_QUARANTINE";
/// `bw.quarantine.v1.<phone_number_id>`.
pub fn quarantine_subject(phone_number_id: &str) -> String {
    format!("bw.quarantine.v1.{phone_number_id}")
}

/// Unknown-outcome stream, waiting for reconciliation.
pub const UNKNOWN_STREAM: &str = "BW_UNKNOWN";
/// `bw.unknown.v1.<phone_number_id>`.
pub fn unknown_subject(phone_number_id: &str) -> String {
    format!("bw.unknown.v1.{phone_number_id}")
}
/// Durable consumer of the reconciler on BW_UNKNOWN.
pub const RECONCILER_CONSUMER: &str = "reconciler";

/// Rejected producer input, kept for inspection.
pub const REJECTED_STREAM: &str = "BW_REJECTED";
/// `bw.rejected.v1.<source>` where source is a phone number id, `unknown` or `http`.
pub fn rejected_subject(source: &str) -> String {
    format!("bw.rejected.v1.{source}")
}

/// Raw Meta webhooks, stored before answering 200.
pub const WEBHOOK_STREAM: &str = "BW_WEBHOOKS";
/// Subject of stored webhook deliveries.
pub const WEBHOOK_SUBJECT: &str = "bw.webhook.v1.raw";
/// Durable consumer that processes stored webhooks.
pub const WEBHOOK_CONSUMER: &str = "webhook-processor";

/// Inbound customer messages for the CRM side: `bw.inbound.v1.<phone_number_id>`.
pub const INBOUND_STREAM: &str = "BW_INBOUND";
/// `bw.inbound.v1.<phone_number_id>`.
pub fn inbound_subject(phone_number_id: &str) -> String {
    format!("bw.inbound.v1.{phone_number_id}")
}

/// Meta's account, number, portfolio and template signals (webhook fields beyond `messages`, and value-level
/// `errors`), one typed `AccountSignal` per item, kept for their readers (the coordinator applies them).
pub const ACCOUNT_STREAM: &str = "BW_ACCOUNT";
/// Subjects captured by BW_ACCOUNT.
pub const ACCOUNT_SUBJECTS: &str = "bw.account.v1.>";
/// Durable consumer of the coordinators on BW_ACCOUNT (one delivery at a time: a ban and its reinstatement
/// must apply in order).
pub const ACCOUNT_COORDINATOR_CONSUMER: &str = "coordinator-account";
/// `bw.account.v1.<field>.<waba_id>`. Both come from Meta's (signed) body: a token that is not plain
/// `[A-Za-z0-9_-]` (at most 64 chars) is written `_`, so no subject can hold a wildcard, a dot or a space.
pub fn account_subject(field: &str, waba_id: &str) -> String {
    fn token(raw: &str) -> &str {
        let ok = !raw.is_empty()
            && raw.len() <= 64
            && raw.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if ok { raw } else { "_" }
    }
    format!("bw.account.v1.{}.{}", token(field), token(waba_id))
}

/// Events: breaker transitions, dispatch outcomes, alerts, signals.
pub const EVENTS_STREAM: &str = "BW_EVENTS";
/// Breaker transitions: `bw.breaker.v1.<phone_number_id>`.
pub fn breaker_subject(phone_number_id: &str) -> String {
    format!("bw.breaker.v1.{phone_number_id}")
}
/// Dispatch outcomes: `bw.outcome.v1.<phone_number_id>`.
pub fn outcome_subject(phone_number_id: &str) -> String {
    format!("bw.outcome.v1.{phone_number_id}")
}
/// Alerts: `bw.alert.v1.<rule>`.
pub fn alert_subject(rule: &str) -> String {
    format!("bw.alert.v1.{rule}")
}
/// Signals raised for the alerting service: `bw.signal.v1.<kind>`.
pub fn signal_subject(kind: &str) -> String {
    format!("bw.signal.v1.{kind}")
}
/// Incident replay finished (`IncidentReplayed`): `bw.incident.v1.<phone_number_id>`.
pub fn incident_subject(phone_number_id: &str) -> String {
    format!("bw.incident.v1.{phone_number_id}")
}
/// Every breaker transition, dispatch outcome, alert, signal and incident subject.
pub const BREAKER_ALL: &str = "bw.breaker.v1.>";
/// See [`BREAKER_ALL`].
pub const OUTCOME_ALL: &str = "bw.outcome.v1.>";
/// See [`BREAKER_ALL`].
pub const ALERT_ALL: &str = "bw.alert.v1.>";
/// See [`BREAKER_ALL`].
pub const SIGNAL_ALL: &str = "bw.signal.v1.>";
/// See [`BREAKER_ALL`].
pub const INCIDENT_ALL: &str = "bw.incident.v1.>";
/// Subjects captured by BW_EVENTS.
pub const EVENTS_SUBJECTS: [&str; 5] = [BREAKER_ALL, OUTCOME_ALL, ALERT_ALL, SIGNAL_ALL, INCIDENT_ALL];
/// Whether `subject` is a breaker transition's.
pub fn is_breaker_subject(subject: &str) -> bool {
    subject.starts_with("bw.breaker.v1.")
}

/// Every operation's outcome events for producers (stream, written by ingest's feed publisher). Subjects:
/// `bw_wire::tenancy::feed_subject`.
pub const FEED_STREAM: &str = "BW_FEED";
/// Every subject of BW_FEED.
pub const FEED_ALL: &str = "bw.feed.v1.>";
/// The status query of a sender's operations (core NATS request/reply, served by ingest).
pub fn status_subject(phone_number_id: &str) -> String {
    format!("bw.status.v1.{phone_number_id}")
}
/// Every status query subject (ingest's queue subscription).
pub const STATUS_WILDCARD: &str = "bw.status.v1.*";
/// Sender token of an operator's status query (bwctl): answers for any sender. NATS accounts keep it from
/// producers (deploy/nats/).
pub const STATUS_ANY: &str = "_";
/// Prefix of a producer callback's durable consumer on BW_FEED ([`callback_consumer`]).
pub const CALLBACK_CONSUMER_PREFIX: &str = "callback-";
/// The durable consumer of callback `name` on BW_FEED: `callback-<name>`.
pub fn callback_consumer(name: &str) -> String {
    format!("{CALLBACK_CONSUMER_PREFIX}{name}")
}
/// Retry state of callback events whose delivery failed (KV, written by ingest). Key: [`callback_retry_key`].
pub const CALLBACK_RETRIES_BUCKET: &str = "BW_CALLBACK_RETRIES";
/// Key of an event's retry state: `<callback>.<event id>` (the event id is `<operation_id>.<revision>`).
pub fn callback_retry_key(callback: &str, event_id: &str) -> String {
    format!("{callback}.{event_id}")
}
/// Webhook bodies over the server's `max_payload` (object store, created by ingest). Names:
/// [`webhook_body_object`], [`rejected_body_object`].
pub const BODIES_BUCKET: &str = "BW_INGEST_BODIES";
/// NATS header of a BW_WEBHOOKS or BW_REJECTED record whose body lives in [`BODIES_BUCKET`]: the object's name.
pub const BODY_OBJECT_HEADER: &str = "Bw-Body-Object";
/// The object name of a webhook body in [`BODIES_BUCKET`].
pub fn webhook_body_object(body_sha256: &str) -> String {
    format!("webhook.{body_sha256}")
}
/// The object name of a signed webhook body that could not be parsed, kept for inspection.
pub fn rejected_body_object(body_sha256: &str) -> String {
    format!("rejected.{body_sha256}")
}
/// Every subject of BW_UNKNOWN, BW_QUARANTINE, BW_REJECTED and BW_INBOUND.
pub const UNKNOWN_ALL: &str = "bw.unknown.v1.>";
/// See [`UNKNOWN_ALL`].
pub const QUARANTINE_ALL: &str = "bw.quarantine.v1.>";
/// See [`UNKNOWN_ALL`].
pub const REJECTED_ALL: &str = "bw.rejected.v1.>";
/// See [`UNKNOWN_ALL`].
pub const INBOUND_ALL: &str = "bw.inbound.v1.>";
/// Redis `SCAN` pattern of every per-recipient order set (`bw:{<waba>:<phone>}:ord:<recipient_key>`, written by
/// the breaker's order scripts).
pub const ORDER_KEYS_PATTERN: &str = "bw:*:ord:*";

/// Replay progress per breaker incident (KV, `IncidentProgress`). Key: [`incident_key`].
pub const INCIDENTS_BUCKET: &str = "BW_INCIDENTS";
/// Key of an incident in BW_INCIDENTS: `<phone_number_id>.<incident>`, the incident id reduced to the
/// characters a KV key allows (anything else becomes `_`), so a sender's incidents share a prefix.
pub fn incident_key(phone_number_id: &str, incident_id: &str) -> String {
    let clean: String =
        incident_id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    format!("{phone_number_id}.{clean}")
}
/// Message id of an incident's `IncidentReplayed` event: one per incident whoever publishes it.
pub fn incident_replayed_msg_id(phone_number_id: &str, incident_id: &str) -> String {
    format!("incident.{}.replayed", incident_key(phone_number_id, incident_id))
}

/// Per-operation ledger (KV); with several partitions, the bucket of partition 0 ([`ledger_bucket`]).
pub const LEDGER_BUCKET: &str = "BW_LEDGER";
/// Most ledger partitions a deployment may have (`nats.ledger_partitions`).
pub const MAX_LEDGER_PARTITIONS: usize = 64;

/// The bucket of ledger partition `partition`: `BW_LEDGER` for partition 0 (so a one-partition ledger is the
/// ledger as it always was), `BW_LEDGER_<i>` for the others. Each bucket is its own stream (`KV_<bucket>`)
/// with its own leader on a NATS cluster.
pub fn ledger_bucket(partition: usize) -> String {
    partition_bucket(LEDGER_BUCKET, partition)
}

/// Partition `partition` of a partitioned bucket: the base name for partition 0, `<base>_<i>` for the others.
fn partition_bucket(base: &str, partition: usize) -> String {
    if partition == 0 { base.to_string() } else { format!("{base}_{partition}") }
}

/// The ledger partition of an operation (and of a wamid link, by its key): FNV-1a (64 bit) of its id modulo the
/// partition count. Fixed, so every process and every version finds an operation in the same partition. By
/// operation id, not by sender: the ledger is read and written by operation id everywhere (a status webhook,
/// `bwctl op`), and one busy sender spreads over every partition instead of loading one leader.
pub fn ledger_partition(operation_id: &str, partitions: usize) -> usize {
    fnv1a_mod(operation_id, partitions)
}

/// FNV-1a (64 bit) of `key` modulo `partitions` (0 for one partition or none).
fn fnv1a_mod(key: &str, partitions: usize) -> usize {
    if partitions <= 1 {
        return 0;
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % partitions as u64) as usize
}

/// wamid → operation id (KV), for statuses that arrive without biz_opaque_callback_data; with several ledger
/// partitions, the bucket of partition 0 ([`wamid_bucket`]).
pub const WAMID_BUCKET: &str = "BW_WAMID";

/// The bucket of wamid-link partition `partition` (`BW_WAMID`, `BW_WAMID_1`, …): the links are split into as
/// many partitions as the ledger, by their key ([`ledger_partition`] of the key).
pub fn wamid_bucket(partition: usize) -> String {
    partition_bucket(WAMID_BUCKET, partition)
}
/// Durable consumer of ingest's feed publisher on each ledger partition's stream (`KV_BW_LEDGER`, …).
pub const FEED_CONSUMER: &str = "feed-publisher";
/// Current breaker state per scope (KV), written by the breaker-coordinator. Key: phone_number_id.
pub const SCOPES_BUCKET: &str = "BW_SCOPES";

/// The sender registry (`bw_common::registry`): phone_number_id → WABA → tenant.
pub const SENDERS_BUCKET: &str = "BW_SENDERS";
/// Webhook deduplication (KV with TTL). Key: sha of (wamid, status) or inbound message id.
pub const WEBHOOK_DEDUP_BUCKET: &str = "BW_WEBHOOK_DEDUP";

/// Every breaker transition subject (the coordinator's queue subscription).
pub const BREAKER_WILDCARD: &str = "bw.breaker.v1.*";

/// Header carrying the JetStream message id (deduplication within the stream's window).
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// Headers with just the JetStream message id set.
pub fn msg_id_headers(msg_id: &str) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(MSG_ID_HEADER, msg_id);
    headers
}

/// Nats-Msg-Id of "this delivery of this operation moved to `dest`" (dlq, quarantine, unknown): the source
/// stream sequence is unique per enqueue, so a redelivery after a crash maps to the same id and JetStream drops
/// the copy.
pub fn move_msg_id(operation_id: &str, dest: &str, source_sequence: u64) -> String {
    format!("{operation_id}.{dest}.{source_sequence}")
}

/// KV bucket of alerting's dedup and storm state.
pub const ALERTS_BUCKET: &str = "BW_ALERTS";

/// The console's audit stream: one message per operator action (who, what, when, scope), never a phone number,
/// token or secret. Subjects `bw.audit.v1.<action>`.
pub const AUDIT_STREAM: &str = "BW_AUDIT";
/// Every audit subject.
pub const AUDIT_SUBJECTS: &str = "bw.audit.v1.>";
/// Subject of one audited action (`replay_incident`, `breaker_reset`...).
pub fn audit_subject(action: &str) -> String {
    format!("bw.audit.v1.{action}")
}

/// KV bucket of the breaker-coordinator fleet's leader lease: one key, [`COORDINATOR_LEADER_KEY`], whose value is
/// the holder's instance id; the bucket's `max_age` is the lease length.
pub const COORDINATOR_LEADER_BUCKET: &str = "BW_COORDINATOR_LEADER";
/// The one key of [`COORDINATOR_LEADER_BUCKET`].
pub const COORDINATOR_LEADER_KEY: &str = "leader";

/// KV bucket of the wire-journal partition leases (`dispatch.wire_guarantee = "journal"`): one key per send
/// partition ([`WireJournal::owner_key`]), whose value is the owning dispatcher's instance id; the bucket's
/// `max_age` is the lease length (`dispatch.wire_lease_ms`).
pub const WIRE_OWNERS_BUCKET: &str = "BW_WIRE_OWNERS";
/// Prefix of the wire-journal streams: `BW_WIRE_<n>` for send partition `n`.
pub const WIRE_STREAM_PREFIX: &str = "BW_WIRE_";

/// The wire journal of one send partition ([`SendPartitions`]): the stream `BW_WIRE_<n>` its owner appends to
/// before a group of sends goes on the wire, with the subjects `bw.wire.v1.p<n>.sends` (the sends about to go),
/// `.owner` (a take-over) and `.checkpoint` (how far every attempt is settled). Partition 0 is numbered like the
/// others: the journal is new, so no old subject needs keeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireJournal(pub usize);

impl WireJournal {
    /// The journal stream of this partition.
    pub fn stream(self) -> String {
        format!("{WIRE_STREAM_PREFIX}{}", self.0)
    }
    /// Every subject of the stream.
    pub fn subjects(self) -> String {
        format!("bw.wire.v1.p{}.>", self.0)
    }
    /// Records naming sends about to go on the wire.
    pub fn sends_subject(self) -> String {
        format!("bw.wire.v1.p{}.sends", self.0)
    }
    /// A new owner's take-over record.
    pub fn owner_subject(self) -> String {
        format!("bw.wire.v1.p{}.owner", self.0)
    }
    /// Checkpoint records.
    pub fn checkpoint_subject(self) -> String {
        format!("bw.wire.v1.p{}.checkpoint", self.0)
    }
    /// This partition's lease key in [`WIRE_OWNERS_BUCKET`].
    pub fn owner_key(self) -> String {
        format!("p{}", self.0)
    }
}

/// KV bucket of replay leases: key phone_number_id, value `<instance>|<expires unix ms>`. The lease makes one
/// replay instance at a time drain a scope, so the per-scope replay rate holds across instances.
pub const REPLAY_LEASE_BUCKET: &str = "BW_REPLAY_LEASES";

/// The durable consumer of replay on BW_DLQ for one scope from before the DLQ subjects carried the class
/// (filter [`dlq_scope_filter`]). It overlaps the per-class consumers, which a work-queue stream refuses, so
/// replay deletes it before it creates those ([`replay_class_consumer`]).
pub fn replay_consumer(phone_number_id: &str) -> String {
    format!("replay-{phone_number_id}")
}

/// Durable consumer of replay on BW_DLQ for one class of one scope (filter [`dlq_class_filter`]):
/// `replay-<class>-<phone>`. Work-queue streams need non-overlapping filters, so there is exactly one per class
/// and scope and every replay instance binds to it; replay drains the `p` one before the `m` one.
pub fn replay_class_consumer(class: &str, phone_number_id: &str) -> String {
    format!("replay-{class}-{phone_number_id}")
}

/// Nats-Msg-Id of the `replay`-th replay of an operation into the replay lane. A redelivered or repeated
/// replay of the same DLQ entry reuses the number, so JetStream drops the second publish.
pub fn replay_msg_id(operation_id: &str, replay: u32) -> String {
    format!("{operation_id}.r{replay}")
}

/// Nats-Msg-Id of a quarantine entry written by replay or the CLI.
pub fn quarantine_msg_id(operation_id: &str, replays: u32, reason: &str) -> String {
    format!("{operation_id}.q{replays}.{reason}")
}

/// Header carrying the replay number on replay-lane messages (informational).
pub const REPLAY_HEADER: &str = "Bw-Replay";

/// Header set on a quarantine entry that holds undecodable bytes from another stream.
pub const UNDECODABLE_HEADER: &str = "Bw-Undecodable";

/// The phone_number_id of a `bw.<domain>.v1.[<lane>.]<phone>` subject: its last token.
pub fn phone_of_subject(subject: &str) -> &str {
    subject.rsplit('.').next().unwrap_or(subject)
}

/// Redis hash tag of a scope, shared by every key of the scope so scripts run on Redis Cluster.
pub fn scope_tag(waba_id: &str, phone_number_id: &str) -> String {
    format!("{{{waba_id}:{phone_number_id}}}")
}

/// A Redis key of a scope: `bw:{<waba>:<phone>}:<suffix>`.
pub fn scope_key(waba_id: &str, phone_number_id: &str, suffix: &str) -> String {
    format!("bw:{}:{suffix}", scope_tag(waba_id, phone_number_id))
}

/// Redis set of every scope ever seen (not hash-tagged; written only by the coordinator and read by admin tools).
pub const SCOPES_INDEX_KEY: &str = "bw:scopes";

/// Redis key the coordinator's leader sets once Redis holds its data; its absence means Redis is new or lost its
/// data (not scope-tagged: one key, never touched by the scripts).
pub const COORDINATOR_EPOCH_KEY: &str = "bw:coordinator:epoch";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_subject_is_in_its_partition_outside_every_lane_and_names_its_lane() {
        let four = SendPartitions::new(4);
        for phone in (0..20).map(|i| format!("30000{i}")) {
            let p = four.of(&phone);
            for lane in Lane::ALL {
                let held = four.held_subject(lane, &phone);
                assert_eq!(SendPartitions::held_lane(&held), Some(lane), "{held}");
                assert_eq!(phone_of_subject(&held), phone);
                assert!(held.starts_with(SendPartitions::held_filter(p).trim_end_matches('>')), "{held}");
                assert!(held.starts_with(SendPartitions::stream_subjects(p).trim_end_matches('>')), "{held}");
                for any in Lane::ALL {
                    let filter = SendPartitions::lane_filter(p, any);
                    assert!(!held.starts_with(filter.trim_end_matches('*')), "{held} in lane filter {filter}");
                }
                assert_eq!(SendPartitions::held_lane(&four.outbox_subject(lane, &phone)), None);
            }
        }
        assert_eq!(SendPartitions::default().held_subject(Lane::Low, "123"), "bw.outbox.v1.held.lo.123");
    }

    /// The partition of an operation may never change between versions: a deployment's entries would be looked
    /// for where they are not. These values are FNV-1a 64 computed independently (not by this function).
    #[test]
    fn ledger_partitions_are_fixed_fnv1a_of_the_operation_id() {
        for (id, expected) in [
            ("order-123", [0, 0, 2, 2, 58]),
            ("a", [0, 0, 0, 4, 12]),
            ("op_1.x=2", [0, 1, 3, 3, 3]),
            ("promo-0010", [0, 0, 2, 6, 62]),
        ] {
            let got: Vec<usize> = [1, 2, 4, 8, 64].iter().map(|n| ledger_partition(id, *n)).collect();
            assert_eq!(got, expected, "{id}");
        }
        assert_eq!(ledger_partition("anything", 0), 0, "no partitions configured is one");
        assert_eq!((ledger_bucket(0), ledger_bucket(3)), ("BW_LEDGER".to_string(), "BW_LEDGER_3".to_string()));
        assert_eq!((wamid_bucket(0), wamid_bucket(1)), ("BW_WAMID".to_string(), "BW_WAMID_1".to_string()));
    }

    #[test]
    fn each_send_partition_has_its_own_wire_journal_and_lease_key() {
        let j = WireJournal(3);
        assert_eq!(j.stream(), "BW_WIRE_3");
        assert_eq!(j.sends_subject(), "bw.wire.v1.p3.sends");
        assert_eq!(j.owner_subject(), "bw.wire.v1.p3.owner");
        assert_eq!(j.checkpoint_subject(), "bw.wire.v1.p3.checkpoint");
        assert_eq!(j.subjects(), "bw.wire.v1.p3.>");
        assert_eq!(j.owner_key(), "p3");
        assert_ne!(WireJournal(0).subjects(), WireJournal(1).subjects());
    }

    #[test]
    fn send_partitions_keep_a_sender_in_one_stream_with_disjoint_subjects() {
        let one = SendPartitions::default();
        assert_eq!(one.outbox_subject(Lane::High, "123"), outbox_subject(Lane::High, "123"), "1 partition: as before");
        assert_eq!(
            (one.stream_of("123"), SendPartitions::stream_subjects(0)),
            (SEND_STREAM.into(), "bw.outbox.v1.>".into())
        );
        let four = SendPartitions::new(4);
        // Fixed values: FNV-1a as for the ledger, of the phone_number_id.
        assert_eq!(four.of("order-123"), ledger_partition("order-123", 4));
        let (mut seen, mut phones) = (std::collections::HashSet::new(), 0);
        while seen.len() < 4 {
            let phone = format!("10000{phones}");
            phones += 1;
            let p = four.of(&phone);
            seen.insert(p);
            assert_eq!(four.stream_of(&phone), SendPartitions::stream(p));
            for lane in Lane::ALL {
                let subject = four.outbox_subject(lane, &phone);
                assert_eq!(phone_of_subject(&subject), phone);
                assert_eq!(subject.rsplit('.').nth(1), Some(lane.token()), "the lane is the token before the phone");
                let filter = SendPartitions::lane_filter(p, lane);
                assert!(subject.starts_with(filter.trim_end_matches('*')), "{subject} in {filter}");
                for other in (0..4).filter(|o| *o != p) {
                    let other_all = SendPartitions::stream_subjects(other);
                    assert!(!subject.starts_with(other_all.trim_end_matches('>')), "{subject} also in {other_all}");
                }
            }
        }
        assert_eq!(
            (SendPartitions::stream(2), SendPartitions::stream_subjects(2)),
            ("BW_SEND_2".into(), "bw.outbox.p2.v1.>".into())
        );
        // The DLQ follows: same partition, disjoint subjects, class before the phone, stream found from a subject.
        use bw_proto::v1::Category;
        assert_eq!(one.dlq_subject(Category::Marketing, "123"), dlq_subject(Category::Marketing, "123"));
        assert_eq!((one.dlq_stream_of("123"), SendPartitions::dlq_all(0)), (DLQ_STREAM.into(), DLQ_ALL.into()));
        assert_eq!(SendPartitions::dlq_priority_wildcard(0), DLQ_PRIORITY_WILDCARD);
        for phone in (0..40).map(|i| format!("20000{i}")) {
            let p = four.of(&phone);
            let otp = four.dlq_subject(Category::Authentication, &phone);
            assert_eq!(four.dlq_stream_of(&phone), SendPartitions::dlq_stream(p));
            assert_eq!(SendPartitions::dlq_stream_of_subject(&otp), SendPartitions::dlq_stream(p), "{otp}");
            assert_eq!((phone_of_subject(&otp), otp.rsplit('.').nth(1)), (phone.as_str(), Some(DLQ_PRIORITY_CLASS)));
            assert_eq!(four.dlq_class_filter(DLQ_PRIORITY_CLASS, &phone), otp);
            assert!(otp.starts_with(SendPartitions::dlq_all(p).trim_end_matches('>')));
            assert!(otp.starts_with(SendPartitions::dlq_priority_wildcard(p).trim_end_matches('*')));
            assert!(four.dlq_scope_filter(&phone).ends_with(&format!(".*.{phone}")));
            for other in (0..4).filter(|o| *o != p) {
                assert!(!otp.starts_with(SendPartitions::dlq_all(other).trim_end_matches('>')), "{otp}");
            }
        }
        assert_eq!(SendPartitions::dlq_stream(3), "BW_DLQ_3");
        assert_eq!(SendPartitions::new(0), one);
    }

    #[test]
    fn keys_of_a_scope_share_one_hash_tag() {
        let a = scope_key("111", "222", "breaker");
        let b = scope_key("111", "222", "rate");
        assert_eq!(a, "bw:{111:222}:breaker");
        assert!(b.starts_with("bw:{111:222}:"));
    }

    #[test]
    fn lanes_have_disjoint_filters() {
        let filters: Vec<String> = Lane::ALL.iter().map(|l| l.filter()).collect();
        assert_eq!(filters, ["bw.outbox.v1.rh.*", "bw.outbox.v1.hi.*", "bw.outbox.v1.lo.*", "bw.outbox.v1.rp.*"]);
        assert_eq!(outbox_subject(Lane::High, "123"), "bw.outbox.v1.hi.123");
        let consumers: std::collections::HashSet<_> = Lane::ALL.iter().map(|l| l.dispatcher_consumer()).collect();
        assert_eq!(consumers.len(), Lane::ALL.len(), "one durable consumer per lane");
    }

    #[test]
    fn replay_puts_priority_back_on_its_own_lane() {
        use bw_proto::v1::Category;
        for c in [Category::Authentication, Category::Transactional, Category::Support] {
            assert_eq!(Lane::for_replay(c), Lane::PriorityReplay, "{c:?}");
            assert_eq!(dlq_class(c), DLQ_PRIORITY_CLASS);
        }
        assert_eq!(Lane::for_replay(Category::Marketing), Lane::Replay);
        assert_eq!(dlq_class(Category::Marketing), DLQ_MARKETING_CLASS);
        assert!(Lane::PriorityReplay.is_replay() && Lane::Replay.is_replay() && !Lane::High.is_replay());
        let marketing: Vec<Lane> = Lane::ALL.into_iter().filter(|l| l.is_marketing()).collect();
        assert_eq!(marketing, [Lane::Low, Lane::Replay]);
        assert_eq!(dlq_class_filter(DLQ_PRIORITY_CLASS, "123"), dlq_subject(Category::Support, "123"));
        assert_ne!(replay_class_consumer("p", "123"), replay_class_consumer("m", "123"));
        assert_ne!(replay_class_consumer("p", "123"), replay_consumer("123"));
    }

    #[test]
    fn dlq_subjects_carry_the_class_and_end_in_the_phone() {
        use bw_proto::v1::Category;
        let otp = dlq_subject(Category::Authentication, "123");
        let promo = dlq_subject(Category::Marketing, "123");
        assert_eq!((otp.as_str(), promo.as_str()), ("bw.dlq.v1.p.123", "bw.dlq.v1.m.123"));
        assert_eq!(phone_of_subject(&otp), "123");
        assert_eq!(dlq_scope_filter("123"), "bw.dlq.v1.*.123");
    }
}
