-- webhook_settle.lua: settle one webhook delivery attempt, only if its claim still stands
-- (worker/webhook.py): a deliverer whose lease ran out while it waited no longer decides.
--
-- KEYS[1]  the due webhooks, funnel:webhooks
-- KEYS[2]  the job record, funnel:job:<id>
-- ARGV[1]  the job id
-- ARGV[2]  the claim's token, as webhook_claim.lua recorded it
-- ARGV[3]  the outcome: delivered, retry or failed
-- ARGV[4]  the receiver's HTTP status (0: none came back)
-- ARGV[5]  the error, "" when delivered
-- ARGV[6]  with retry, when the next attempt is due, epoch ms
-- Returns  1 when settled; 0 when the claim no longer stands.
if redis.call('HGET', KEYS[2], 'webhook_claim') ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[2], 'webhook_claim')
redis.call('HSET', KEYS[2], 'webhook_last_status', ARGV[4], 'webhook_last_error', ARGV[5])
if ARGV[3] == 'retry' then
  redis.call('HSET', KEYS[2], 'webhook_next_ms', ARGV[6])
  redis.call('ZADD', KEYS[1], ARGV[6], ARGV[1])
else
  redis.call('HSET', KEYS[2], 'webhook_state', ARGV[3])
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return 1
