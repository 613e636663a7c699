-- webhook_claim.lua: claim the oldest due webhook delivery (worker/webhook.py): its score pushed a
-- lease ahead, its attempt counted, the claim's token recorded. Entries whose job expired or
-- already settled are dropped on the way; an entry whose attempts a dead claimer used up is marked
-- failed. Looks at 100 entries at most per call.
--
-- KEYS[1]  the due webhooks, funnel:webhooks (job id scored by when it is due, epoch ms)
-- ARGV[1]  now, epoch ms
-- ARGV[2]  the lease, ms: a claimer that dies mid-attempt hands the delivery back after this
-- ARGV[3]  the claim's token (the settle must show it)
-- ARGV[4]  the job records' key prefix, funnel:job: (the record is ARGV[4] .. job id)
-- ARGV[5]  the most attempts a delivery gets
-- Returns  {job id, the record's fields as HGETALL flattens them}, or false (None) when none is due.
local now = tonumber(ARGV[1])
for _ = 1, 100 do
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 1)
  if #due == 0 then return false end
  local id = due[1]
  local job = ARGV[4] .. id
  local hook = redis.call('HMGET', job, 'webhook_state', 'webhook_attempts')
  local attempts = tonumber(hook[2] or '0')
  if hook[1] ~= 'pending' then
    redis.call('ZREM', KEYS[1], id)
  elseif attempts >= tonumber(ARGV[5]) then
    redis.call('HSET', job, 'webhook_state', 'failed', 'webhook_last_error',
               'the last attempt never ended: its worker stopped or died')
    redis.call('ZREM', KEYS[1], id)
  else
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), id)
    redis.call('HSET', job, 'webhook_claim', ARGV[3], 'webhook_attempts', attempts + 1)
    return {id, redis.call('HGETALL', job)}
  end
end
return false
