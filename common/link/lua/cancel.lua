-- cancel.lua: cancel a job that is not finished, and make its webhook due (DELETE /v1/jobs/<id>).
-- include: webhook_due.lua (prepended by common/link/lua_scripts.py)
--
-- KEYS[1]  the job record, funnel:job:{<id>}
-- KEYS[2]  the due webhooks, funnel:webhooks; absent on a cluster (another slot: the caller marks
--          the delivery due when this says it is pending)
-- ARGV[1]  now, epoch ms
-- ARGV[2]  the job id
-- Returns  {found, pending}: found 1, or 0 when there is no such job (unknown or expired); pending
--          1 while the job's webhook delivery is pending, else 0. A job whose every item is
--          answered is left as it is.
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0} end
local r = redis.call('HMGET', KEYS[1], 'done', 'total')
if tonumber(r[1]) < tonumber(r[2]) then
  redis.call('HSET', KEYS[1], 'state', 'cancelled')
  webhook_due(KEYS[1], KEYS[2], ARGV[2], ARGV[1])
end
return {1, webhook_pending(KEYS[1])}
