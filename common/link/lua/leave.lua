-- leave.lua: mark the jobs of a request whose client left before its answer, so that a worker that
-- takes one drops it unrun (web/pipeline.py marks, worker/queue.py drops). Marks past their deadline
-- are trimmed here first: a worker drops such a job as expired anyway.
--
-- KEYS[1]  the model's gone set, funnel:gone:{<model>}
-- ARGV[1]  now, epoch ms
-- ARGV[2]  the jobs' deadline, epoch ms (their score, and the set's expiry at the latest)
-- ARGV[3..] the jobs' ids
-- Returns  the set's size after marking
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local now, deadline = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV do redis.call('ZADD', KEYS[1], deadline, ARGV[i]) end
-- The set lives as long as its latest mark (PTTL: -1 without an expiry; Redis 6.2 has no PEXPIRETIME).
if redis.call('PTTL', KEYS[1]) < deadline - now then redis.call('PEXPIREAT', KEYS[1], deadline) end
return redis.call('ZCARD', KEYS[1])
