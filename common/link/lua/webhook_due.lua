-- webhook_due.lua: a snippet, not a script. common/link/lua_scripts.py prepends it to the scripts that
-- make a job final (store_results.lua, cancel.lua), so on a single Redis the state change and the
-- delivery's enqueue are one atomic step. On a Redis Cluster the due set is in another slot than
-- the job's keys: the script is given no due set and its caller marks the delivery due apart
-- (common/bulk/jobs.py's mark_due, a ZADD NX that is safe to repeat) whenever the webhook is pending.
--
-- webhook_due(job, due, job_id, now): for a job submitted with a webhook whose delivery was never
-- made due, set webhook_state to pending and, when `due` is given, ZADD the job to the due set,
-- scored now. Once per job: a cancelled job whose last items still finish does not get a second
-- delivery.
--   job     the job record's key, funnel:job:{<id>}
--   due     the due webhooks' key, funnel:webhooks; nil on a cluster
--   job_id  the job id (the due set's member)
--   now     epoch ms
-- webhook_pending(job): 1 while the job's delivery is pending (due, leased or waiting for a retry),
-- else 0: what a cluster's caller marks due, in case the step that made it pending was its last.
local function webhook_due(job, due, job_id, now)
  local hook = redis.call('HMGET', job, 'webhook_url', 'webhook_state')
  if hook[1] and hook[1] ~= '' and not hook[2] then
    redis.call('HSET', job, 'webhook_state', 'pending', 'webhook_next_ms', now)
    if due then redis.call('ZADD', due, now, job_id) end
  end
end

local function webhook_pending(job)
  return redis.call('HGET', job, 'webhook_state') == 'pending' and 1 or 0
end
