-- observe_inbound.lua: counts inbound messages of a number against its throughput. Meta counts inbound and
-- outbound messages, all types, against one per-number limit (meta-cloud-api.md §3.1), so each inbound message
-- ingest sees takes one token from the sender bucket admit_send.lua spends: the fleet's sends plus the inbound
-- stay under the number's rate. The bucket may go into debt, at most one second of the current rate: Meta
-- counted a late webhook batch's messages when they came, and their tokens must not stop sending for longer.
--
-- KEYS[1]  cfg hash of the scope (bw:{<waba>:<phone>}:cfg)
-- KEYS[2]  state hash of the scope (bw:{<waba>:<phone>}:state)
-- KEYS[3]  the number's throughput hash (bw:{<waba>:<phone>}:tput; fields TP)
-- KEYS[4]  optional: a pair hash (bw:{<waba>:<phone>}:pair:<recipient_key>; fields P): the messages were the
--          business's own to that user, sent from the WhatsApp Business app of a coexistence number
--          (smb_message_echoes, reference §4.5): each also takes a slot of the pair's GCRA, as a send would
-- ARGV[1]  compiled defaults "name=value;..."
-- ARGV[2]  messages to count (at least 1)
-- Returns: { tokens left (string, negative: debt), configured rate per second (string), inbound total }

local now, c, S = begin()
local n = math.max(1, math.floor(num(ARGV[2], 1)))
c.rate_per_s = throughput_rate(c, KEYS[3])
local tokens, _, rate = refill(S, c, now, rate_factor(S, c, now))
tokens = math.max(-math.max(1, rate), tokens - n)
set(S, F.tokens, fmt(tokens))
set(S, F.tokens_at, now)
save_state(S, KEYS[2])
local total = redis.call('HINCRBY', KEYS[3], TP.inbound, n)
if KEYS[4] ~= nil then
  local pair_t = math.max(1, num(c.pair_interval_ms, 6000))
  local h = redis.call('HMGET', KEYS[4], P.tat, P.backoff_until, P.marketing_deferred)
  local tat = math.max(num(h[1], now), now) + n * pair_t
  redis.call('HSET', KEYS[4], P.tat, math.floor(tat))
  redis.call('PEXPIRE', KEYS[4], math.max(1, math.floor(math.max(tat, num(h[2]) + pair_t, num(h[3])) - now)))
end
return { fmt(tokens), fmt(c.rate_per_s), total }
