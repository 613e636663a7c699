-- webhook_claim.lua: claim a leased webhook delivery on its job's record (worker/webhook.py, after
-- webhook_lease.lua): its attempt counted, the claim's token recorded. The record decides; the due
-- set is only its index, which the caller mends by the answer: a delivery whose job expired or
-- already settled is dropped from it, one whose retry is not yet due is put back at that time.
-- A delivery whose attempts dead claimers used up is marked failed.
--
-- KEYS[1]  the job record, funnel:job:{<id>}
-- ARGV[1]  now, epoch ms
-- ARGV[2]  the claim's token (the settle must show it)
-- ARGV[3]  the most attempts a delivery gets
-- Returns  {1, the record's fields as HGETALL flattens them} when claimed; {0} when the delivery
--          is over (no record, not pending, or failed now): drop it from the due set; {2, when}
--          when its next attempt is due later (epoch ms): score it so.
local hook = redis.call('HMGET', KEYS[1], 'webhook_state', 'webhook_attempts', 'webhook_next_ms')
if hook[1] ~= 'pending' then return {0} end
local attempts = tonumber(hook[2] or '0')
if tonumber(hook[3] or '0') > tonumber(ARGV[1]) then return {2, tonumber(hook[3])} end
if attempts >= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], 'webhook_state', 'failed', 'webhook_last_error',
             'the last attempt never ended: its worker stopped or died')
  return {0}
end
redis.call('HSET', KEYS[1], 'webhook_claim', ARGV[2], 'webhook_attempts', attempts + 1)
return {1, redis.call('HGETALL', KEYS[1])}
