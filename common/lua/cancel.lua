-- cancel.lua: cancel a job that is not finished, and make its webhook due (DELETE /v1/jobs/<id>).
-- include: webhook_due.lua (prepended by common/lua_scripts.py)
--
-- KEYS[1]  the job record, funnel:job:<id>
-- KEYS[2]  the due webhooks, funnel:webhooks
-- ARGV[1]  now, epoch ms
-- ARGV[2]  the job id
-- Returns  1; 0 when there is no such job (unknown or expired). A job whose every item is answered
--          is left as it is.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local r = redis.call('HMGET', KEYS[1], 'done', 'total')
if tonumber(r[1]) < tonumber(r[2]) then
  redis.call('HSET', KEYS[1], 'state', 'cancelled')
  webhook_due(KEYS[1], KEYS[2], ARGV[2], ARGV[1])
end
return 1
