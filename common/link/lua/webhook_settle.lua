-- webhook_settle.lua: settle one webhook delivery attempt on its job's record, only if its claim
-- still stands (worker/webhook.py): a deliverer whose lease ran out while it waited no longer
-- decides. The caller then scores the due set by the outcome (a retry at its time, else removed);
-- a deliverer that dies between the two leaves the lease to run out, and the next claim mends it.
--
-- KEYS[1]  the job record, funnel:job:{<id>}
-- ARGV[1]  the claim's token, as webhook_claim.lua recorded it
-- ARGV[2]  the outcome: delivered, retry or failed
-- ARGV[3]  the receiver's HTTP status (0: none came back)
-- ARGV[4]  the error, "" when delivered
-- ARGV[5]  with retry, when the next attempt is due, epoch ms
-- Returns  1 when settled; 0 when the claim no longer stands.
if redis.call('HGET', KEYS[1], 'webhook_claim') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'webhook_claim')
redis.call('HSET', KEYS[1], 'webhook_last_status', ARGV[3], 'webhook_last_error', ARGV[4])
if ARGV[2] == 'retry' then
  redis.call('HSET', KEYS[1], 'webhook_next_ms', ARGV[5])
else
  redis.call('HSET', KEYS[1], 'webhook_state', ARGV[2])
end
return 1
