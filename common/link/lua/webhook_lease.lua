-- webhook_lease.lua: lease the oldest due webhook delivery (worker/webhook.py, the first of a
-- claim's two steps): its score pushed a lease ahead, so no other deliverer takes it meanwhile and
-- one that dies before it settles hands it back when the lease runs out. The second step
-- (webhook_claim.lua) runs on the job's record, in the job's own slot on a Redis Cluster.
--
-- KEYS[1]  the due webhooks, funnel:webhooks (job id scored by when it is due, epoch ms)
-- ARGV[1]  now, epoch ms
-- ARGV[2]  the lease, ms
-- Returns  the job id leased, or false (None) when none is due.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1)
if #due == 0 then return false end
redis.call('ZADD', KEYS[1], 'XX', tonumber(ARGV[1]) + tonumber(ARGV[2]), due[1])
return due[1]
