-- claim_late.lua: the sender's fleet-wide allowance for late sends.
--
-- A dispatcher whose request would reach the wire more than late_send_tolerance_ms after its send slot
-- (admit_send.lua hands the slots out) may still let it go at once only within this allowance: a token bucket
-- of the sender, shared by every dispatcher process, holding at most ARGV[2] late sends and refilled by one per
-- ARGV[1] ms (LATE_REFILL_SLOTS slot spacings). So however many dispatchers are late together, a sender's
-- instant burst at Meta grows by at most ARGV[2] above its slot schedule, not by that much per process
-- (ARCHITECTURE.md "Send slots"). A late send the allowance refuses takes a new slot instead.
--
-- KEYS[1]  cfg hash of the scope (unused; passed so every scope script has the same key layout)
-- KEYS[2]  state hash of the scope (fields F.late_tokens, F.late_at)
-- ARGV[1]  refill: ms per late send
-- ARGV[2]  burst: late sends at most at once (or what one ms refills, if more: below)
-- ARGV[3]  wanted: late sends asked for together (a dispatcher joins its concurrent claims of one sender into
--          one call; absent = 1)
-- Returns: how many of them may go now (0 to wanted; with wanted 1, 1 when this late send may go, 0 when not)

local now = now_ms()
-- Fractions of a ms are kept: above 3,333 sends/s a sender's refill is under 1 ms (a clamp to 1 ms capped
-- every sender at about 1,000 late sends/s whatever its rate).
local refill_ms = math.max(0.000001, num(ARGV[1]))
-- The bucket holds ARGV[2], or what one ms refills if that is more. now is whole ms, so within one ms nothing
-- refills: a bucket of 3 let a sender whose refill is under a third of a ms (above 10,000 sends/s) have at most 3
-- late sends per ms instead of its share, and every other late send went back to admission (the pipeline bench,
-- whose senders run at 10^6/s to lift the limits, ran at 0.45 of its speed without the lateness checks). At
-- Meta's rates (at most 1,000 mps a number: a refill of 3.3 ms or more) the bucket is ARGV[2], so the bound on
-- a sender's instant burst does not change there.
local burst = math.max(1, num(ARGV[2]), math.floor(1 / refill_ms))
local h = redis.call('HMGET', KEYS[2], F.late_tokens, F.late_at)
local tokens = burst
if h[2] then
  tokens = math.min(burst, num(h[1]) + math.max(0, now - num(h[2])) / refill_ms)
end
local wanted = math.max(1, math.floor(num(ARGV[3] or '1')))
local granted = math.max(0, math.min(wanted, math.floor(tokens)))
tokens = tokens - granted
redis.call('HSET', KEYS[2], F.late_tokens, fmt(tokens), F.late_at, now)
return granted
