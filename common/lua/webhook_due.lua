-- webhook_due.lua: a snippet, not a script. common/lua_scripts.py prepends it to the scripts that
-- make a job final (store_results.lua, cancel.lua), so the state change and the delivery's enqueue
-- are one atomic step.
--
-- webhook_due(job, due, job_id, now): for a job submitted with a webhook whose delivery was never
-- made due, set webhook_state to pending and ZADD the job to the due set, scored now. Once per
-- job: a cancelled job whose last items still finish does not get a second delivery.
--   job     the job record's key, funnel:job:<id>
--   due     the due webhooks' key, funnel:webhooks
--   job_id  the job id (the due set's member)
--   now     epoch ms
local function webhook_due(job, due, job_id, now)
  local hook = redis.call('HMGET', job, 'webhook_url', 'webhook_state')
  if hook[1] and hook[1] ~= '' and not hook[2] then
    redis.call('HSET', job, 'webhook_state', 'pending', 'webhook_next_ms', now)
    redis.call('ZADD', due, now, job_id)
  end
end
