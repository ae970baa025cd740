-- order_release.lua: removes operations from their recipients' order sets (see order_register.lua) outside an
-- outcome batch: a move to BW_UNKNOWN or an expiry in the dispatcher, or a blocking member whose ledger entry
-- shows it ended (or never arrived) found by the dispatcher it blocks.
--
-- KEYS[i]  order set of release i (all of one sender: one hash slot)
-- ARGV[i]  operation id of release i
-- Returns: the number of members removed.

local removed = 0
for i = 1, #KEYS do
  removed = removed + redis.call('ZREM', KEYS[i], ARGV[i])
end
return removed
